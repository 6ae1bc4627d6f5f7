package db

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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

const operationColumns = `id, company_id, coalesce(execution_workspace_id::text, ''), coalesce(run_id::text, ''),
	coalesce(task_id::text, ''), phase, command, cwd, status, exit_code, log, log_bytes, log_sha256, log_truncated,
	error, started_at, finished_at`

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

// RunStepSucceeded reports whether a run already has a succeeded step of phase (a retried job
// skips it).
func RunStepSucceeded(ctx context.Context, q Querier, runID, phase string) bool {
	var done bool
	_ = q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM workspace_operations WHERE run_id = $1 AND phase = $2
		AND status = 'succeeded')`, runID, phase).Scan(&done)
	return done
}
