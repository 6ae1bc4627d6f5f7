package db

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Ledger step statuses (workspace_operations.status). A step Berth decided not to run is
// OpSkipped with the reason in its log, never OpSucceeded: the ledger says what happened.
const (
	OpRunning   = "running"
	OpSucceeded = "succeeded"
	OpFailed    = "failed"
	OpSkipped   = "skipped"
)

// Operation is one step in the workspace ledger: written before it starts, settled when it ends.
type Operation struct {
	ID                   string
	CompanyID            string
	ExecutionWorkspaceID string
	RunID                string
	TaskID               string
	Phase                string
	Command              string
	Cwd                  string
	Status               string
	ExitCode             *int
	Log                  []byte
	LogBytes             int64
	LogSHA256            string
	LogTruncated         bool
	Error                string
	StartedAt            time.Time
	FinishedAt           *time.Time
}

// operationColumns are the columns scanOperation reads, in its order, with the whole stored log.
var operationColumns = operationColumnsWithLog("log")

// operationColumnsWithLog is operationColumns with logExpr read in place of the log (a tail of it,
// for lists).
func operationColumnsWithLog(logExpr string) string {
	return `id, company_id, coalesce(execution_workspace_id::text, ''), coalesce(run_id::text, ''),
	coalesce(task_id::text, ''), phase, command, cwd, status, exit_code, ` + logExpr + `, log_bytes, log_sha256,
	log_truncated, error, started_at, finished_at`
}

func scanOperation(row pgx.Row) (Operation, error) {
	var o Operation
	err := row.Scan(&o.ID, &o.CompanyID, &o.ExecutionWorkspaceID, &o.RunID, &o.TaskID, &o.Phase, &o.Command, &o.Cwd,
		&o.Status, &o.ExitCode, &o.Log, &o.LogBytes, &o.LogSHA256, &o.LogTruncated, &o.Error, &o.StartedAt, &o.FinishedAt)
	return o, notFound(err)
}

// NewOperation is a step about to start.
type NewOperation struct {
	CompanyID            string
	ExecutionWorkspaceID string
	RunID                string
	TaskID               string
	Phase                string
	Command              string
	Cwd                  string // relative to the workspace root, never a host path
	NodeID               string
}

// StartOperation records a step as running before it starts.
func StartOperation(ctx context.Context, q Querier, n NewOperation) (Operation, error) {
	o, err := scanOperation(q.QueryRow(ctx, `INSERT INTO workspace_operations (company_id, execution_workspace_id,
			run_id, task_id, phase, command, cwd, node_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING `+operationColumns,
		n.CompanyID, nullable(n.ExecutionWorkspaceID), nullable(n.RunID), nullable(n.TaskID), n.Phase, n.Command, n.Cwd, n.NodeID))
	if err != nil {
		return Operation{}, fmt.Errorf("start operation %s: %w", n.Phase, err)
	}
	return o, nil
}

// OperationResult is how a step ended.
type OperationResult struct {
	Status       string // succeeded, failed or skipped
	ExitCode     *int
	Log          []byte
	LogBytes     int64
	LogSHA256    string
	LogTruncated bool
	Error        string
}

// FinishOperation settles a running step; a step already settled is left as it is.
func FinishOperation(ctx context.Context, q Querier, id string, r OperationResult) error {
	if r.Log == nil {
		r.Log = []byte{}
	}
	if _, err := q.Exec(ctx, `UPDATE workspace_operations SET status = $2, exit_code = $3, log = $4, log_bytes = $5,
			log_sha256 = $6, log_truncated = $7, error = $8, finished_at = now()
		WHERE id = $1 AND status = 'running'`,
		id, r.Status, r.ExitCode, r.Log, r.LogBytes, r.LogSHA256, r.LogTruncated, r.Error); err != nil {
		return fmt.Errorf("finish operation: %w", err)
	}
	return nil
}

// WorkspaceOperations lists a workspace's steps in the order they started.
func WorkspaceOperations(ctx context.Context, q Querier, companyID, workspaceID string) ([]Operation, error) {
	rows, err := q.Query(ctx, `SELECT `+operationColumns+` FROM workspace_operations
		WHERE company_id = $1 AND execution_workspace_id = $2 ORDER BY started_at, id`, companyID, workspaceID)
	if err != nil {
		return nil, fmt.Errorf("workspace operations: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Operation, error) { return scanOperation(r) })
}

// RunOperations lists a run's steps in the order they started.
func RunOperations(ctx context.Context, q Querier, companyID, runID string) ([]Operation, error) {
	rows, err := q.Query(ctx, `SELECT `+operationColumns+` FROM workspace_operations
		WHERE company_id = $1 AND run_id = $2 ORDER BY started_at, id`, companyID, runID)
	if err != nil {
		return nil, fmt.Errorf("run operations: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Operation, error) { return scanOperation(r) })
}

// SettleStuckOperations marks steps still running after age (their executor is gone) as failed.
func SettleStuckOperations(ctx context.Context, q Querier, age time.Duration) (int64, error) {
	tag, err := q.Exec(ctx, `UPDATE workspace_operations SET status = 'failed', finished_at = now(),
			error = 'the executor stopped before this step ended'
		WHERE status = 'running' AND started_at < now() - $1::interval`, age)
	if err != nil {
		return 0, fmt.Errorf("settle stuck operations: %w", err)
	}
	return tag.RowsAffected(), nil
}

// SettleEndedRunOperations marks as failed the steps of phases still running after age whose run
// has ended: their executor is gone (the orphan sweep; docs/runs.md "Crash recovery").
func SettleEndedRunOperations(ctx context.Context, q Querier, phases []string, age time.Duration) (int64, error) {
	tag, err := q.Exec(ctx, `UPDATE workspace_operations o SET status = 'failed', finished_at = now(),
			error = 'the executor stopped before this step ended'
		WHERE o.status = 'running' AND o.phase = ANY($3) AND o.started_at < now() - $1::interval
			AND EXISTS (SELECT 1 FROM runs r WHERE r.id = o.run_id AND r.status <> ALL($2))`,
		age, LiveRunStatuses, phases)
	if err != nil {
		return 0, fmt.Errorf("settle steps of ended runs: %w", err)
	}
	return tag.RowsAffected(), nil
}

// FailRunOperations marks a run's steps still running as failed, because the run's executor
// stopped before they ended (the orphan sweep, in the transaction that ends the run).
func FailRunOperations(ctx context.Context, q Querier, runID string) error {
	if _, err := q.Exec(ctx, `UPDATE workspace_operations SET status = 'failed', finished_at = now(),
			error = 'the run''s executor stopped before this step ended'
		WHERE run_id = $1 AND status = 'running'`, runID); err != nil {
		return fmt.Errorf("settle the run's steps: %w", err)
	}
	return nil
}

// AttachRunOperations records workspaceID on a run's steps written before its execution workspace
// existed (realization), so they show in that workspace's ledger.
func AttachRunOperations(ctx context.Context, q Querier, runID, workspaceID string) error {
	if _, err := q.Exec(ctx, `UPDATE workspace_operations SET execution_workspace_id = $1 WHERE run_id = $2`,
		workspaceID, runID); err != nil {
		return fmt.Errorf("attach run operations: %w", err)
	}
	return nil
}

// RunStepSucceeded reports whether a run already has a settled step of phase that a retried job
// must not repeat: succeeded, or skipped by the plan.
func RunStepSucceeded(ctx context.Context, q Querier, runID, phase string) bool {
	var done bool
	_ = q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM workspace_operations WHERE run_id = $1 AND phase = $2
		AND status IN ('succeeded', 'skipped'))`, runID, phase).Scan(&done)
	return done
}

// OperationCursor is the position after which a page of a workspace's ledger starts (oldest
// first).
type OperationCursor struct {
	StartedAt time.Time `json:"t"`
	ID        string    `json:"i"`
}

// WorkspaceOperationsPage lists a workspace's ledger oldest first, after the cursor, at most
// limit, with only the last excerpt bytes of each log (Log holds that tail; LogBytes the total
// captured size).
func WorkspaceOperationsPage(ctx context.Context, q Querier, companyID, workspaceID string, after OperationCursor, limit, excerpt int) ([]Operation, error) {
	if !validUUID(companyID) || !validUUID(workspaceID) {
		return nil, ErrNotFound
	}
	var afterID any
	if after.ID != "" {
		if !validUUID(after.ID) {
			return nil, fmt.Errorf("workspace operations: %w", ErrInvalidID)
		}
		afterID = after.ID
	}
	rows, err := q.Query(ctx, `SELECT `+operationColumnsWithLog(`substring(log FROM greatest(length(log) - $6 + 1, 1))`)+`
		FROM workspace_operations
		WHERE company_id = $1 AND execution_workspace_id = $2
		  AND ($4::uuid IS NULL OR (started_at, id) > ($3::timestamptz, $4::uuid))
		ORDER BY started_at, id LIMIT $5`, companyID, workspaceID, after.StartedAt, afterID, limit, excerpt)
	if err != nil {
		return nil, fmt.Errorf("workspace operations: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Operation, error) { return scanOperation(r) })
}

// WorkspaceOperationByID reads one ledger step of a company's workspace, with its whole stored log.
func WorkspaceOperationByID(ctx context.Context, q Querier, companyID, workspaceID, id string) (Operation, error) {
	if !validUUID(companyID) || !validUUID(workspaceID) || !validUUID(id) {
		return Operation{}, ErrNotFound
	}
	return scanOperation(q.QueryRow(ctx, `SELECT `+operationColumns+` FROM workspace_operations
		WHERE company_id = $1 AND execution_workspace_id = $2 AND id = $3`, companyID, workspaceID, id))
}

// OperationSucceededSince reports whether the workspace's ledger has a succeeded step of phase
// whose command starts with prefix, started at or after since (database clock): how a retried
// job finds a step its earlier attempt already did.
func OperationSucceededSince(ctx context.Context, q Querier, workspaceID, phase, prefix string, since time.Time) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM workspace_operations
		WHERE execution_workspace_id = $1 AND phase = $2 AND status = 'succeeded' AND started_at >= $4
		  AND left(command, length($3)) = $3)`, workspaceID, phase, prefix, since).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("operation lookup: %w", err)
	}
	return ok, nil
}

// OperationStartedSince reports whether the workspace's ledger has a step of phase, in any
// status, started at or after since (database clock): an earlier attempt of a job got that far.
func OperationStartedSince(ctx context.Context, q Querier, workspaceID, phase string, since time.Time) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM workspace_operations
		WHERE execution_workspace_id = $1 AND phase = $2 AND started_at >= $3)`, workspaceID, phase, since).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("operation lookup: %w", err)
	}
	return ok, nil
}
