package db

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// LocalProjectWorkspace is a project workspace whose source is a directory on the Berth host: a
// `directory` source or a `git` source given as an absolute local path (never a URL, which has
// no local tree to read). Dir is an absolute host path and must never reach a response.
type LocalProjectWorkspace struct {
	ID         string
	Name       string
	SourceType string // git | directory
	IsPrimary  bool
	Dir        string
}

// TaskLocalProjectWorkspaces lists the local project workspaces of a task's project, primary first
// and then by name. A task of another company, or a malformed id, is ErrNotFound; a task whose
// project has no local workspace yields an empty list.
func TaskLocalProjectWorkspaces(ctx context.Context, q Querier, companyID, taskID string) ([]LocalProjectWorkspace, error) {
	if !validUUID(companyID) || !validUUID(taskID) {
		return nil, ErrNotFound
	}
	var exists bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM tasks WHERE company_id = $1 AND id = $2)`,
		companyID, taskID).Scan(&exists); err != nil {
		return nil, fmt.Errorf("local workspaces of task %s: %w", taskID, err)
	}
	if !exists {
		return nil, fmt.Errorf("local workspaces of task %s: %w", taskID, ErrNotFound)
	}
	rows, err := q.Query(ctx, `SELECT w.id, w.name, w.source_type, w.is_primary, w.source
		FROM tasks t
		JOIN project_workspaces w ON w.company_id = t.company_id AND w.project_id = t.project_id
		WHERE t.company_id = $1 AND t.id = $2
		  AND w.source_type IN ('directory', 'git') AND w.source LIKE '/%'
		ORDER BY w.is_primary DESC, w.name, w.id`, companyID, taskID)
	if err != nil {
		return nil, fmt.Errorf("local workspaces of task %s: %w", taskID, err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (LocalProjectWorkspace, error) {
		var w LocalProjectWorkspace
		err := r.Scan(&w.ID, &w.Name, &w.SourceType, &w.IsPrimary, &w.Dir)
		return w, err
	})
	if err != nil {
		return nil, fmt.Errorf("local workspaces of task %s: %w", taskID, err)
	}
	return list, nil
}

// TaskReadableExecutionWorkspaces lists the execution workspaces whose files a task's readers may
// browse: ready workspaces the task made or is bound to, newest first (at most 5). Closed
// workspaces are gone from disk, so they are not listed.
func TaskReadableExecutionWorkspaces(ctx context.Context, q Querier, companyID, taskID string) ([]ExecutionWorkspace, error) {
	if !validUUID(companyID) || !validUUID(taskID) {
		return nil, ErrNotFound
	}
	rows, err := q.Query(ctx, `SELECT `+executionWorkspaceColumns+` FROM execution_workspaces
		WHERE company_id = $1 AND status = 'ready'
		  AND (source_task_id = $2 OR id IN (SELECT execution_workspace_id FROM task_workspace_bindings WHERE task_id = $2))
		ORDER BY created_at DESC, id DESC LIMIT 5`, companyID, taskID)
	if err != nil {
		return nil, fmt.Errorf("readable workspaces of task %s: %w", taskID, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ExecutionWorkspace, error) { return scanExecutionWorkspace(r) })
}
