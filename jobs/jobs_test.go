package jobs

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"berth/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestHousekeepingRunsOnStart proves the River wiring end to end: a working client started on a
// migrated database runs the periodic housekeeping job at start, and it prunes what is old and
// keeps what is recent.
func TestHousekeepingRunsOnStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	if _, err := pool.Exec(ctx, `INSERT INTO login_attempts (email, ip, ok, at) VALUES
		('old@example.com', '1.2.3.4', false, now() - interval '8 days'),
		('new@example.com', '1.2.3.4', false, now())`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO sessions (token, data, expiry) VALUES
		('expired', '\x00', now() - interval '1 hour'), ('live', '\x00', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	client, err := NewClient(Deps{Pool: pool, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, ClientOptions{Work: true, MaxWorkers: 2})
	if err != nil {
		t.Fatal(err)
	}
	events, cancelSub := client.Subscribe(river.EventKindJobCompleted, river.EventKindJobFailed)
	defer cancelSub()
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.Stop(stopCtx)
	})

	// The leader election and the periodic enqueuer take a moment; River's own budget is seconds.
	deadline := time.After(90 * time.Second)
	for done := false; !done; {
		select {
		case ev := <-events:
			if ev.Job.Kind != (HousekeepingArgs{}).Kind() {
				continue
			}
			if ev.Kind != river.EventKindJobCompleted || ev.Job.State != rivertype.JobStateCompleted {
				t.Fatalf("housekeeping ended %s: %v", ev.Kind, ev.Job.Errors)
			}
			done = true
		case <-deadline:
			t.Fatal("housekeeping did not run within 90 s of start")
		}
	}
	var emails []string
	rows, err := pool.Query(ctx, `SELECT email FROM login_attempts ORDER BY email`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var e string
		if err := rows.Scan(&e); err != nil {
			t.Fatal(err)
		}
		emails = append(emails, e)
	}
	if len(emails) != 1 || emails[0] != "new@example.com" {
		t.Fatalf("login attempts after housekeeping = %v, want only the recent one", emails)
	}
	var tokens int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM sessions WHERE token = 'live'`).Scan(&tokens); err != nil || tokens != 1 {
		t.Fatalf("live session pruned: %d (%v)", tokens, err)
	}
	var expired int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM sessions WHERE token = 'expired'`).Scan(&expired); err != nil || expired != 0 {
		t.Fatalf("expired session kept: %d (%v)", expired, err)
	}
}

// TestInsertOnlyClientDoesNotWork checks the web-only mode: a client without workers enqueues
// but never runs jobs.
func TestInsertOnlyClientDoesNotWork(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	client, err := NewClient(Deps{Pool: pool, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, ClientOptions{Work: false})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.InsertTx(ctx, tx, HousekeepingArgs{}, nil); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var state string
	if err := pool.QueryRow(ctx, `SELECT state FROM river_job WHERE kind = 'housekeeping'`).Scan(&state); err != nil || state != "available" {
		t.Fatalf("enqueued job state = %q (%v), want available", state, err)
	}
}
