package db_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"berth/db"
	"berth/db/dbtest"
)

// TestMigrationSettlesLiveRuns: a database at 0008 with three live runs on one task (and one on
// another) migrates to 0009 keeping only the newest live run of each task; the older ones end
// failed with error_code superseded; then the index refuses a second live run.
func TestMigrationSettlesLiveRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := db.Open(ctx, dbtest.EmptyConnString(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	migs, err := db.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var live db.Migration
	for _, m := range migs {
		if m.Version == 9 {
			live = m
			break
		}
		if _, err := pool.Exec(ctx, m.SQL); err != nil {
			t.Fatalf("migration %04d: %v", m.Version, err)
		}
	}
	var company, project, taskA, taskB string
	if err := pool.QueryRow(ctx, `INSERT INTO companies (name, slug) VALUES ('Acme', 'acme') RETURNING id`).Scan(&company); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `INSERT INTO projects (company_id, name, key) VALUES ($1, 'P', 'PRJ') RETURNING id`, company).Scan(&project); err != nil {
		t.Fatal(err)
	}
	for i, dst := range []*string{&taskA, &taskB} {
		if err := pool.QueryRow(ctx, `INSERT INTO tasks (company_id, project_id, number, key, title) VALUES ($1, $2, $3::int, 'PRJ-' || $3::int, 'T')
			RETURNING id`, company, project, i+1).Scan(dst); err != nil {
			t.Fatal(err)
		}
	}
	run := func(task, status string, age time.Duration) string {
		var id string
		if err := pool.QueryRow(ctx, `INSERT INTO runs (company_id, task_id, status, created_at) VALUES ($1, $2, $3, now() - $4::interval)
			RETURNING id`, company, task, status, age).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	oldest := run(taskA, "running", 3*time.Hour)
	older := run(taskA, "queued", 2*time.Hour)
	ended := run(taskA, "succeeded", 90*time.Minute)
	newest := run(taskA, "preparing", time.Hour)
	onlyB := run(taskB, "running", 4*time.Hour)

	if _, err := pool.Exec(ctx, live.SQL); err != nil {
		t.Fatalf("migration 0009: %v", err)
	}
	want := map[string]string{oldest: "failed/superseded", older: "failed/superseded", ended: "succeeded/",
		newest: "preparing/", onlyB: "running/"}
	for id, w := range want {
		var got string
		var finished *time.Time
		if err := pool.QueryRow(ctx, `SELECT status || '/' || error_code, finished_at FROM runs WHERE id = $1`, id).Scan(&got, &finished); err != nil {
			t.Fatal(err)
		}
		if got != w || (w == "failed/superseded" && finished == nil) {
			t.Errorf("run %s = %s (finished %v), want %s", id, got, finished, w)
		}
	}
	for _, m := range migs { // today's code (CreateRun) needs today's schema
		if m.Version > 9 {
			if _, err := pool.Exec(ctx, m.SQL); err != nil {
				t.Fatalf("migration %04d: %v", m.Version, err)
			}
		}
	}
	if _, err := db.CreateRun(ctx, pool, db.NewRun{CompanyID: company, TaskID: taskA, Command: "true", TimeoutS: 60}); !errors.Is(err, db.ErrConflict) {
		t.Fatalf("a second live run after the migration: %v, want ErrConflict", err)
	}
	if r, err := db.LiveTaskRun(ctx, pool, company, taskA); err != nil || r.ID != newest {
		t.Fatalf("live run = %s %v, want %s", r.ID, err, newest)
	}
}

// TestCreateRunOneLivePerTask: a task with a live run refuses another (ErrConflict, the
// transaction stays usable); once it ended, a new one is admitted.
func TestCreateRunOneLivePerTask(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newRunWorld(t)
	first, err := db.CreateRun(ctx, w.pool, db.NewRun{CompanyID: w.companyID, TaskID: w.task, Command: "true", TimeoutS: 60})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a test's transaction
	if _, err := db.CreateRun(ctx, tx, db.NewRun{CompanyID: w.companyID, TaskID: w.task, Command: "true", TimeoutS: 60}); !errors.Is(err, db.ErrConflict) {
		t.Fatalf("second live run: %v, want ErrConflict", err)
	}
	if live, err := db.LiveTaskRun(ctx, tx, w.companyID, w.task); err != nil || live.ID != first.ID {
		t.Fatalf("after the conflict the transaction reads %s %v", live.ID, err)
	}
	if _, err := db.TransitionRun(ctx, tx, first.ID, db.LiveRunStatuses, db.RunSucceeded, db.RunUpdate{Finished: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.CreateRun(ctx, tx, db.NewRun{CompanyID: w.companyID, TaskID: w.task, Command: "true", TimeoutS: 60}); err != nil {
		t.Fatalf("a run after the first ended: %v", err)
	}
}
