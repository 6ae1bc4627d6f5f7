package db_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/db/dbtest"
)

// runWorld is a company with a project and a task, for run-level tests.
type runWorld struct {
	pool                       *pgxpool.Pool
	companyID, projectID, task string
}

func newRunWorld(t *testing.T) runWorld {
	t.Helper()
	ctx := context.Background()
	pool := dbtest.New(t)
	w := runWorld{pool: pool}
	if err := pool.QueryRow(ctx, `INSERT INTO companies (name, slug) VALUES ('Acme', 'acme') RETURNING id`).Scan(&w.companyID); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `INSERT INTO projects (company_id, name, key) VALUES ($1, 'P', 'PRJ') RETURNING id`, w.companyID).Scan(&w.projectID); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `INSERT INTO tasks (company_id, project_id, number, key, title) VALUES ($1, $2, 1, 'PRJ-1', 'T') RETURNING id`,
		w.companyID, w.projectID).Scan(&w.task); err != nil {
		t.Fatal(err)
	}
	return w
}

func TestRunLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newRunWorld(t)
	r, err := db.CreateRun(ctx, w.pool, db.NewRun{CompanyID: w.companyID, TaskID: w.task, Command: "true", TimeoutS: 60})
	if err != nil || r.Status != db.RunQueued || !r.Live() {
		t.Fatalf("create: %+v %v", r, err)
	}
	if _, err := db.RunByID(ctx, w.pool, "00000000-0000-0000-0000-000000000000", r.ID); !errors.Is(err, db.ErrNotFound) {
		t.Fatalf("another company's run: %v", err)
	}
	r, err = db.TransitionRun(ctx, w.pool, r.ID, []string{db.RunQueued}, db.RunRunning, db.RunUpdate{Started: true})
	if err != nil || r.Status != db.RunRunning || r.StartedAt == nil {
		t.Fatalf("queued→running: %+v %v", r, err)
	}
	// A retried job that expects queued finds the run moved on and changes nothing.
	if _, err := db.TransitionRun(ctx, w.pool, r.ID, []string{db.RunQueued}, db.RunFailed, db.RunUpdate{}); !errors.Is(err, db.ErrRunState) {
		t.Fatalf("stale transition: %v", err)
	}
	if err := db.SetRunLog(ctx, w.pool, r.ID, db.RunLog{Data: []byte("hello world"), Head: 11, Total: 11}); err != nil {
		t.Fatal(err)
	}
	if l, err := db.RunLogOf(ctx, w.pool, w.companyID, r.ID); err != nil || string(l.Data) != "hello world" || l.Head != 11 ||
		l.Total != 11 || l.Truncated {
		t.Fatalf("log = %+v (%v)", l, err)
	}
	kept := "head\n… 90 bytes omitted …\ntail\n"
	if err := db.SetRunLog(ctx, w.pool, r.ID, db.RunLog{Data: []byte(kept), Head: 5, Total: 100, Truncated: true}); err != nil {
		t.Fatal(err)
	}
	if l, err := db.RunLogOf(ctx, w.pool, w.companyID, r.ID); err != nil || string(l.Data) != kept || l.Head != 5 ||
		l.Total != 100 || !l.Truncated {
		t.Fatalf("truncated log = %+v (%v)", l, err)
	}
	if c, err := db.RequestRunCancel(ctx, w.pool, w.companyID, r.ID); err != nil || !c.CancelRequested {
		t.Fatalf("cancel: %v", err)
	}
	code := 0
	r, err = db.TransitionRun(ctx, w.pool, r.ID, db.LiveRunStatuses, db.RunCancelled, db.RunUpdate{ExitCode: &code, Finished: true})
	if err != nil || r.Live() || r.FinishedAt == nil || r.ExitCode == nil {
		t.Fatalf("→cancelled: %+v %v", r, err)
	}
	if _, err := db.RequestRunCancel(ctx, w.pool, w.companyID, r.ID); !errors.Is(err, db.ErrRunState) {
		t.Fatalf("cancel after the end: %v", err)
	}
}

func TestStaleRunsUseTheDatabaseClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newRunWorld(t)
	r, _ := db.CreateRun(ctx, w.pool, db.NewRun{CompanyID: w.companyID, TaskID: w.task, Command: "true", TimeoutS: 60})
	if _, err := db.TransitionRun(ctx, w.pool, r.ID, []string{db.RunQueued}, db.RunRunning, db.RunUpdate{Started: true}); err != nil {
		t.Fatal(err)
	}
	if stale, err := db.StaleRuns(ctx, w.pool, time.Minute, 10); err != nil || len(stale) != 0 {
		t.Fatalf("fresh run listed as stale: %d (%v)", len(stale), err)
	}
	if _, err := w.pool.Exec(ctx, `UPDATE runs SET heartbeat_at = now() - interval '5 minutes'`); err != nil {
		t.Fatal(err)
	}
	if stale, err := db.StaleRuns(ctx, w.pool, time.Minute, 10); err != nil || len(stale) != 1 {
		t.Fatalf("stale runs = %d (%v)", len(stale), err)
	}
}

func TestExecutionWorkspaceOperationsAndProducts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newRunWorld(t)
	ws, err := db.CreateExecutionWorkspace(ctx, w.pool, db.NewExecutionWorkspace{CompanyID: w.companyID, ProjectID: w.projectID,
		SourceTaskID: w.task, Mode: "isolated", Strategy: "git_worktree", Trust: "standard", Ref: "ws-0123456789abcdef0123456789abcdef"})
	if err != nil || ws.Status != "preparing" || ws.Generation != 1 {
		t.Fatalf("create: %+v %v", ws, err)
	}
	if _, err := db.MarkExecutionWorkspaceReady(ctx, w.pool, ws.ID, 2, db.Realized{Cwd: ws.Ref}); !errors.Is(err, db.ErrWorkspaceFenced) {
		t.Fatalf("ready with a stale generation: %v", err)
	}
	ready, err := db.MarkExecutionWorkspaceReady(ctx, w.pool, ws.ID, 1, db.Realized{Cwd: ws.Ref, Branch: "berth/PRJ-1", BaseCommit: "abc"})
	if err != nil || ready.Status != "ready" || ready.Branch != "berth/PRJ-1" {
		t.Fatalf("ready: %+v %v", ready, err)
	}
	if err := db.MarkExecutionWorkspaceFailed(ctx, w.pool, ws.ID, 1, "late"); !errors.Is(err, db.ErrWorkspaceFenced) {
		t.Fatalf("fail a ready workspace: %v", err)
	}
	list, err := db.ListExecutionWorkspaces(ctx, w.pool, w.companyID, db.ExecutionWorkspaceFilter{TaskID: w.task, Limit: 10})
	if err != nil || len(list) != 1 {
		t.Fatalf("list by task = %d (%v)", len(list), err)
	}

	op, err := db.StartOperation(ctx, w.pool, db.NewOperation{CompanyID: w.companyID, ExecutionWorkspaceID: ws.ID, Phase: "setup", Command: "make deps"})
	if err != nil || op.Status != "running" {
		t.Fatalf("start op: %v", err)
	}
	code := 2
	if err := db.FinishOperation(ctx, w.pool, op.ID, db.OperationResult{Status: "failed", ExitCode: &code, Log: []byte("boom"), LogBytes: 4}); err != nil {
		t.Fatal(err)
	}
	// Settling again (a retried job) does not rewrite a settled step.
	if err := db.FinishOperation(ctx, w.pool, op.ID, db.OperationResult{Status: "succeeded"}); err != nil {
		t.Fatal(err)
	}
	stuck, _ := db.StartOperation(ctx, w.pool, db.NewOperation{CompanyID: w.companyID, ExecutionWorkspaceID: ws.ID, Phase: "realize"})
	if _, err := w.pool.Exec(ctx, `UPDATE workspace_operations SET started_at = now() - interval '1 hour' WHERE id = $1`, stuck.ID); err != nil {
		t.Fatal(err)
	}
	if n, err := db.SettleStuckOperations(ctx, w.pool, 10*time.Minute); err != nil || n != 1 {
		t.Fatalf("settled %d stuck operations (%v), want 1", n, err)
	}
	ops, err := db.WorkspaceOperations(ctx, w.pool, w.companyID, ws.ID)
	if err != nil || len(ops) != 2 {
		t.Fatalf("operations = %+v (%v)", ops, err)
	}
	// In start order: the stuck step started an hour earlier.
	if ops[0].ID != stuck.ID || ops[0].Status != "failed" || ops[0].Error == "" ||
		ops[1].ID != op.ID || ops[1].Status != "failed" || ops[1].ExitCode == nil || *ops[1].ExitCode != 2 || string(ops[1].Log) != "boom" {
		t.Fatalf("operations = %+v", ops)
	}

	r, _ := db.CreateRun(ctx, w.pool, db.NewRun{CompanyID: w.companyID, TaskID: w.task, Command: "true", TimeoutS: 60})
	for i := 0; i < 2; i++ { // a retried finalize records each product once
		if err := db.AddWorkProduct(ctx, w.pool, db.WorkProduct{CompanyID: w.companyID, TaskID: w.task, RunID: r.ID,
			ExecutionWorkspaceID: ws.ID, Kind: "commit", Ref: "abc123", Metadata: map[string]any{"branch": "berth/PRJ-1"}}); err != nil {
			t.Fatal(err)
		}
	}
	products, err := db.TaskWorkProducts(ctx, w.pool, w.companyID, w.task)
	if err != nil || len(products) != 1 || products[0].Metadata["branch"] != "berth/PRJ-1" {
		t.Fatalf("work products = %+v (%v)", products, err)
	}

	// A product of no run (a close's rescue commit) is recorded once per (workspace, kind, ref),
	// whoever recorded that ref before.
	for _, ref := range []string{"def456", "def456", "abc123"} {
		if err := db.AddWorkProduct(ctx, w.pool, db.WorkProduct{CompanyID: w.companyID, TaskID: w.task,
			ExecutionWorkspaceID: ws.ID, Kind: "commit", Ref: ref, Metadata: map[string]any{"reason": "destructive close"}}); err != nil {
			t.Fatal(err)
		}
	}
	products, err = db.WorkspaceWorkProducts(ctx, w.pool, w.companyID, ws.ID, 10)
	if err != nil || len(products) != 2 || products[0].Ref != "def456" || products[0].RunID != "" ||
		products[0].Metadata["reason"] != "destructive close" || products[1].RunID != r.ID {
		t.Fatalf("workspace work products = %+v (%v)", products, err)
	}
}
