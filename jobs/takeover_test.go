package jobs

import (
	"context"
	"strings"
	"testing"
	"time"

	"berth/db"
	"berth/jobs/executing"
	"berth/jobs/internal/jobstest"
	"berth/jobs/nodes"
)

// TestTakeOverDeadNode: the job layer's side of a takeover (NodeSweep; the node's own side is
// tested in jobs/nodes). A dead node's live run ends failed/orphaned with the dead node's message
// (its dead executor's job cancelled, finalize waiting in the dead node's queue), its queued run
// too (finalize on the shared queue: it has no workspace), and its lease's cleanup is queued on
// the shared queue; the live node's run is untouched.
func TestTakeOverDeadNode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newSweepWorld(t)
	for _, id := range []string{"dead1", "live1"} {
		if err := db.RegisterNode(ctx, w.pool, db.NodeRegistration{ID: id, Kind: db.NodeWorker, Works: true}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.pool.Exec(ctx, `UPDATE nodes SET heartbeat_at = now() - interval '40 seconds' WHERE id = 'dead1'`); err != nil {
		t.Fatal(err)
	}
	deadRun := w.run(db.RunRunning, "dead1", time.Second)
	liveRun := w.run(db.RunRunning, "live1", time.Second)
	w.job(ExecuteRunArgs{RunID: deadRun}, "dead1@0a0b0c0d0e0f", time.Second)
	w.job(ExecuteRunArgs{RunID: liveRun}, "live1@0a0b0c0d0e0f", time.Second)
	queued := w.run(db.RunQueued, "dead1", time.Second) // placed on dead1, its provision waiting there
	w.job(ProvisionArgs{RunID: queued}, "", 0)
	dr := w.runRow(deadRun)
	lease, err := db.AcquireLease(ctx, w.pool, db.LeaseRequest{CompanyID: w.company, EnvironmentID: w.env,
		ExecutionWorkspaceID: dr.ExecutionWorkspaceID, RunID: deadRun, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}

	d := Deps{Pool: w.pool, Log: jobstest.Log(), NodeID: "live1", Executing: executing.New("live1")}
	nd := nodes.Deps{Pool: w.pool, Log: d.Log, NodeID: d.NodeID, Sweep: NodeSweep(d, w.ins)}
	n, err := nodes.TakeOver(ctx, nd, 30*time.Second)
	if err != nil || n != 1 {
		t.Fatalf("takeover: %d %v", n, err)
	}
	if r := w.runRow(deadRun); r.Status != db.RunFailed || r.ErrorCode != codeOrphaned || !strings.Contains(r.ErrorMessage, "dead1") {
		t.Errorf("dead node's run: %s %s %q", r.Status, r.ErrorCode, r.ErrorMessage)
	}
	if r := w.runRow(queued); r.Status != db.RunFailed || r.ErrorCode != codeOrphaned {
		t.Errorf("dead node's queued run: %s %s", r.Status, r.ErrorCode)
	}
	if c := w.count(`SELECT count(*) FROM river_job WHERE kind = 'finalize' AND queue = 'default' AND args->>'run_id' = $1`, queued); c != 1 {
		t.Errorf("finalize of a run without a workspace is not on the shared queue (%d)", c)
	}
	if r := w.runRow(liveRun); r.Status != db.RunRunning {
		t.Errorf("live node's run: %s", r.Status)
	}
	l, err := db.LeaseByID(ctx, w.pool, w.company, lease.ID)
	if err != nil || l.Status != "expired" || l.CleanupStatus != db.LeaseCleanupPending || l.Generation != lease.Generation+1 {
		t.Errorf("dead node's lease: %+v %v", l, err)
	}
	if c := w.count(`SELECT count(*) FROM river_job WHERE kind = 'cleanup_lease' AND queue = 'default' AND args->>'lease_id' = $1`, lease.ID); c != 1 {
		t.Errorf("cleanup jobs on the shared queue = %d", c)
	}
	if c := w.count(`SELECT count(*) FROM river_job WHERE kind = 'finalize' AND queue = 'node_dead1' AND args->>'run_id' = $1`, deadRun); c != 1 {
		t.Errorf("finalize jobs on the dead node's queue = %d", c)
	}
	if c := w.count(`SELECT count(*) FROM river_job WHERE kind = 'execute_run' AND (state = 'cancelled' OR metadata ? 'cancel_attempted_at')
		AND args->>'run_id' = $1`, deadRun); c != 1 {
		t.Errorf("the dead executor's job was not cancelled (%d)", c)
	}
	if c := w.count(`SELECT count(*) FROM audit_events WHERE action = 'run.orphaned' AND target_id = $1
		AND details->>'reason' = 'node_dead'`, deadRun); c != 1 {
		t.Errorf("orphan audit events with reason node_dead = %d", c)
	}
	// Once per life: nothing is enqueued twice.
	if n, err := nodes.TakeOver(ctx, nd, 30*time.Second); err != nil || n != 0 {
		t.Fatalf("second takeover: %d %v", n, err)
	}
	if c := w.count(`SELECT count(*) FROM river_job WHERE kind IN ('cleanup_lease', 'finalize')`); c != 3 {
		t.Errorf("cleanup and finalize jobs after a second takeover = %d, want 3", c)
	}
}
