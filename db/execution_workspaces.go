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
