package db

import (
	"context"
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
	// NodeID is the node whose disk holds the workspace (jobs on it go to that node's queue).
	NodeID string
}

const executionWorkspaceColumns = `id, company_id, project_id, coalesce(project_workspace_id::text, ''),
	coalesce(source_task_id::text, ''), mode, strategy, trust, status, finalize_state, generation, ref, cwd,
	base_ref, base_commit, branch, base_tree_digest, reusable, plan, closed_at, cleanup_reason, created_at, updated_at, node_id`

func scanExecutionWorkspace(row pgx.Row) (ExecutionWorkspace, error) {
	var w ExecutionWorkspace
	err := row.Scan(&w.ID, &w.CompanyID, &w.ProjectID, &w.ProjectWorkspaceID, &w.SourceTaskID, &w.Mode, &w.Strategy,
		&w.Trust, &w.Status, &w.FinalizeState, &w.Generation, &w.Ref, &w.Cwd, &w.BaseRef, &w.BaseCommit, &w.Branch,
		&w.BaseTreeDigest, &w.Reusable, &w.Plan, &w.ClosedAt, &w.CleanupReason, &w.CreatedAt, &w.UpdatedAt, &w.NodeID)
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
	NodeID             string // the node that realizes it on its disk
}

// CreateExecutionWorkspace records a workspace in status preparing.
func CreateExecutionWorkspace(ctx context.Context, q Querier, n NewExecutionWorkspace) (ExecutionWorkspace, error) {
	plan := n.Plan
	if len(plan) == 0 {
		plan = []byte("{}")
	}
	w, err := scanExecutionWorkspace(q.QueryRow(ctx, `INSERT INTO execution_workspaces (company_id, project_id,
			project_workspace_id, source_task_id, mode, strategy, trust, ref, plan, node_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING `+executionWorkspaceColumns,
		n.CompanyID, n.ProjectID, nullable(n.ProjectWorkspaceID), nullable(n.SourceTaskID), n.Mode, n.Strategy, n.Trust, n.Ref, plan,
		n.NodeID))
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

// LockExecutionWorkspace reads a company's workspace and locks its row for the rest of tx, so
// leases (AcquireLease share-locks the row) and other closes or reopens wait for the decision.
func LockExecutionWorkspace(ctx context.Context, tx pgx.Tx, companyID, id string) (ExecutionWorkspace, error) {
	if !validUUID(id) || !validUUID(companyID) {
		return ExecutionWorkspace{}, ErrNotFound
	}
	return scanExecutionWorkspace(tx.QueryRow(ctx, `SELECT `+executionWorkspaceColumns+`
		FROM execution_workspaces WHERE company_id = $1 AND id = $2 FOR UPDATE`, companyID, id))
}

// Close and reopen (docs/runs.md "Continuing, closing, reopening"): each transition is fenced by
// the generation the writer holds.

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

// ExecutionWorkspaceByRef finds a company's workspace by its opaque ref (a realization that
// reused an existing worktree returns that worktree's ref).
func ExecutionWorkspaceByRef(ctx context.Context, q Querier, companyID, ref string) (ExecutionWorkspace, error) {
	return scanExecutionWorkspace(q.QueryRow(ctx, `SELECT `+executionWorkspaceColumns+`
		FROM execution_workspaces WHERE company_id = $1 AND ref = $2`, companyID, ref))
}

// TaskOpenWorkspace finds the newest ready, unsealed workspace a task made with the given mode and
// strategy: a task's later runs continue in it rather than realizing another one.
func TaskOpenWorkspace(ctx context.Context, q Querier, companyID, taskID, mode, strategy string) (ExecutionWorkspace, error) {
	return scanExecutionWorkspace(q.QueryRow(ctx, `SELECT `+executionWorkspaceColumns+`
		FROM execution_workspaces WHERE company_id = $1 AND source_task_id = $2 AND mode = $3 AND strategy = $4
		  AND status = 'ready' AND sealed_at IS NULL ORDER BY created_at DESC, id DESC LIMIT 1`, companyID, taskID, mode, strategy))
}

// TaskClosingWorkspace reports whether a task has a workspace of the given mode and strategy that
// is closing: a new one must wait for it (its directory and branch are still in use).
func TaskClosingWorkspace(ctx context.Context, q Querier, companyID, taskID, mode, strategy string) (bool, error) {
	var closing bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM execution_workspaces
		WHERE company_id = $1 AND source_task_id = $2 AND mode = $3 AND strategy = $4 AND status = 'closing')`,
		companyID, taskID, mode, strategy).Scan(&closing); err != nil {
		return false, fmt.Errorf("task closing workspace: %w", err)
	}
	return closing, nil
}

// UnrecordedRefs returns, sorted, the refs among refs that no execution workspace row names: a
// node's managed directories that Berth holds no record of (reported, never deleted).
func UnrecordedRefs(ctx context.Context, q Querier, refs []string) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT u.ref FROM unnest($1::text[]) AS u(ref)
		WHERE NOT EXISTS (SELECT 1 FROM execution_workspaces w WHERE w.ref = u.ref) ORDER BY u.ref`, refs)
	if err != nil {
		return nil, fmt.Errorf("unrecorded refs: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("unrecorded refs: %w", err)
	}
	return out, nil
}

// BranchOpen reports whether an open execution workspace of the company has branch checked out.
func BranchOpen(ctx context.Context, q Querier, companyID, branch string) (bool, error) {
	var open bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM execution_workspaces WHERE company_id = $1 AND branch = $2
		AND status NOT IN ('closed', 'failed'))`, companyID, branch).Scan(&open)
	return open, err
}
