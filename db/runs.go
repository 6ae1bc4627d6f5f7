package db

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Run statuses. Queued, preparing and running are live; the rest are terminal.
const (
	RunQueued    = "queued"
	RunPreparing = "preparing"
	RunRunning   = "running"
	RunSucceeded = "succeeded"
	RunFailed    = "failed"
	RunCancelled = "cancelled"
	RunTimedOut  = "timed_out"
)

// LiveRunStatuses are the statuses of a run that has not ended.
var LiveRunStatuses = []string{RunQueued, RunPreparing, RunRunning}

// ErrRunState is returned when a run is not in a state that allows the transition asked for
// (a retried job finding the run already moved on, a cancel after the end).
var ErrRunState = errors.New("run is not in the expected state")

// Run is one execution of a task's command.
type Run struct {
	ID                   string
	CompanyID            string
	TaskID               string
	ExecutionWorkspaceID string
	EnvironmentID        string
	LeaseID              string
	AgentID              string
	CreatedBy            string
	Status               string
	ErrorCode            string
	ErrorMessage         string
	ExitCode             *int
	Command              string
	Plan                 []byte
	TimeoutS             int
	CancelRequested      bool
	NodeID               string
	LogBytes             int64
	LogTruncated         bool
	CreatedAt            time.Time
	StartedAt            *time.Time
	FinishedAt           *time.Time
	HeartbeatAt          *time.Time
}

// Live reports whether the run has not ended.
func (r Run) Live() bool {
	return r.Status == RunQueued || r.Status == RunPreparing || r.Status == RunRunning
}

const runColumns = `id, company_id, coalesce(task_id::text, ''), coalesce(execution_workspace_id::text, ''),
	coalesce(environment_id::text, ''), coalesce(lease_id::text, ''), coalesce(agent_id::text, ''),
	coalesce(created_by::text, ''), status, error_code, error_message, exit_code, command, plan, timeout_s,
	cancel_requested, node_id, log_bytes, log_truncated, created_at, started_at, finished_at, heartbeat_at`

func scanRun(row pgx.Row) (Run, error) {
	var r Run
	err := row.Scan(&r.ID, &r.CompanyID, &r.TaskID, &r.ExecutionWorkspaceID, &r.EnvironmentID, &r.LeaseID,
		&r.AgentID, &r.CreatedBy, &r.Status, &r.ErrorCode, &r.ErrorMessage, &r.ExitCode, &r.Command, &r.Plan,
		&r.TimeoutS, &r.CancelRequested, &r.NodeID, &r.LogBytes, &r.LogTruncated, &r.CreatedAt, &r.StartedAt,
		&r.FinishedAt, &r.HeartbeatAt)
	return r, notFound(err)
}

func collectRuns(rows pgx.Rows) ([]Run, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Run, error) { return scanRun(r) })
}

// NewRun is what admitting a run records.
type NewRun struct {
	CompanyID     string
	TaskID        string
	EnvironmentID string
	CreatedBy     string // user id, or "" for an agent
	AgentID       string
	Command       string
	Plan          []byte // the effective plan (JSON) the run was admitted with
	TimeoutS      int
}

// CreateRun records an admitted run as queued. A task that already has a live run is ErrConflict
// (the partial unique index runs_one_live_per_task); the statement cannot fail on it, so a
// transaction that gets ErrConflict stays usable.
func CreateRun(ctx context.Context, q Querier, n NewRun) (Run, error) {
	plan := n.Plan
	if len(plan) == 0 {
		plan = []byte("{}")
	}
	r, err := scanRun(q.QueryRow(ctx, `INSERT INTO runs (company_id, task_id, environment_id, created_by, agent_id,
			command, plan, timeout_s)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (task_id) WHERE status IN ('queued', 'preparing', 'running') AND attempt_group_id IS NULL DO NOTHING
		RETURNING `+runColumns,
		n.CompanyID, n.TaskID, nullable(n.EnvironmentID), nullable(n.CreatedBy), nullable(n.AgentID), n.Command, plan, n.TimeoutS))
	if errors.Is(err, ErrNotFound) {
		return Run{}, fmt.Errorf("create run: task %s has a live run: %w", n.TaskID, ErrConflict)
	}
	if err != nil {
		return Run{}, fmt.Errorf("create run: %w", err)
	}
	return r, nil
}

// LiveTaskRun reads the task's live run (queued, preparing or running); there is at most one.
// None is ErrNotFound.
func LiveTaskRun(ctx context.Context, q Querier, companyID, taskID string) (Run, error) {
	if !validUUID(taskID) {
		return Run{}, ErrNotFound
	}
	return scanRun(q.QueryRow(ctx, `SELECT `+runColumns+` FROM runs
		WHERE company_id = $1 AND task_id = $2 AND status IN ('queued', 'preparing', 'running')`, companyID, taskID))
}

// IdempotencyTTL is how long an Idempotency-Key of run creation keeps answering with its run.
const IdempotencyTTL = 24 * time.Hour

// IdempotentRun is what an Idempotency-Key was first used for.
type IdempotentRun struct {
	TaskID string
	RunID  string
}

// RunForIdempotencyKey reads what principal's key was used for within IdempotencyTTL (database
// clock), after forgetting principal's expired keys. An unknown or expired key is ErrNotFound.
func RunForIdempotencyKey(ctx context.Context, q Querier, principal, key string) (IdempotentRun, error) {
	if _, err := q.Exec(ctx, `DELETE FROM run_idempotency_keys WHERE principal = $1 AND created_at <= now() - $2::interval`,
		principal, IdempotencyTTL); err != nil {
		return IdempotentRun{}, fmt.Errorf("expire idempotency keys: %w", err)
	}
	var k IdempotentRun
	err := q.QueryRow(ctx, `SELECT task_id::text, run_id::text FROM run_idempotency_keys WHERE principal = $1 AND key = $2`,
		principal, key).Scan(&k.TaskID, &k.RunID)
	return k, notFound(err)
}

// RecordIdempotencyKey binds principal's key to a run of a task. A key already bound (by a
// concurrent request that committed first) is ErrConflict; the statement cannot fail on it.
func RecordIdempotencyKey(ctx context.Context, q Querier, principal, key, companyID, taskID, runID string) error {
	tag, err := q.Exec(ctx, `INSERT INTO run_idempotency_keys (principal, key, company_id, task_id, run_id)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT (principal, key) DO NOTHING`, principal, key, companyID, taskID, runID)
	if err != nil {
		return fmt.Errorf("record idempotency key: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("record idempotency key: %w", ErrConflict)
	}
	return nil
}

// RunByID reads a run of a company.
func RunByID(ctx context.Context, q Querier, companyID, id string) (Run, error) {
	if !validUUID(id) {
		return Run{}, ErrNotFound
	}
	return scanRun(q.QueryRow(ctx, `SELECT `+runColumns+` FROM runs WHERE company_id = $1 AND id = $2`, companyID, id))
}

// RunUpdate is what a transition writes besides the status; nil fields stay as they are.
type RunUpdate struct {
	ExecutionWorkspaceID *string
	LeaseID              *string
	ErrorCode            *string
	ErrorMessage         *string
	ExitCode             *int
	NodeID               *string
	Started              bool // set started_at = now()
	Finished             bool // set finished_at = now()
}

// ForgetRunWorkspace undoes the record of a preparing run's workspace before it holds a lease
// there (the workspace began to close meanwhile), so the run's next attempt chooses again.
func ForgetRunWorkspace(ctx context.Context, q Querier, runID, workspaceID string) error {
	if _, err := q.Exec(ctx, `UPDATE runs SET execution_workspace_id = NULL
		WHERE id = $1 AND execution_workspace_id = $2 AND status = 'preparing' AND lease_id IS NULL`, runID, workspaceID); err != nil {
		return fmt.Errorf("forget run workspace: %w", err)
	}
	return nil
}

// TransitionRun moves a run from one of the from statuses to to, with the fields of u, in one
// conditional UPDATE. A run in another status is ErrRunState and is left unchanged.
func TransitionRun(ctx context.Context, q Querier, id string, from []string, to string, u RunUpdate) (Run, error) {
	r, err := scanRun(q.QueryRow(ctx, `UPDATE runs SET status = $3,
			execution_workspace_id = coalesce($4::uuid, execution_workspace_id),
			lease_id = coalesce($5::uuid, lease_id),
			error_code = coalesce($6, error_code),
			error_message = coalesce($7, error_message),
			exit_code = coalesce($8, exit_code),
			node_id = coalesce($9, node_id),
			started_at = CASE WHEN $10 THEN coalesce(started_at, now()) ELSE started_at END,
			finished_at = CASE WHEN $11 THEN coalesce(finished_at, now()) ELSE finished_at END,
			heartbeat_at = now()
		WHERE id = $1 AND status = ANY($2) RETURNING `+runColumns,
		id, from, to, u.ExecutionWorkspaceID, u.LeaseID, u.ErrorCode, u.ErrorMessage, u.ExitCode, u.NodeID, u.Started, u.Finished))
	if errors.Is(err, ErrNotFound) {
		return Run{}, fmt.Errorf("run %s to %s: %w", id, to, ErrRunState)
	}
	if err != nil {
		return Run{}, fmt.Errorf("run %s to %s: %w", id, to, err)
	}
	return r, nil
}

// RunForJob reads a run by id for a worker (jobs carry the run id they were enqueued with).
func RunForJob(ctx context.Context, q Querier, id string) (Run, error) {
	if !validUUID(id) {
		return Run{}, ErrNotFound
	}
	return scanRun(q.QueryRow(ctx, `SELECT `+runColumns+` FROM runs WHERE id = $1`, id))
}

// LockRun reads a run by id and locks its row for the rest of tx, so its executor's heartbeats
// and transitions wait for the caller's decision (the orphan sweep's).
func LockRun(ctx context.Context, tx pgx.Tx, id string) (Run, error) {
	if !validUUID(id) {
		return Run{}, ErrNotFound
	}
	return scanRun(tx.QueryRow(ctx, `SELECT `+runColumns+` FROM runs WHERE id = $1 FOR UPDATE`, id))
}

// RunCancelRequested reports whether someone asked to cancel the run: the executor polls it while
// the command runs.
func RunCancelRequested(ctx context.Context, q Querier, id string) (bool, error) {
	var cancel bool
	if err := q.QueryRow(ctx, `SELECT cancel_requested FROM runs WHERE id = $1`, id).Scan(&cancel); err != nil {
		return false, fmt.Errorf("run %s cancel requested: %w", id, notFound(err))
	}
	return cancel, nil
}

// RunLog is a run's kept log: all of it, or (Truncated) its first Head bytes, a marker line and
// its last bytes (docs/runs.md "Logs").
type RunLog struct {
	Data      []byte
	Head      int   // leading bytes of Data that are the log's first bytes (len(Data) unless truncated)
	Total     int64 // bytes the run printed in all
	Truncated bool
}

// SetRunLog stores the kept log, where its head ends, and the total size.
func SetRunLog(ctx context.Context, q Querier, id string, l RunLog) error {
	log := l.Data
	if log == nil {
		log = []byte{}
	}
	var head *int
	if l.Truncated && l.Head < len(log) {
		head = &l.Head
	}
	if _, err := q.Exec(ctx, `UPDATE runs SET log = $2, log_head_bytes = $3, log_bytes = $4, log_truncated = $5,
			heartbeat_at = now()
		WHERE id = $1`, id, log, head, l.Total, l.Truncated); err != nil {
		return fmt.Errorf("set run log: %w", err)
	}
	return nil
}

// RunLogOf reads a run's kept log (a run written before head-and-tail logs has all of its kept
// bytes as head).
func RunLogOf(ctx context.Context, q Querier, companyID, id string) (RunLog, error) {
	if !validUUID(id) {
		return RunLog{}, ErrNotFound
	}
	var (
		l    RunLog
		head *int
	)
	err := q.QueryRow(ctx, `SELECT log, log_head_bytes, log_bytes, log_truncated FROM runs WHERE company_id = $1 AND id = $2`,
		companyID, id).Scan(&l.Data, &head, &l.Total, &l.Truncated)
	if err != nil {
		return RunLog{}, notFound(err)
	}
	l.Head = len(l.Data)
	if head != nil && *head < len(l.Data) {
		l.Head = *head
	}
	return l, nil
}

// RequestRunCancel marks a live run for cancellation; the executor notices and stops the command.
// A run that already ended is ErrRunState.
func RequestRunCancel(ctx context.Context, q Querier, companyID, id string) (Run, error) {
	r, err := scanRun(q.QueryRow(ctx, `UPDATE runs SET cancel_requested = true
		WHERE company_id = $1 AND id = $2 AND status = ANY($3) RETURNING `+runColumns, companyID, id, LiveRunStatuses))
	if errors.Is(err, ErrNotFound) {
		if _, err := RunByID(ctx, q, companyID, id); err != nil {
			return Run{}, err
		}
		return Run{}, ErrRunState
	}
	return r, err
}

// RunCursor is the keyset position of a run in a newest-first list.
type RunCursor struct {
	CreatedAt time.Time `json:"t"`
	ID        string    `json:"id"`
}

// TaskRuns lists a task's latest runs, newest first.
func TaskRuns(ctx context.Context, q Querier, companyID, taskID string, limit int) ([]Run, error) {
	return TaskRunsAfter(ctx, q, companyID, taskID, nil, limit)
}

// TaskRunsAfter lists a task's runs, newest first, from after the cursor when one is given.
func TaskRunsAfter(ctx context.Context, q Querier, companyID, taskID string, after *RunCursor, limit int) ([]Run, error) {
	if !validUUID(taskID) || (after != nil && !validUUID(after.ID)) {
		return nil, ErrNotFound
	}
	var at *time.Time
	var id *string
	if after != nil {
		at, id = &after.CreatedAt, &after.ID
	}
	rows, err := q.Query(ctx, `SELECT `+runColumns+` FROM runs WHERE company_id = $1 AND task_id = $2
			AND ($3::timestamptz IS NULL OR (created_at, id) < ($3, $4::uuid))
		ORDER BY created_at DESC, id DESC LIMIT $5`, companyID, taskID, at, id, limit)
	if err != nil {
		return nil, fmt.Errorf("task runs: %w", err)
	}
	return collectRuns(rows)
}

// StaleRuns lists live runs whose executor has not written a heartbeat for longer than age
// (database clock): the candidates for the orphan sweep.
func StaleRuns(ctx context.Context, q Querier, age time.Duration, limit int) ([]Run, error) {
	rows, err := q.Query(ctx, `SELECT `+runColumns+` FROM runs
		WHERE status = ANY($1) AND coalesce(heartbeat_at, created_at) < now() - $2::interval
		ORDER BY created_at LIMIT $3`, []string{RunPreparing, RunRunning}, age, limit)
	if err != nil {
		return nil, fmt.Errorf("stale runs: %w", err)
	}
	return collectRuns(rows)
}

// HeartbeatRun records that the run's executor is alive.
func HeartbeatRun(ctx context.Context, q Querier, id string) error {
	if _, err := q.Exec(ctx, `UPDATE runs SET heartbeat_at = now() WHERE id = $1`, id); err != nil {
		return fmt.Errorf("heartbeat run: %w", err)
	}
	return nil
}

// WorkspaceRuns lists the runs of a workspace, newest first: those recorded on it, and live runs
// not yet provisioned whose plan reuses it (they will work in it).
func WorkspaceRuns(ctx context.Context, q Querier, companyID, workspaceID string, limit int) ([]Run, error) {
	if !validUUID(companyID) || !validUUID(workspaceID) {
		return nil, ErrNotFound
	}
	rows, err := q.Query(ctx, `SELECT `+runColumns+` FROM runs
		WHERE company_id = $1 AND (execution_workspace_id = $2
			OR (execution_workspace_id IS NULL AND status = ANY($3) AND plan->>'reuse_workspace_id' = $2::text))
		ORDER BY created_at DESC, id DESC LIMIT $4`, companyID, workspaceID, LiveRunStatuses, limit)
	if err != nil {
		return nil, fmt.Errorf("workspace runs: %w", err)
	}
	return collectRuns(rows)
}

// WorkspaceLiveRuns lists every live run of a workspace (see WorkspaceRuns), however many.
func WorkspaceLiveRuns(ctx context.Context, q Querier, companyID, workspaceID string) ([]Run, error) {
	if !validUUID(companyID) || !validUUID(workspaceID) {
		return nil, ErrNotFound
	}
	rows, err := q.Query(ctx, `SELECT `+runColumns+` FROM runs
		WHERE company_id = $1 AND status = ANY($3) AND (execution_workspace_id = $2
			OR (execution_workspace_id IS NULL AND plan->>'reuse_workspace_id' = $2::text))
		ORDER BY created_at DESC, id DESC`, companyID, workspaceID, LiveRunStatuses)
	if err != nil {
		return nil, fmt.Errorf("workspace live runs: %w", err)
	}
	return collectRuns(rows)
}

// NodeRunsEndedWith lists the ids of node's runs that ended with errorCode within the last window
// (database clock), newest first, at most limit: a restarted node kills what is left of its
// orphaned runs' processes.
func NodeRunsEndedWith(ctx context.Context, q Querier, nodeID, errorCode string, window time.Duration, limit int) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT id::text FROM runs
		WHERE node_id = $1 AND status <> ALL($2) AND error_code = $3 AND finished_at > now() - $4::interval
		ORDER BY finished_at DESC LIMIT $5`, nodeID, LiveRunStatuses, errorCode, window, limit)
	if err != nil {
		return nil, fmt.Errorf("ended runs of node %s: %w", nodeID, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("ended runs of node %s: %w", nodeID, err)
	}
	return ids, nil
}

// NodeRealizing reports whether a run of node is preparing without an execution workspace yet:
// a realization there may have created a directory it has not recorded.
func NodeRealizing(ctx context.Context, q Querier, nodeID string) (bool, error) {
	var inflight bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM runs WHERE node_id = $1 AND status = $2
		AND execution_workspace_id IS NULL)`, nodeID, RunPreparing).Scan(&inflight); err != nil {
		return false, fmt.Errorf("node %s realizing: %w", nodeID, err)
	}
	return inflight, nil
}
