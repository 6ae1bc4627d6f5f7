package nodes

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/db/dbtest"
	"berth/jobs/internal/jobstest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// fakeSweep records what a takeover asks of the job layer: it offers the candidates it is given
// and ends each one it is asked to, and records the leases whose cleanup it was asked to enqueue.
type fakeSweep struct {
	mu       sync.Mutex
	cands    []db.OrphanCandidate
	orphaned map[string]string // run id → reason
	cleaned  []string          // lease ids
	outside  bool              // a cleanup was asked for outside a transaction
}

func (f *fakeSweep) Candidates(context.Context) ([]db.OrphanCandidate, error) { return f.cands, nil }

func (f *fakeSweep) Orphan(_ context.Context, _ *slog.Logger, c db.OrphanCandidate, reason string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, done := f.orphaned[c.ID]; done {
		return false, nil
	}
	f.orphaned[c.ID] = reason
	return true, nil
}

func (f *fakeSweep) CleanLease(_ context.Context, tx pgx.Tx, l db.Lease) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.outside = f.outside || tx == nil
	f.cleaned = append(f.cleaned, l.ID)
	return nil
}

// world is a company with a local environment, a project and a user, to hang nodes' holdings on.
type world struct {
	t                     *testing.T
	pool                  *pgxpool.Pool
	company, env, project string
	user                  string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{t: t, pool: dbtest.New(t)}
	w.company = jobstest.Company(t, w.pool)
	w.env = jobstest.LocalEnvironment(t, w.pool, w.company)
	w.project = jobstest.Project(t, w.pool, w.company, db.ExecutionPolicy{DefaultMode: "isolated", EnvironmentID: w.env,
		Strategy: "copy"})
	u, err := db.CreateUser(context.Background(), w.pool, "board@example.com", "x", false)
	if err != nil {
		t.Fatal(err)
	}
	w.user = u.ID
	return w
}

// holdings is a running run of node in a workspace of its own, with a live lease and a running
// service.
func (w *world) holdings(node string) (run, lease, service string) {
	t := w.t
	t.Helper()
	ctx := context.Background()
	task, err := db.CreateTask(ctx, w.pool, w.company, w.project, w.user, db.TaskFields{Title: "T", Command: "true",
		Trust: "standard", WorkspaceMode: "inherit"})
	if err != nil {
		t.Fatal(err)
	}
	ws, err := db.CreateExecutionWorkspace(ctx, w.pool, db.NewExecutionWorkspace{CompanyID: w.company, ProjectID: w.project,
		SourceTaskID: task.ID, Mode: "isolated", Strategy: "copy", Trust: "standard",
		Ref: "ws-" + strings.ReplaceAll(jobstest.UUID(), "-", "")})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.pool.QueryRow(ctx, `INSERT INTO runs (company_id, task_id, environment_id, execution_workspace_id, status,
			command, node_id, heartbeat_at) VALUES ($1, $2, $3, $4, 'running', 'true', $5, now()) RETURNING id`,
		w.company, task.ID, w.env, ws.ID, node).Scan(&run); err != nil {
		t.Fatal(err)
	}
	l, err := db.AcquireLease(ctx, w.pool, db.LeaseRequest{CompanyID: w.company, EnvironmentID: w.env,
		ExecutionWorkspaceID: ws.ID, RunID: run, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := db.EnsureRuntimeService(ctx, w.pool, w.company, ws.ID, "", db.ServiceDefinition{Name: "web",
		Command: "x", StopPolicy: "manual", Lifecycle: "ephemeral"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.MarkRuntimeServiceStarting(ctx, w.pool, svc.ID, db.ServiceStart{Port: 41999, NodeID: node}); err != nil {
		t.Fatal(err)
	}
	return run, l.ID, svc.ID
}

// TestTakeOverDeadNode: a node silent past dead-after is taken over once by a live node: its
// runs (and only its) are handed to the sweep to end with reason node_dead, its lease is expired
// at once with its cleanup enqueued in the takeover's transaction, its running service is marked
// stopped, the node is marked and audited; the live node keeps everything. A heartbeat after that
// tells the dead node so, and registering again starts a new life.
func TestTakeOverDeadNode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t)
	pool := w.pool
	for _, id := range []string{"dead1", "live1"} {
		if err := db.RegisterNode(ctx, pool, db.NodeRegistration{ID: id, Kind: db.NodeWorker, Works: true}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE nodes SET heartbeat_at = now() - interval '40 seconds' WHERE id = 'dead1'`); err != nil {
		t.Fatal(err)
	}
	deadRun, deadLease, deadSvc := w.holdings("dead1")
	liveRun, liveLease, liveSvc := w.holdings("live1")
	sweep := &fakeSweep{orphaned: map[string]string{}, cands: []db.OrphanCandidate{
		{ID: deadRun, NodeID: "dead1", Status: db.RunRunning}, {ID: liveRun, NodeID: "live1", Status: db.RunRunning}}}
	d := Deps{Pool: pool, Log: jobstest.Log(), NodeID: "live1", Sweep: sweep}

	// The live node's heartbeat is its look for dead nodes: it sees dead1 by 30 s, not by a minute.
	if hb, err := db.HeartbeatNode(ctx, pool, "live1", time.Minute, 0); err != nil || hb.OthersDead {
		t.Fatalf("heartbeat saw a dead node by a minute's measure: %v %v", hb.OthersDead, err)
	}
	if hb, err := db.HeartbeatNode(ctx, pool, "live1", 30*time.Second, 0); err != nil || !hb.OthersDead {
		t.Fatalf("heartbeat did not see the node silent for 40 s: %v %v", hb.OthersDead, err)
	}
	// Not yet dead by a minute's measure.
	if n, err := TakeOver(ctx, d, time.Minute); err != nil || n != 0 || len(sweep.orphaned) != 0 {
		t.Fatalf("takeover before dead-after: %d %v, orphaned %v", n, err, sweep.orphaned)
	}
	n, err := TakeOver(ctx, d, 30*time.Second)
	if err != nil || n != 1 {
		t.Fatalf("takeover: %d %v", n, err)
	}
	if len(sweep.orphaned) != 1 || sweep.orphaned[deadRun] != ReasonDead {
		t.Errorf("runs handed to the sweep: %v, want the dead node's with %q", sweep.orphaned, ReasonDead)
	}
	if !slices.Equal(sweep.cleaned, []string{deadLease}) || sweep.outside {
		t.Errorf("leases cleaned %v (outside a transaction: %v), want %s", sweep.cleaned, sweep.outside, deadLease)
	}
	l, err := db.LeaseByID(ctx, pool, w.company, deadLease)
	if err != nil || l.Status != "expired" || l.CleanupStatus != db.LeaseCleanupPending {
		t.Errorf("dead node's lease: %+v %v", l, err)
	}
	if l, _ := db.LeaseByID(ctx, pool, w.company, liveLease); !l.Live() {
		t.Errorf("live node's lease: %s", l.Status)
	}
	if s, _ := db.RuntimeServiceByID(ctx, pool, w.company, deadSvc); s.Status != db.ServiceStopped || s.StopReason != ReasonDead {
		t.Errorf("dead node's service: %s %q", s.Status, s.StopReason)
	}
	if s, _ := db.RuntimeServiceByID(ctx, pool, w.company, liveSvc); s.Status == db.ServiceStopped {
		t.Errorf("live node's service: %s", s.Status)
	}
	nd, err := db.NodeByID(ctx, pool, "dead1", 30*time.Second)
	if err != nil || nd.Alive || nd.TakenOverAt == nil || nd.Holds.Leases != 0 || nd.Holds.Services != 0 {
		t.Errorf("dead node row: %+v %v", nd, err)
	}
	var audits int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM audit_events WHERE (action = 'node.taken_over' AND target_id = 'dead1')
		OR (action = 'lease.expired' AND target_id = $1)`, deadLease).Scan(&audits); err != nil || audits != 2 {
		t.Errorf("takeover and lease audit events = %d %v, want 2", audits, err)
	}
	// Once per life.
	if n, err := TakeOver(ctx, d, 30*time.Second); err != nil || n != 0 || len(sweep.cleaned) != 1 {
		t.Fatalf("second takeover: %d %v, cleaned %v", n, err, sweep.cleaned)
	}
	if hb, err := db.HeartbeatNode(ctx, pool, "live1", 30*time.Second, 0); err != nil || hb.OthersDead {
		t.Fatalf("heartbeat still sees the node taken over: %v %v", hb.OthersDead, err)
	}
	if _, err := db.HeartbeatNode(ctx, pool, "dead1", 30*time.Second, 0); err != db.ErrNodeTakenOver {
		t.Fatalf("heartbeat of a taken-over node: %v", err)
	}
	if err := db.RegisterNode(ctx, pool, db.NodeRegistration{ID: "dead1", Kind: db.NodeWorker, Works: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.HeartbeatNode(ctx, pool, "dead1", 30*time.Second, 0); err != nil {
		t.Fatalf("heartbeat after registering again: %v", err)
	}
	if alive, _ := db.NodeAlive(ctx, pool, "dead1", 30*time.Second); !alive {
		t.Error("a registered node is not alive")
	}
}

// TestHeartbeatAnswersRecovery: the heartbeat's statement also answers db.RecoveryDue, counting
// a lease that expires within its ahead as due already; the keeper keeps each answer in the
// process's memo for the periodic gate, until two heartbeats from the beat; a heartbeat of a row
// that is gone is ErrNotFound and keeps nothing.
func TestHeartbeatAnswersRecovery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t)
	if err := db.RegisterNode(ctx, w.pool, db.NodeRegistration{ID: "n1", Kind: db.NodeWorker, Works: true}); err != nil {
		t.Fatal(err)
	}
	if hb, err := db.HeartbeatNode(ctx, w.pool, "n1", 30*time.Second, 10*time.Second); err != nil || hb.Recovery != (db.RecoveryDue{}) {
		t.Fatalf("an idle instance: %+v %v", hb, err)
	}
	_, lease, _ := w.holdings("n1")
	if _, err := w.pool.Exec(ctx, `UPDATE environment_leases SET expires_at = now() + interval '5 seconds' WHERE id = $1`, lease); err != nil {
		t.Fatal(err)
	}
	if hb, err := db.HeartbeatNode(ctx, w.pool, "n1", 30*time.Second, 0); err != nil || hb.Recovery != (db.RecoveryDue{Live: true}) {
		t.Fatalf("a live run, a lease 5 s from expiry, nothing ahead: %+v %v", hb, err)
	}
	if hb, err := db.HeartbeatNode(ctx, w.pool, "n1", 30*time.Second, 10*time.Second); err != nil || hb.Recovery != (db.RecoveryDue{Live: true, Leases: true}) {
		t.Fatalf("the same, 10 s ahead: %+v %v", hb, err)
	}
	if d, err := db.RecoveryDueNow(ctx, w.pool); err != nil || d != (db.RecoveryDue{Live: true}) {
		t.Fatalf("RecoveryDueNow (nothing ahead): %+v %v", d, err)
	}

	memo := new(db.RecoveryMemo)
	timing := DefaultTiming()
	k := NewKeeper(Deps{Pool: w.pool, Recovery: memo}, db.NodeRegistration{ID: "n1", Kind: db.NodeWorker}, timing)
	began := time.Now()
	k.heartbeat(ctx)
	if d, ok := memo.Fresh(time.Now()); !ok || d != (db.RecoveryDue{Live: true, Leases: true}) {
		t.Fatalf("the keeper's memo: %+v %v", d, ok)
	}
	if _, ok := memo.Fresh(began.Add(2*timing.Heartbeat + time.Millisecond)); ok {
		t.Fatal("the memo still holds two heartbeats after the beat")
	}
	if _, err := db.HeartbeatNode(ctx, w.pool, "gone", 30*time.Second, 0); !errors.Is(err, db.ErrNotFound) {
		t.Fatalf("heartbeat of a node with no row: %v", err)
	}
}

// TestKeeperRegistersAgainWhenTakenOver: a keeper whose node the others took over (its heartbeat
// says so) registers a new life, and its node is alive again.
func TestKeeperRegistersAgainWhenTakenOver(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	k := NewKeeper(Deps{Pool: pool}, db.NodeRegistration{ID: "back", Kind: "worker", Version: "test"}, DefaultTiming())
	if err := k.Register(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE nodes SET taken_over_at = now() WHERE id = 'back'`); err != nil {
		t.Fatal(err)
	}
	k.heartbeat(ctx)
	if k.healthySince.IsZero() {
		t.Fatal("registering again counted as a failed heartbeat")
	}
	nd, err := db.NodeByID(ctx, pool, "back", 30*time.Second)
	if err != nil || !nd.Alive || nd.TakenOverAt != nil {
		t.Fatalf("node after its keeper's heartbeat: %+v %v", nd, err)
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
	timing := Timing{Heartbeat: time.Second, DeadAfter: 30 * time.Second, Takeover: time.Second}
	k := NewKeeper(Deps{Pool: pool}, db.NodeRegistration{ID: "judge", Kind: "worker", Version: "test"}, timing)
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
