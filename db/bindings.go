package db

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Binding is a task's workspace binding: the mode it asks for, the execution workspace it
// selects, and how many changes were accepted. A task that was never bound has Revision 0 and
// Mode "inherit"; a change applies at the task's next run admission, never mid-run.
type Binding struct {
	TaskID               string
	Mode                 string
	ExecutionWorkspaceID string // "" when no workspace is selected
	Revision             int64
	RequestKey           string    // "" when never bound
	UpdatedAt            time.Time // zero when never bound
}

// NeverBound is the binding of a task that was never bound: revision 0, mode inherit, no workspace.
func NeverBound(taskID string) Binding { return Binding{TaskID: taskID, Mode: "inherit"} }

// TaskBinding returns a task's binding, or the never-bound binding (revision 0) when it has none.
func TaskBinding(ctx context.Context, q Querier, companyID, taskID string) (Binding, error) {
	b := Binding{TaskID: taskID}
	err := q.QueryRow(ctx, `SELECT mode, coalesce(execution_workspace_id::text, ''), revision, request_key, updated_at
		FROM task_workspace_bindings WHERE company_id = $1 AND task_id = $2`, companyID, taskID).
		Scan(&b.Mode, &b.ExecutionWorkspaceID, &b.Revision, &b.RequestKey, &b.UpdatedAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return NeverBound(taskID), nil
	case err != nil:
		return Binding{}, fmt.Errorf("task binding %s: %w", taskID, err)
	}
	return b, nil
}

// SaveBinding writes a task's binding with the given revision, remembering the request key and
// body hash of the change. The caller holds the task's row lock and has checked the revision.
func SaveBinding(ctx context.Context, q Querier, companyID, userID string, b Binding, hash []byte) (Binding, error) {
	err := q.QueryRow(ctx, `INSERT INTO task_workspace_bindings
			(task_id, company_id, execution_workspace_id, mode, revision, request_key, request_hash, updated_by, updated_at)
		VALUES ($1, $2, $3::uuid, $4, $5, $6, $7, $8::uuid, now())
		ON CONFLICT (task_id) DO UPDATE SET execution_workspace_id = EXCLUDED.execution_workspace_id,
			mode = EXCLUDED.mode, revision = EXCLUDED.revision, request_key = EXCLUDED.request_key,
			request_hash = EXCLUDED.request_hash, updated_by = EXCLUDED.updated_by, updated_at = EXCLUDED.updated_at
		WHERE task_workspace_bindings.company_id = EXCLUDED.company_id
		RETURNING updated_at`,
		b.TaskID, companyID, nullable(b.ExecutionWorkspaceID), b.Mode, b.Revision, b.RequestKey, hash,
		nullable(userID)).Scan(&b.UpdatedAt)
	if err != nil {
		return Binding{}, fmt.Errorf("save binding %s: %w", b.TaskID, notFound(err))
	}
	return b, nil
}

// BindingRequest is an accepted binding change remembered by its request key, so a retry gets
// the same answer.
type BindingRequest struct {
	Hash     []byte
	Response []byte // the JSON answer given the first time
}

// BindingRequestByKey finds an accepted change of a task by its request key; ErrNotFound when
// the key was never used for this task.
func BindingRequestByKey(ctx context.Context, q Querier, companyID, taskID, key string) (BindingRequest, error) {
	var r BindingRequest
	err := q.QueryRow(ctx, `SELECT r.request_hash, r.response FROM task_binding_requests r
		JOIN tasks t ON t.id = r.task_id AND t.company_id = $1
		WHERE r.task_id = $2 AND r.request_key = $3`, companyID, taskID, key).Scan(&r.Hash, &r.Response)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return BindingRequest{}, ErrNotFound
	case err != nil:
		return BindingRequest{}, fmt.Errorf("binding request %s: %w", taskID, err)
	}
	return r, nil
}

// SaveBindingRequest remembers an accepted change's request key, body hash and answer.
func SaveBindingRequest(ctx context.Context, q Querier, taskID, key string, r BindingRequest) error {
	_, err := q.Exec(ctx, `INSERT INTO task_binding_requests (task_id, request_key, request_hash, response)
		VALUES ($1, $2, $3, $4)`, taskID, key, r.Hash, r.Response)
	if err != nil {
		return fmt.Errorf("save binding request %s: %w", taskID, err)
	}
	return nil
}

// BindingWorkspace is an execution workspace as the binding sees it: enough to decide whether
// a task may select it, and to label it.
type BindingWorkspace struct {
	ID        string
	ProjectID string
	Ref       string
	Mode      string
	Strategy  string
	Trust     string
	Status    string
	Branch    string
	Reusable  bool
	CreatedAt time.Time
}

// UnselectableStatuses are the execution workspace statuses a binding may not select.
var UnselectableStatuses = []string{"closed", "closing", "cleanup_failed", "failed"}

const bindingWorkspaceSelect = `SELECT id, project_id, ref, mode, strategy, trust, status, branch, reusable, created_at
	FROM execution_workspaces`

func scanBindingWorkspace(row pgx.Row) (BindingWorkspace, error) {
	var w BindingWorkspace
	err := row.Scan(&w.ID, &w.ProjectID, &w.Ref, &w.Mode, &w.Strategy, &w.Trust, &w.Status, &w.Branch,
		&w.Reusable, &w.CreatedAt)
	return w, notFound(err)
}

// BindingWorkspaceByID loads an execution workspace of the company; a malformed id and another
// company's workspace are ErrNotFound.
func BindingWorkspaceByID(ctx context.Context, q Querier, companyID, id string) (BindingWorkspace, error) {
	if !validUUID(id) {
		return BindingWorkspace{}, ErrNotFound
	}
	w, err := scanBindingWorkspace(q.QueryRow(ctx, bindingWorkspaceSelect+` WHERE company_id = $1 AND id = $2`,
		companyID, id))
	if err != nil {
		return BindingWorkspace{}, fmt.Errorf("binding workspace %s: %w", id, err)
	}
	return w, nil
}

// SelectableWorkspaces lists, newest first, the execution workspaces a task of the project with
// the given trust may select: same project, same trust, not closed, closing or failed.
func SelectableWorkspaces(ctx context.Context, q Querier, companyID, projectID, trust string, limit int) ([]BindingWorkspace, error) {
	rows, err := q.Query(ctx, bindingWorkspaceSelect+` WHERE company_id = $1 AND project_id = $2 AND trust = $3
		AND status <> ALL ($4::text[]) ORDER BY created_at DESC, id LIMIT $5`,
		companyID, projectID, trust, UnselectableStatuses, limit)
	if err != nil {
		return nil, fmt.Errorf("selectable workspaces: %w", err)
	}
	ws, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BindingWorkspace, error) { return scanBindingWorkspace(r) })
	if err != nil {
		return nil, fmt.Errorf("selectable workspaces: %w", err)
	}
	return ws, nil
}
