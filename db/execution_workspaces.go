package db

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrWorkspaceFenced is returned when a workspace write names a generation that is no longer
// current (the workspace was closed or reopened since), or a state that has moved on.
var ErrWorkspaceFenced = errors.New("execution workspace generation is stale")

// ExecutionWorkspace is where one task's runs really work.
type ExecutionWorkspace struct {
	ID                 string
	CompanyID          string
	ProjectID          string
	ProjectWorkspaceID string
	SourceTaskID       string
	Mode               string
	Strategy           string
	Trust              string
	Status             string
	FinalizeState      string
	Generation         int64
	Ref                string
	Cwd                string
	BaseRef            string
	BaseCommit         string
	Branch             string
	BaseTreeDigest     string
	Reusable           bool
	Plan               []byte
	ClosedAt           *time.Time
	CleanupReason      string
	CreatedAt          time.Time
	UpdatedAt          time.Time
}

const executionWorkspaceColumns = `id, company_id, project_id, coalesce(project_workspace_id::text, ''),
	coalesce(source_task_id::text, ''), mode, strategy, trust, status, finalize_state, generation, ref, cwd,
	base_ref, base_commit, branch, base_tree_digest, reusable, plan, closed_at, cleanup_reason, created_at, updated_at`

func scanExecutionWorkspace(row pgx.Row) (ExecutionWorkspace, error) {
	var w ExecutionWorkspace
	err := row.Scan(&w.ID, &w.CompanyID, &w.ProjectID, &w.ProjectWorkspaceID, &w.SourceTaskID, &w.Mode, &w.Strategy,
		&w.Trust, &w.Status, &w.FinalizeState, &w.Generation, &w.Ref, &w.Cwd, &w.BaseRef, &w.BaseCommit, &w.Branch,
		&w.BaseTreeDigest, &w.Reusable, &w.Plan, &w.ClosedAt, &w.CleanupReason, &w.CreatedAt, &w.UpdatedAt)
	return w, notFound(err)
}

// NewExecutionWorkspace is what provisioning records before it realizes anything.
type NewExecutionWorkspace struct {
	CompanyID          string
	ProjectID          string
	ProjectWorkspaceID string
	SourceTaskID       string
	Mode               string
	Strategy           string
	Trust              string
	Ref                string // the opaque ws- ref the workspace manager will create
	Plan               []byte
}

// CreateExecutionWorkspace records a workspace in status preparing.
func CreateExecutionWorkspace(ctx context.Context, q Querier, n NewExecutionWorkspace) (ExecutionWorkspace, error) {
	plan := n.Plan
	if len(plan) == 0 {
		plan = []byte("{}")
	}
	w, err := scanExecutionWorkspace(q.QueryRow(ctx, `INSERT INTO execution_workspaces (company_id, project_id,
			project_workspace_id, source_task_id, mode, strategy, trust, ref, plan)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING `+executionWorkspaceColumns,
		n.CompanyID, n.ProjectID, nullable(n.ProjectWorkspaceID), nullable(n.SourceTaskID), n.Mode, n.Strategy, n.Trust, n.Ref, plan))
	if err != nil {
		return ExecutionWorkspace{}, fmt.Errorf("create execution workspace: %w", err)
	}
	return w, nil
}

// ExecutionWorkspaceByID reads a workspace of a company.
func ExecutionWorkspaceByID(ctx context.Context, q Querier, companyID, id string) (ExecutionWorkspace, error) {
	if !validUUID(id) {
		return ExecutionWorkspace{}, ErrNotFound
	}
	return scanExecutionWorkspace(q.QueryRow(ctx, `SELECT `+executionWorkspaceColumns+`
		FROM execution_workspaces WHERE company_id = $1 AND id = $2`, companyID, id))
}

// Realized is what realization found out, recorded when a workspace becomes ready.
type Realized struct {
	Cwd        string
	BaseRef    string
	BaseCommit string
	Branch     string
	TreeDigest string
}

// MarkExecutionWorkspaceReady records a realized workspace, fenced by generation: only a
// workspace still preparing (or ready, for a retried job) at that generation changes.
func MarkExecutionWorkspaceReady(ctx context.Context, q Querier, id string, gen int64, r Realized) (ExecutionWorkspace, error) {
	w, err := scanExecutionWorkspace(q.QueryRow(ctx, `UPDATE execution_workspaces SET status = 'ready', cwd = $3,
			base_ref = $4, base_commit = $5, branch = $6, base_tree_digest = $7, updated_at = now()
		WHERE id = $1 AND generation = $2 AND status IN ('preparing', 'ready') RETURNING `+executionWorkspaceColumns,
		id, gen, r.Cwd, r.BaseRef, r.BaseCommit, r.Branch, r.TreeDigest))
	if errors.Is(err, ErrNotFound) {
		return ExecutionWorkspace{}, ErrWorkspaceFenced
	}
	return w, err
}

// MarkExecutionWorkspaceFailed records that preparing the workspace failed.
func MarkExecutionWorkspaceFailed(ctx context.Context, q Querier, id string, gen int64, reason string) error {
	tag, err := q.Exec(ctx, `UPDATE execution_workspaces SET status = 'failed', cleanup_reason = $3, updated_at = now()
		WHERE id = $1 AND generation = $2 AND status = 'preparing'`, id, gen, reason)
	if err != nil {
		return fmt.Errorf("mark workspace failed: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrWorkspaceFenced
	}
	return nil
}

// SetFinalizeState records the workspace's finalize state (none, pending, settled, failed).
func SetFinalizeState(ctx context.Context, q Querier, id, state string) error {
	if _, err := q.Exec(ctx, `UPDATE execution_workspaces SET finalize_state = $2, updated_at = now() WHERE id = $1`, id, state); err != nil {
		return fmt.Errorf("set finalize state: %w", err)
	}
	return nil
}

// ExecutionWorkspaceFilter narrows a list of workspaces.
type ExecutionWorkspaceFilter struct {
	Status    string
	ProjectID string
	TaskID    string
	Before    *time.Time // keyset: created before this…
	BeforeID  string     // …or at it with a smaller id
	Limit     int
}

// ListExecutionWorkspaces lists a company's workspaces, newest first.
func ListExecutionWorkspaces(ctx context.Context, q Querier, companyID string, f ExecutionWorkspaceFilter) ([]ExecutionWorkspace, error) {
	rows, err := q.Query(ctx, `SELECT `+executionWorkspaceColumns+` FROM execution_workspaces
		WHERE company_id = $1
		  AND ($2 = '' OR status = $2)
		  AND ($3 = '' OR project_id::text = $3)
		  AND ($4 = '' OR source_task_id::text = $4 OR id IN (SELECT execution_workspace_id FROM task_workspace_bindings
		        WHERE task_id::text = $4 AND execution_workspace_id IS NOT NULL))
		  AND ($5::timestamptz IS NULL OR (created_at, id::text) < ($5, $6))
		ORDER BY created_at DESC, id DESC LIMIT $7`,
		companyID, f.Status, f.ProjectID, f.TaskID, f.Before, f.BeforeID, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("list execution workspaces: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ExecutionWorkspace, error) { return scanExecutionWorkspace(r) })
}

// ---- Close and reopen (issue 5): the fenced transitions, and what close-readiness reads. ----

// Workspace statuses.
const (
	WorkspacePreparing     = "preparing"
	WorkspaceReady         = "ready"
	WorkspaceFailed        = "failed"
	WorkspaceClosing       = "closing"
	WorkspaceClosed        = "closed"
	WorkspaceCleanupFailed = "cleanup_failed"
)

// WorkspaceStatuses are the statuses an execution workspace can be in, for filters.
var WorkspaceStatuses = []string{WorkspacePreparing, WorkspaceReady, WorkspaceFailed, WorkspaceClosing,
	WorkspaceClosed, WorkspaceCleanupFailed}

// ExecutionWorkspaceForJob reads a workspace by id for a worker (jobs carry the ids they were
// enqueued with); companyID still filters.
func ExecutionWorkspaceForJob(ctx context.Context, q Querier, companyID, id string) (ExecutionWorkspace, error) {
	return ExecutionWorkspaceByID(ctx, q, companyID, id)
}

// LockExecutionWorkspace reads a company's workspace and locks its row for the rest of tx, so
// leases (AcquireLease share-locks the row) and other closes or reopens wait for the decision.
func LockExecutionWorkspace(ctx context.Context, tx pgx.Tx, companyID, id string) (ExecutionWorkspace, error) {
	if !validUUID(id) || !validUUID(companyID) {
		return ExecutionWorkspace{}, ErrNotFound
	}
	return scanExecutionWorkspace(tx.QueryRow(ctx, `SELECT `+executionWorkspaceColumns+`
		FROM execution_workspaces WHERE company_id = $1 AND id = $2 FOR UPDATE`, companyID, id))
}

// workspaceTransition is one fenced UPDATE of a workspace: it matches only the generation the
// writer holds and the statuses the transition starts from, else ErrWorkspaceFenced.
func workspaceTransition(ctx context.Context, q Querier, id string, gen int64, from []string, set string, args ...any) (ExecutionWorkspace, error) {
	all := append([]any{id, gen, from}, args...)
	w, err := scanExecutionWorkspace(q.QueryRow(ctx, `UPDATE execution_workspaces SET `+set+`, updated_at = now()
		WHERE id = $1 AND generation = $2 AND status = ANY($3) RETURNING `+executionWorkspaceColumns, all...))
	if errors.Is(err, ErrNotFound) {
		return ExecutionWorkspace{}, ErrWorkspaceFenced
	}
	if err != nil {
		return ExecutionWorkspace{}, fmt.Errorf("workspace %s: %w", id, err)
	}
	return w, nil
}

// BeginWorkspaceClose moves a ready, failed or cleanup_failed workspace at generation gen to
// closing and bumps its generation (the close job's fencing token).
func BeginWorkspaceClose(ctx context.Context, q Querier, id string, gen int64) (ExecutionWorkspace, error) {
	return workspaceTransition(ctx, q, id, gen, []string{WorkspaceReady, WorkspaceFailed, WorkspaceCleanupFailed},
		`status = 'closing', generation = generation + 1, cleanup_reason = ''`)
}

// FinishWorkspaceClose records a finished close: closing at gen → closed, closed_at now().
func FinishWorkspaceClose(ctx context.Context, q Querier, id string, gen int64) (ExecutionWorkspace, error) {
	return workspaceTransition(ctx, q, id, gen, []string{WorkspaceClosing},
		`status = 'closed', closed_at = now(), cleanup_reason = ''`)
}

// FailWorkspaceClose records a failed close step: closing at gen → cleanup_failed with why. A
// later close (a new generation) retries.
func FailWorkspaceClose(ctx context.Context, q Querier, id string, gen int64, reason string) (ExecutionWorkspace, error) {
	return workspaceTransition(ctx, q, id, gen, []string{WorkspaceClosing},
		`status = 'cleanup_failed', cleanup_reason = $4`, reason)
}

// BeginWorkspaceReopen moves a closed workspace at generation gen to preparing and bumps its
// generation (the rebuild job's fencing token).
func BeginWorkspaceReopen(ctx context.Context, q Querier, id string, gen int64) (ExecutionWorkspace, error) {
	return workspaceTransition(ctx, q, id, gen, []string{WorkspaceClosed},
		`status = 'preparing', generation = generation + 1, cleanup_reason = ''`)
}

// MarkWorkspaceReopened records a rebuilt workspace: preparing at gen → ready, with the new
// opaque ref and what realization found; closed_at is cleared.
func MarkWorkspaceReopened(ctx context.Context, q Querier, id string, gen int64, ref string, r Realized) (ExecutionWorkspace, error) {
	return workspaceTransition(ctx, q, id, gen, []string{WorkspacePreparing},
		`status = 'ready', closed_at = NULL, ref = $4, cwd = $5, base_ref = $6, base_commit = $7, branch = $8,
			base_tree_digest = $9`, ref, r.Cwd, r.BaseRef, r.BaseCommit, r.Branch, r.TreeDigest)
}

// AbortWorkspaceReopen records a rebuild that failed: preparing at gen → closed again (nothing
// is on disk), with why in cleanup_reason.
func AbortWorkspaceReopen(ctx context.Context, q Querier, id string, gen int64, reason string) (ExecutionWorkspace, error) {
	return workspaceTransition(ctx, q, id, gen, []string{WorkspacePreparing},
		`status = 'closed', closed_at = now(), cleanup_reason = $4`, reason)
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
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Run, error) { return scanRun(r) })
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
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Run, error) { return scanRun(r) })
}

// WorkspaceLeases lists a workspace's leases, live ones first, then newest first. With live set
// only live leases are listed (all of them); otherwise at most limit.
func WorkspaceLeases(ctx context.Context, q Querier, companyID, workspaceID string, live bool, limit int) ([]Lease, error) {
	if !validUUID(companyID) || !validUUID(workspaceID) {
		return nil, ErrNotFound
	}
	if live {
		limit = 1 << 20
	}
	rows, err := q.Query(ctx, `SELECT `+leaseColumns+` FROM environment_leases l
		WHERE l.company_id = $1 AND l.execution_workspace_id = $2
			AND (NOT $3 OR l.status IN ('acquiring', 'active', 'releasing'))
		ORDER BY (l.status IN ('acquiring', 'active', 'releasing')) DESC, l.created_at DESC, l.id DESC LIMIT $4`,
		companyID, workspaceID, live, limit)
	if err != nil {
		return nil, fmt.Errorf("workspace leases: %w", err)
	}
	return collectLeases(rows)
}

// WorkspaceTask is a task linked to a workspace: the task that created it, or one bound to it.
type WorkspaceTask struct {
	ID     string
	Key    string
	Title  string
	Status string
	Source bool // the task whose run created the workspace
	Bound  bool // the task's binding names the workspace
}

// WorkspaceLinkedTasks lists the source task and every task bound to a workspace, by key.
func WorkspaceLinkedTasks(ctx context.Context, q Querier, companyID, workspaceID string) ([]WorkspaceTask, error) {
	if !validUUID(companyID) || !validUUID(workspaceID) {
		return nil, ErrNotFound
	}
	rows, err := q.Query(ctx, `SELECT t.id, t.key, t.title, t.status,
			coalesce(t.id = w.source_task_id, false),
			EXISTS (SELECT 1 FROM task_workspace_bindings b WHERE b.task_id = t.id AND b.execution_workspace_id = w.id)
		FROM execution_workspaces w
		JOIN tasks t ON t.company_id = w.company_id
		WHERE w.company_id = $1 AND w.id = $2
		  AND (t.id = w.source_task_id OR t.id IN (SELECT task_id FROM task_workspace_bindings WHERE execution_workspace_id = w.id))
		ORDER BY t.key, t.id`, companyID, workspaceID)
	if err != nil {
		return nil, fmt.Errorf("workspace tasks: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkspaceTask, error) {
		var t WorkspaceTask
		err := r.Scan(&t.ID, &t.Key, &t.Title, &t.Status, &t.Source, &t.Bound)
		return t, err
	})
}

// WorkspaceWorkProducts lists the work products recorded from a workspace, newest first.
func WorkspaceWorkProducts(ctx context.Context, q Querier, companyID, workspaceID string, limit int) ([]WorkProduct, error) {
	if !validUUID(companyID) || !validUUID(workspaceID) {
		return nil, ErrNotFound
	}
	rows, err := q.Query(ctx, `SELECT `+workProductColumns+` FROM work_products
		WHERE company_id = $1 AND execution_workspace_id = $2 ORDER BY created_at DESC, id DESC LIMIT $3`,
		companyID, workspaceID, limit)
	if err != nil {
		return nil, fmt.Errorf("workspace work products: %w", err)
	}
	return collectWorkProducts(rows)
}

// WorkProductCursor is the position after which a page of work products starts.
type WorkProductCursor struct {
	CreatedAt time.Time `json:"t"`
	ID        string    `json:"i"`
}

// TaskWorkProductsPage lists a task's work products newest first, after the cursor (zero: from
// the newest), at most limit.
func TaskWorkProductsPage(ctx context.Context, q Querier, companyID, taskID string, after WorkProductCursor, limit int) ([]WorkProduct, error) {
	if !validUUID(companyID) || !validUUID(taskID) {
		return nil, ErrNotFound
	}
	var afterID any
	if after.ID != "" {
		if !validUUID(after.ID) {
			return nil, fmt.Errorf("task work products: %w", ErrInvalidID)
		}
		afterID = after.ID
	}
	rows, err := q.Query(ctx, `SELECT `+workProductColumns+` FROM work_products
		WHERE company_id = $1 AND task_id = $2
		  AND ($4::uuid IS NULL OR (created_at, id) < ($3::timestamptz, $4::uuid))
		ORDER BY created_at DESC, id DESC LIMIT $5`, companyID, taskID, after.CreatedAt, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("task work products: %w", err)
	}
	return collectWorkProducts(rows)
}

const workProductColumns = `id, company_id, coalesce(task_id::text, ''), coalesce(run_id::text, ''),
	coalesce(execution_workspace_id::text, ''), kind, ref, url, path, metadata, created_at`

func collectWorkProducts(rows pgx.Rows) ([]WorkProduct, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkProduct, error) {
		var p WorkProduct
		err := r.Scan(&p.ID, &p.CompanyID, &p.TaskID, &p.RunID, &p.ExecutionWorkspaceID, &p.Kind, &p.Ref, &p.URL,
			&p.Path, &p.Metadata, &p.CreatedAt)
		return p, err
	})
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
	rows, err := q.Query(ctx, `SELECT id, company_id, coalesce(execution_workspace_id::text, ''), coalesce(run_id::text, ''),
			coalesce(task_id::text, ''), phase, command, cwd, status, exit_code,
			substring(log FROM greatest(length(log) - $6 + 1, 1)), log_bytes, log_sha256, log_truncated,
			error, started_at, finished_at
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

// AddWorkspaceWorkProduct records a work product that belongs to no run (a rescue commit made by
// a close), once per (workspace, kind, ref).
func AddWorkspaceWorkProduct(ctx context.Context, q Querier, p WorkProduct) error {
	meta := p.Metadata
	if meta == nil {
		meta = map[string]any{}
	}
	b, err := json.Marshal(meta)
	if err != nil {
		return fmt.Errorf("add work product: %w", err)
	}
	_, err = q.Exec(ctx, `INSERT INTO work_products (company_id, task_id, execution_workspace_id, kind, ref, url, path, metadata)
		SELECT $1, $2, $3, $4, $5, $6, $7, $8
		WHERE NOT EXISTS (SELECT 1 FROM work_products WHERE execution_workspace_id = $3 AND kind = $4 AND ref = $5)`,
		p.CompanyID, nullable(p.TaskID), nullable(p.ExecutionWorkspaceID), p.Kind, p.Ref, p.URL, p.Path, b)
	if err != nil {
		return fmt.Errorf("add work product: %w", err)
	}
	return nil
}

// TaskLabel is a task's key and title, for lists that name tasks by id.
type TaskLabel struct {
	Key   string
	Title string
}

// TaskLabels returns the key and title of each of a company's tasks among ids (unknown or foreign
// ids are left out).
func TaskLabels(ctx context.Context, q Querier, companyID string, ids []string) (map[string]TaskLabel, error) {
	out := map[string]TaskLabel{}
	var valid []string
	for _, id := range ids {
		if validUUID(id) {
			valid = append(valid, id)
		}
	}
	if len(valid) == 0 || !validUUID(companyID) {
		return out, nil
	}
	rows, err := q.Query(ctx, `SELECT id::text, key, title FROM tasks WHERE company_id = $1 AND id = ANY($2::uuid[])`, companyID, valid)
	if err != nil {
		return nil, fmt.Errorf("task labels: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var l TaskLabel
		if err := rows.Scan(&id, &l.Key, &l.Title); err != nil {
			return nil, fmt.Errorf("task labels: %w", err)
		}
		out[id] = l
	}
	return out, rows.Err()
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

// ExecutionWorkspaceByRef finds a company's workspace by its opaque ref (a realization that
// reused an existing worktree returns that worktree's ref).
func ExecutionWorkspaceByRef(ctx context.Context, q Querier, companyID, ref string) (ExecutionWorkspace, error) {
	return scanExecutionWorkspace(q.QueryRow(ctx, `SELECT `+executionWorkspaceColumns+`
		FROM execution_workspaces WHERE company_id = $1 AND ref = $2`, companyID, ref))
}

// TaskOpenWorkspace finds the newest ready workspace a task made with the given mode and strategy:
// a task's later runs continue in it rather than realizing another one.
func TaskOpenWorkspace(ctx context.Context, q Querier, companyID, taskID, mode, strategy string) (ExecutionWorkspace, error) {
	return scanExecutionWorkspace(q.QueryRow(ctx, `SELECT `+executionWorkspaceColumns+`
		FROM execution_workspaces WHERE company_id = $1 AND source_task_id = $2 AND mode = $3 AND strategy = $4
		  AND status = 'ready' ORDER BY created_at DESC, id DESC LIMIT 1`, companyID, taskID, mode, strategy))
}
