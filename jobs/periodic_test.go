package jobs

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/jobs/internal/jobstest"
)

// TestPeriodicGate: the leader enqueues a recovery job only when its kind's question says there
// is work (an expired lease, an expired setup session, live runs or services), or when the kind
// has not run for fullPassEvery; when the database does not answer, it enqueues and lets the job
// decide. Real PostgreSQL.
func TestPeriodicGate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newSweepWorld(t)
	g := &periodicGate{q: w.pool, log: jobstest.Log(), last: map[string]time.Time{}}
	leases := func(d db.RecoveryDue) bool { return d.Leases }
	sessions := func(d db.RecoveryDue) bool { return d.SetupSessions }
	live := func(d db.RecoveryDue) bool { return d.Live }
	ask := func(kind string, due func(db.RecoveryDue) bool) bool {
		t.Helper()
		g.asked = time.Time{} // a new tick: ask again
		return g.wants(kind, due)
	}
	for _, k := range []string{"expire_leases", "expire_setup_sessions", "sweep_orphans"} {
		if !ask(k, func(db.RecoveryDue) bool { return false }) {
			t.Fatalf("%s: the first pass (at start) was skipped", k)
		}
	}
	if ask("expire_leases", leases) || ask("expire_setup_sessions", sessions) || ask("sweep_orphans", live) {
		t.Fatal("an idle instance enqueued a recovery job")
	}

	// Each kind's own work makes its flag true, and only its flag.
	run := w.run(db.RunRunning, "n1", time.Second)
	if !ask("sweep_orphans", live) || ask("expire_leases", leases) || ask("expire_setup_sessions", sessions) {
		t.Fatal("a live run: only the sweep is wanted")
	}
	lease, err := db.AcquireLease(ctx, w.pool, db.LeaseRequest{CompanyID: w.company, EnvironmentID: w.env,
		ExecutionWorkspaceID: w.runRow(run).ExecutionWorkspaceID, RunID: run, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if ask("expire_leases", leases) {
		t.Fatal("a lease within its TTL wants expiry")
	}
	if _, err := w.pool.Exec(ctx, `UPDATE environment_leases SET expires_at = now() - interval '1 second' WHERE id = $1`, lease.ID); err != nil {
		t.Fatal(err)
	}
	if !ask("expire_leases", leases) {
		t.Fatal("an expired lease did not want expiry")
	}
	sess, err := db.CreateSetupSession(ctx, w.pool, db.NewSetupSession{CompanyID: w.company, EnvironmentID: w.env, BaseVersion: 1, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if ask("expire_setup_sessions", sessions) {
		t.Fatal("a setup session within its TTL wants expiry")
	}
	if _, err := w.pool.Exec(ctx, `UPDATE image_setup_sessions SET expires_at = now() - interval '1 second' WHERE id = $1`, sess.ID); err != nil {
		t.Fatal(err)
	}
	if !ask("expire_setup_sessions", sessions) {
		t.Fatal("an expired setup session did not want expiry")
	}

	// The full pass comes back after fullPassEvery whatever the answer.
	if _, err := w.pool.Exec(ctx, `UPDATE runs SET status = 'succeeded' WHERE id = $1`, run); err != nil {
		t.Fatal(err)
	}
	if ask("sweep_orphans", live) {
		t.Fatal("a finished run still wants the sweep")
	}
	g.last["sweep_orphans"] = time.Now().Add(-fullPassEvery)
	if !ask("sweep_orphans", live) {
		t.Fatal("no full pass after fullPassEvery")
	}

	// A database that does not answer: enqueue, the job decides.
	cfg := w.pool.Config().Copy()
	cfg.ConnConfig.Port = 1
	down, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	g.q = down
	if !ask("sweep_orphans", live) {
		t.Fatal("an unanswered question skipped the job")
	}

	// The node heartbeat's answer, while it holds, is taken without a question (the database
	// is still down: a question would enqueue); once it is stale the gate asks again.
	g.memo = new(db.RecoveryMemo)
	g.memo.Note(db.RecoveryDue{Leases: true}, time.Now().Add(time.Minute))
	if ask("sweep_orphans", live) || !ask("expire_leases", leases) {
		t.Fatal("the heartbeat's answer was not the gate's")
	}
	g.memo.Note(db.RecoveryDue{}, time.Now().Add(-time.Millisecond))
	if !ask("sweep_orphans", live) {
		t.Fatal("a stale heartbeat answer was taken")
	}
}

// TestRiverLoggerQuietsSkips: River's note on every skipped periodic tick is debug, not info;
// River's other records pass as they were.
func TestRiverLoggerQuietsSkips(t *testing.T) {
	t.Parallel()
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		var out bytes.Buffer
		l := riverLogger(slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: level})))
		l.With("k", "v").Info("maintenance.PeriodicJobEnqueuer: nil returned from periodic job constructor, skipping")
		l.Info("maintenance.JobCleaner: ran")
		got := out.String()
		if !strings.Contains(got, `level=INFO msg="maintenance.JobCleaner: ran" component=river`) {
			t.Errorf("%s: another River record was changed: %q", level, got)
		}
		skip := strings.Contains(got, "level=DEBUG msg=\"maintenance.PeriodicJobEnqueuer")
		if strings.Contains(got, "level=INFO msg=\"maintenance.PeriodicJobEnqueuer") || skip != (level == slog.LevelDebug) {
			t.Errorf("%s: the skip note: %q", level, got)
		}
	}
}
