package db

// Placement reads: which node holds the object a job works on (docs/scaling.md "Where jobs
// run"). An empty node id means no node holds it yet, and the job goes to the shared queue.

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// placementNode runs a one-value node query; a missing row is "" (the job will find it gone).
func placementNode(ctx context.Context, q Querier, what, sql string, arg string) (string, error) {
	if !validUUID(arg) {
		return "", nil
	}
	var node string
	err := q.QueryRow(ctx, sql, arg).Scan(&node)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("node of %s %s: %w", what, arg, err)
	}
	return node, nil
}

// RunNode is the node that prepared (or was given) run id.
func RunNode(ctx context.Context, q Querier, id string) (string, error) {
	return placementNode(ctx, q, "run", `SELECT node_id FROM runs WHERE id = $1`, id)
}

// RunFinalizeNode is where run id's finalize must run: its node when it has a workspace there,
// else any node (nothing of it is on a disk).
func RunFinalizeNode(ctx context.Context, q Querier, id string) (string, error) {
	return placementNode(ctx, q, "run", `SELECT CASE WHEN execution_workspace_id IS NULL THEN '' ELSE node_id END
		FROM runs WHERE id = $1`, id)
}

// AttemptGroupNode is where attempt group id's decision moves its refs: the node holding the
// chosen attempt's workspace (for a discard, the first open attempt's), which can detach a
// worktree it holds; "" when none holds one.
func AttemptGroupNode(ctx context.Context, q Querier, id string) (string, error) {
	return placementNode(ctx, q, "attempt group", `SELECT coalesce((SELECT w.node_id FROM runs r
			JOIN execution_workspaces w ON w.id = r.execution_workspace_id
			WHERE r.attempt_group_id = g.id AND w.status <> 'closed'
			ORDER BY w.id = g.selected_workspace_id DESC, r.attempt_n LIMIT 1), '')
		FROM attempt_groups g WHERE g.id = $1`, id)
}

// WorkspaceNode is the node whose disk holds execution workspace id.
func WorkspaceNode(ctx context.Context, q Querier, id string) (string, error) {
	return placementNode(ctx, q, "execution workspace", `SELECT node_id FROM execution_workspaces WHERE id = $1`, id)
}

// ServiceNode is the node that runs (or would run) runtime service id: its workspace's node, else
// the node that last ran it.
func ServiceNode(ctx context.Context, q Querier, id string) (string, error) {
	return placementNode(ctx, q, "runtime service", `SELECT coalesce(nullif(w.node_id, ''), s.node_id)
		FROM runtime_services s JOIN execution_workspaces w ON w.id = s.execution_workspace_id WHERE s.id = $1`, id)
}

// LeaseCleanupNode is where lease id's cleanup must run to reach its run's processes: its run's
// node (else its workspace's) unless that node's current life has been taken over; "" (any node)
// once it has, since its processes died with it.
func LeaseCleanupNode(ctx context.Context, q Querier, id string) (string, error) {
	return placementNode(ctx, q, "lease", `SELECT CASE WHEN n.taken_over_at IS NULL THEN h.node ELSE '' END
		FROM environment_leases l
		LEFT JOIN runs r ON r.id = l.run_id
		LEFT JOIN execution_workspaces w ON w.id = l.execution_workspace_id
		CROSS JOIN LATERAL (SELECT coalesce(nullif(r.node_id, ''), w.node_id, '') AS node) h
		LEFT JOIN nodes n ON n.id = h.node
		WHERE l.id = $1`, id)
}

// TaskHomeNode is the node holding the workspace a new run of the task will continue in: the
// workspace it is bound to, else its open workspace of the planned mode and strategy (as
// provision chooses, jobs/provision.go). "" when the run will make a new workspace.
func TaskHomeNode(ctx context.Context, q Querier, companyID, taskID, reuseID, mode, strategy string) (string, error) {
	if reuseID != "" {
		return WorkspaceNode(ctx, q, reuseID)
	}
	if strategy == "" {
		return "", nil
	}
	ws, err := TaskOpenWorkspace(ctx, q, companyID, taskID, mode, strategy)
	if errors.Is(err, ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return ws.NodeID, nil
}

// NodeTakenOver reports whether node id's current life was taken over: what it held is settled,
// and work for it cannot wait in its queue. A node without a row (a process from before the
// registry) is not.
func NodeTakenOver(ctx context.Context, q Querier, id string) (bool, error) {
	var taken bool
	err := q.QueryRow(ctx, `SELECT taken_over_at IS NOT NULL FROM nodes WHERE id = $1`, id).Scan(&taken)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("node %s: %w", id, err)
	}
	return taken, nil
}

// SetRunNode places a queued run on node (its provision waits in that node's queue).
func SetRunNode(ctx context.Context, q Querier, id, node string) error {
	if _, err := q.Exec(ctx, `UPDATE runs SET node_id = $2 WHERE id = $1 AND status = 'queued'`, id, node); err != nil {
		return fmt.Errorf("place run %s: %w", id, err)
	}
	return nil
}

// SetupSessionNode is the node holding setup session id's shell ("" when unknown).
func SetupSessionNode(ctx context.Context, q Querier, id string) (string, error) {
	return placementNode(ctx, q, "setup session", `SELECT node_id FROM image_setup_sessions WHERE id = $1`, id)
}

// SetupSessionWorkNode is the node holding setup session id's scratch layer when that node works
// jobs (so its capture can run there); "" otherwise (any node: a web-only node runs no jobs).
func SetupSessionWorkNode(ctx context.Context, q Querier, id string) (string, error) {
	return placementNode(ctx, q, "setup session", `SELECT coalesce(n.id, '') FROM image_setup_sessions s
		LEFT JOIN nodes n ON n.id = s.node_id AND n.works AND n.taken_over_at IS NULL WHERE s.id = $1`, id)
}
