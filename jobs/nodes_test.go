package jobs

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/db/dbtest"
	"berth/jobs/executing"
	"berth/jobs/internal/jobstest"
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

// TestTakeOverDeadNode: a node silent past dead-after is taken over once by a live node: its live
// run ends failed/orphaned (its dead executor's job cancelled, finalize waiting in the dead
// node's queue), its lease is expired at once and its cleanup queued on the shared queue, its
// running service is marked stopped; the live node's run is untouched. A heartbeat after that
// tells the dead node so, and registering again starts a new life.
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
	liveLease, err := db.AcquireLease(ctx, w.pool, db.LeaseRequest{CompanyID: w.company, EnvironmentID: w.env,
		ExecutionWorkspaceID: w.runRow(liveRun).ExecutionWorkspaceID, RunID: liveRun, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := db.EnsureRuntimeService(ctx, w.pool, w.company, dr.ExecutionWorkspaceID, "", db.ServiceDefinition{Name: "web",
		Command: "x", StopPolicy: "manual", Lifecycle: "ephemeral"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.MarkRuntimeServiceStarting(ctx, w.pool, svc.ID, db.ServiceStart{Port: 41999, NodeID: "dead1"}); err != nil {
		t.Fatal(err)
	}

	// The live node's heartbeat is its look for dead nodes: it sees dead1 by 30 s, not by a minute.
	if seen, err := db.HeartbeatNode(ctx, w.pool, "live1", time.Minute); err != nil || seen {
		t.Fatalf("heartbeat saw a dead node by a minute's measure: %v %v", seen, err)
	}
	if seen, err := db.HeartbeatNode(ctx, w.pool, "live1", 30*time.Second); err != nil || !seen {
		t.Fatalf("heartbeat did not see the node silent for 40 s: %v %v", seen, err)
	}

	d := Deps{Pool: w.pool, Log: jobstest.Log(), NodeID: "live1", Executing: executing.New("live1")}
	// Not yet dead by a minute's measure.
	if n, err := TakeOverDeadNodes(ctx, d, w.ins, time.Minute); err != nil || n != 0 {
		t.Fatalf("takeover before dead-after: %d %v", n, err)
	}
	n, err := TakeOverDeadNodes(ctx, d, w.ins, 30*time.Second)
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
	if l, _ := db.LeaseByID(ctx, w.pool, w.company, liveLease.ID); !l.Live() {
		t.Errorf("live node's lease: %s", l.Status)
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
	if s, _ := db.RuntimeServiceByID(ctx, w.pool, w.company, svc.ID); s.Status != db.ServiceStopped || s.StopReason != "node_dead" {
		t.Errorf("dead node's service: %s %q", s.Status, s.StopReason)
	}
	nd, err := db.NodeByID(ctx, w.pool, "dead1", 30*time.Second)
	if err != nil || nd.Alive || nd.TakenOverAt == nil || nd.Holds.Runs != 0 || nd.Holds.Leases != 0 || nd.Holds.Services != 0 {
		t.Errorf("dead node row: %+v %v", nd, err)
	}
	if c := w.count(`SELECT count(*) FROM audit_events WHERE action = 'node.taken_over' AND target_id = 'dead1'`); c != 1 {
		t.Errorf("takeover audit events = %d", c)
	}
	// Once per life.
	if n, err := TakeOverDeadNodes(ctx, d, w.ins, 30*time.Second); err != nil || n != 0 {
		t.Fatalf("second takeover: %d %v", n, err)
	}
	if seen, err := db.HeartbeatNode(ctx, w.pool, "live1", 30*time.Second); err != nil || seen {
		t.Fatalf("heartbeat still sees the node taken over: %v %v", seen, err)
	}
	if _, err := db.HeartbeatNode(ctx, w.pool, "dead1", 30*time.Second); err != db.ErrNodeTakenOver {
		t.Fatalf("heartbeat of a taken-over node: %v", err)
	}
	if err := db.RegisterNode(ctx, w.pool, db.NodeRegistration{ID: "dead1", Kind: db.NodeWorker, Works: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.HeartbeatNode(ctx, w.pool, "dead1", 30*time.Second); err != nil {
		t.Fatalf("heartbeat after registering again: %v", err)
	}
	if alive, _ := db.NodeAlive(ctx, w.pool, "dead1", 30*time.Second); !alive {
		t.Error("a registered node is not alive")
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

// TestNodeJudgesOnlyWhenItsOwnHeartbeatHolds: after a database outage every node's heartbeat is
// old, so a node whose own heartbeat failed may declare no one dead until its heartbeats have
// held for a whole DeadAfter again (the others had that long to beat). Real PostgreSQL: the
// outage is a pool whose connections are refused.
func TestNodeJudgesOnlyWhenItsOwnHeartbeatHolds(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	timing := NodeTiming{Heartbeat: time.Second, DeadAfter: 30 * time.Second, Takeover: time.Second}
	k := NewNodeKeeper(Deps{Pool: pool}, db.NodeRegistration{ID: "judge", Kind: "worker", Version: "test"}, timing, nil)
	if err := k.Register(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if k.mayJudge(now) {
		t.Fatal("a node judged others at once after it registered")
	}
	if !k.mayJudge(now.Add(timing.DeadAfter)) {
		t.Fatal("a node that beat for DeadAfter may not judge")
	}
	cfg := pool.Config().Copy()
	cfg.ConnConfig.Port = 1 // nothing listens: every heartbeat fails
	down, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	k.deps.Pool = down
	k.heartbeat(ctx)
	if k.mayJudge(now.Add(time.Hour)) {
		t.Fatal("a node whose heartbeat failed still judges others")
	}
	k.deps.Pool = pool
	k.heartbeat(ctx)
	back := time.Now()
	if k.mayJudge(back.Add(timing.DeadAfter/2)) || !k.mayJudge(back.Add(timing.DeadAfter)) {
		t.Fatal("after the outage the node must wait a whole DeadAfter of good heartbeats")
	}
}
