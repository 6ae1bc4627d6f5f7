package db_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/db/dbtest"
)

// TestEventTriggers: migration 0012 notifies a run's state change as "run", its log growth as
// "run_log", and not a heartbeat; a lease's acquire through the run that takes it, its cleanup
// mark, but neither its heartbeat nor its holder's release (the hot path); with the ids that
// route each event.
func TestEventTriggers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "LISTEN "+db.EventsChannel); err != nil {
		t.Fatal(err)
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	var cid, pid, tid, runID, leaseID string
	if err := pool.QueryRow(ctx, `INSERT INTO companies (name, slug) VALUES ('Ev', 'ev') RETURNING id`).Scan(&cid); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `INSERT INTO projects (company_id, name, key) VALUES ($1, 'P', 'EV') RETURNING id`, cid).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `INSERT INTO tasks (company_id, project_id, number, key, title) VALUES ($1, $2, 1, 'EV-1', 't') RETURNING id`, cid, pid).Scan(&tid); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `INSERT INTO runs (company_id, task_id) VALUES ($1, $2) RETURNING id`, cid, tid).Scan(&runID); err != nil {
		t.Fatal(err)
	}
	exec(`UPDATE runs SET heartbeat_at = now() WHERE id = $1`, runID)                           // nothing
	exec(`UPDATE runs SET log = 'x', log_bytes = 1, heartbeat_at = now() WHERE id = $1`, runID) // run_log
	exec(`UPDATE runs SET status = 'preparing' WHERE id = $1`, runID)                           // run
	if err := pool.QueryRow(ctx, `INSERT INTO environment_leases (company_id, task_id, run_id, status) VALUES ($1, $2, $3, 'active') RETURNING id`,
		cid, tid, runID).Scan(&leaseID); err != nil {
		t.Fatal(err)
	}
	exec(`UPDATE runs SET lease_id = $2 WHERE id = $1`, runID, leaseID)                                                               // run, and lease (the acquire)
	exec(`UPDATE environment_leases SET heartbeat_at = now(), expires_at = now() + interval '1 minute' WHERE id = $1`, leaseID)       // nothing
	exec(`UPDATE environment_leases SET status = 'released', released_at = now(), cleanup_status = 'pending' WHERE id = $1`, leaseID) // nothing: the mark announces it
	exec(`UPDATE environment_leases SET cleanup_status = 'succeeded', cleanup_attempts = 1 WHERE id = $1`, leaseID)                   // lease

	want := []db.Event{
		{CompanyID: cid, Topic: "task", ID: tid, TaskID: tid},
		{CompanyID: cid, Topic: "run", ID: runID, TaskID: tid, RunID: runID},
		{CompanyID: cid, Topic: "run_log", ID: runID, TaskID: tid, RunID: runID},
		{CompanyID: cid, Topic: "run", ID: runID, TaskID: tid, RunID: runID},
		{CompanyID: cid, Topic: "run", ID: runID, TaskID: tid, RunID: runID},
		{CompanyID: cid, Topic: "lease", ID: leaseID, TaskID: tid, RunID: runID},
		{CompanyID: cid, Topic: "lease", ID: leaseID, TaskID: tid, RunID: runID},
	}
	for i, w := range want {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("notification %d: %v", i, err)
		}
		got, err := db.ParseEvent(n.Payload)
		if err != nil || got != w {
			t.Fatalf("notification %d = %+v (%v), want %+v", i, got, err, w)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if n, err := conn.WaitForNotification(wctx); err == nil {
		t.Fatalf("an extra notification: %s", n.Payload)
	}
}
