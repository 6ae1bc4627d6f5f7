package jobs

import (
	"context"
	"strings"
	"testing"
	"time"

	"berth/db"
)

// TestNodeQueue: a node id that is a River queue name keeps its name; others (capitals, dots,
// too long) get a stable hashed name; no node is the shared queue.
func TestNodeQueue(t *testing.T) {
	t.Parallel()
	if q := NodeQueue("w1"); q != "node_w1" {
		t.Errorf("NodeQueue(w1) = %q", q)
	}
	if q := NodeQueue(""); q != "default" {
		t.Errorf("NodeQueue('') = %q", q)
	}
	for _, id := range []string{"Host.Example", "a.b", strings.Repeat("x", 64)} {
		q := NodeQueue(id)
		if !strings.HasPrefix(q, "node_h") || len(q) > 64 || !queueName.MatchString(q) || q != NodeQueue(id) {
			t.Errorf("NodeQueue(%q) = %q", id, q)
		}
	}
	if NodeQueue("a.b") == NodeQueue("A.b") {
		t.Error("two ids share a queue")
	}
}

// TestPlaceFollowsTheWorkspace: finalize goes to the run's node, a service's control to its
// workspace's node, a new run with a continuing workspace to that workspace's node (and the run
// is placed there), and a continuing workspace whose node was taken over refuses the run.
func TestPlaceFollowsTheWorkspace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newSweepWorld(t)
	run := w.run(db.RunRunning, "w1", time.Second)
	r := w.runRow(run)
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if n, err := Place(ctx, tx, FinalizeArgs{RunID: run}); err != nil || n != "w1" {
		t.Errorf("finalize: %q %v", n, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE execution_workspaces SET node_id = 'w2' WHERE id = $1`, r.ExecutionWorkspaceID); err != nil {
		t.Fatal(err)
	}
	if n, err := Place(ctx, tx, CloseWorkspaceArgs{WorkspaceID: r.ExecutionWorkspaceID}); err != nil || n != "w2" {
		t.Errorf("close: %q %v", n, err)
	}
	if n, err := Place(ctx, tx, ProbeEnvironmentArgs{}); err != nil || n != "" {
		t.Errorf("probe: %q %v", n, err)
	}

	// A queued run of a task bound to that workspace (plan.reuse_workspace_id).
	var queued string
	if err := tx.QueryRow(ctx, `INSERT INTO runs (company_id, task_id, environment_id, status, command, plan)
		VALUES ($1, $2, $3, 'queued', 'true', jsonb_build_object('mode', 'isolated', 'strategy', 'copy',
			'reuse_workspace_id', $4::text)) RETURNING id`, w.company, w.task, w.env, r.ExecutionWorkspaceID).Scan(&queued); err != nil {
		t.Fatal(err)
	}
	if n, err := Place(ctx, tx, ProvisionArgs{RunID: queued}); err != nil || n != "w2" {
		t.Errorf("provision: %q %v", n, err)
	}
	if got, _ := db.RunNode(ctx, tx, queued); got != "w2" {
		t.Errorf("the queued run was not placed: %q", got)
	}
	if err := db.RegisterNode(ctx, tx, db.NodeRegistration{ID: "w2", Kind: db.NodeWorker}); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE nodes SET taken_over_at = now() WHERE id = 'w2'`); err != nil {
		t.Fatal(err)
	}
	_, err = Place(ctx, tx, ProvisionArgs{RunID: queued})
	if nu, ok := err.(*NodeUnavailableError); !ok || nu.Node != "w2" {
		t.Errorf("provision on a taken-over node: %v", err)
	}
}
