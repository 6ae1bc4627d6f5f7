package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"berth/db"
	"berth/environment"
)

// TestExhaustedJobsSettleTheirObjects: for every kind whose object the middleware settles, a
// failing last attempt (or a self-cancel) leaves the object in a settled state that names the
// reason, and audits it; an earlier failed attempt (River retries it) or a snooze changes nothing.
// The other kinds are settled elsewhere (see exhausted.go): finalize, cleanup_lease,
// capture_image and import_image by their own workers, runs by the orphan sweep.
func TestExhaustedJobsSettleTheirObjects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newCloseFixture(t)
	d := f.w.deps
	mw := &exhaustedMiddleware{deps: d}
	boom := errors.New("the disk said no")
	run := func(kind string, args any, attempt, max int, err error) {
		t.Helper()
		b, _ := json.Marshal(args)
		job := &rivertype.JobRow{ID: 1, Kind: kind, EncodedArgs: b, Attempt: attempt, MaxAttempts: max}
		if got := mw.Work(ctx, job, func(context.Context) error { return err }); !errors.Is(got, err) && got != err {
			t.Fatalf("%s: the middleware changed the job's error: %v", kind, got)
		}
	}
	wsStatus := func(id string) (string, string) {
		ws, err := db.ExecutionWorkspaceByID(ctx, d.Pool, f.company, id)
		if err != nil {
			t.Fatal(err)
		}
		return ws.Status, ws.CleanupReason
	}

	// close_workspace: closing → cleanup_failed with the reason (the UI offers retry).
	ws := f.closing("ws-" + strings.Repeat("a", 32))
	close := CloseWorkspaceArgs{CompanyID: f.company, WorkspaceID: ws.ID, Generation: ws.Generation}
	run("close_workspace", close, 2, 5, boom)
	if st, _ := wsStatus(ws.ID); st != db.WorkspaceClosing {
		t.Fatalf("after a retried attempt: %s, want still closing", st)
	}
	run("close_workspace", close, 5, 5, boom)
	if st, why := wsStatus(ws.ID); st != db.WorkspaceCleanupFailed || !strings.Contains(why, "gave up after 5 attempt(s)") || !strings.Contains(why, "the disk said no") {
		t.Fatalf("close exhausted: %s %q", st, why)
	}

	// reopen_workspace: preparing → closed with the reason.
	ws2 := f.closing("ws-" + strings.Repeat("b", 32))
	ws2, err := db.FinishWorkspaceClose(ctx, d.Pool, ws2.ID, ws2.Generation)
	if err != nil {
		t.Fatal(err)
	}
	if ws2, err = db.BeginWorkspaceReopen(ctx, d.Pool, ws2.ID, ws2.Generation); err != nil {
		t.Fatal(err)
	}
	reopen := ReopenWorkspaceArgs{CompanyID: f.company, WorkspaceID: ws2.ID, Generation: ws2.Generation}
	run("reopen_workspace", reopen, 1, 5, river.JobSnooze(1))
	if st, _ := wsStatus(ws2.ID); st != db.WorkspacePreparing {
		t.Fatalf("after a snooze: %s, want still preparing", st)
	}
	run("reopen_workspace", reopen, 5, 5, boom)
	if st, why := wsStatus(ws2.ID); st != db.WorkspaceClosed || !strings.Contains(why, "Reopening failed: Berth gave up") {
		t.Fatalf("reopen exhausted: %s %q", st, why)
	}

	// runtime_service start: starting → failed with the reason; a stop that ran out is left to the
	// service sweep (the process may still be there).
	var svc string
	if err := d.Pool.QueryRow(ctx, `INSERT INTO runtime_services (company_id, execution_workspace_id, name, status, desired_state)
		VALUES ($1, $2, 'web', 'starting', 'running') RETURNING id`, f.company, ws.ID).Scan(&svc); err != nil {
		t.Fatal(err)
	}
	run("runtime_service", RuntimeServiceArgs{ServiceID: svc, Action: ServiceStop}, 3, 3, boom)
	if s, _ := db.RuntimeServiceByID(ctx, d.Pool, f.company, svc); s.Status != db.ServiceStarting {
		t.Fatalf("stop exhausted: %s, want untouched", s.Status)
	}
	run("runtime_service", RuntimeServiceArgs{ServiceID: svc, Action: ServiceStart}, 3, 3, boom)
	if s, _ := db.RuntimeServiceByID(ctx, d.Pool, f.company, svc); s.Status != db.ServiceFailed || !strings.Contains(s.StopReason, "gave up after 3") {
		t.Fatalf("start exhausted: %s %q", s.Status, s.StopReason)
	}

	// probe_environment: a self-cancel (or the last attempt) writes a failed qualification.
	doc, err := environment.Config{Driver: "local"}.Document()
	if err != nil {
		t.Fatal(err)
	}
	env, err := db.CreateEnvironment(ctx, d.Pool, db.NewEnvironment{ID: "6f0d3a52-7a0f-4e47-9d43-0000000e0a57", CompanyID: f.company,
		Name: "box", Driver: "local", Config: doc})
	if err != nil {
		t.Fatal(err)
	}
	run("probe_environment", ProbeEnvironmentArgs{CompanyID: f.company, EnvironmentID: env.ID}, 1, 3, boom)
	if e, _ := db.EnvironmentByID(ctx, d.Pool, f.company, env.ID); len(e.Qualification) != 0 && string(e.Qualification) != "null" {
		t.Fatalf("after a retried attempt: qualification %s", e.Qualification)
	}
	run("probe_environment", ProbeEnvironmentArgs{CompanyID: f.company, EnvironmentID: env.ID}, 1, 3, river.JobCancel(boom))
	e, err := db.EnvironmentByID(ctx, d.Pool, f.company, env.ID)
	if err != nil {
		t.Fatal(err)
	}
	var q Qualification
	if err := json.Unmarshal(e.Qualification, &q); err != nil || q.OK || !strings.Contains(q.Summary, "gave up after 1 attempt(s) of probe_environment") {
		t.Fatalf("probe cancelled: %s (%v)", e.Qualification, err)
	}

	// select_attempts: a decision whose refs never moved reads failed with the reason.
	task, err := db.CreateTask(ctx, d.Pool, f.company, f.project, "", db.TaskFields{Title: "T", Command: "true", Trust: "standard",
		WorkspaceMode: "inherit"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := db.CreateAttemptGroup(ctx, d.Pool, db.NewAttemptGroup{CompanyID: f.company, TaskID: task.ID, Count: 2, Command: "true",
		BaseRef: "refs/heads/main", BaseCommit: strings.Repeat("a", 40), TaskBranch: "berth/T-1"})
	if err != nil {
		t.Fatal(err)
	}
	if g, err = db.DecideAttemptGroup(ctx, d.Pool, g.ID, g.Generation, db.Decision{Status: db.AttemptGroupDiscarded}); err != nil {
		t.Fatal(err)
	}
	sel := SelectAttemptsArgs{CompanyID: f.company, GroupID: g.ID, Generation: g.Generation}
	run("select_attempts", sel, 4, 5, boom)
	if g, _ := db.AttemptGroupByID(ctx, d.Pool, f.company, g.ID); g.RefsState != db.RefsPending {
		t.Fatalf("after a retried attempt: refs %s, want pending", g.RefsState)
	}
	run("select_attempts", sel, 5, 5, boom)
	if g, _ := db.AttemptGroupByID(ctx, d.Pool, f.company, g.ID); g.RefsState != db.RefsFailed || !strings.Contains(g.RefsError, "gave up after 5 attempt(s) of select_attempts") ||
		g.Status != db.AttemptGroupDiscarded {
		t.Fatalf("select exhausted: %+v", g)
	}

	var audits int
	if err := d.Pool.QueryRow(ctx, `SELECT count(*) FROM audit_events WHERE action IN
		('execution_workspace.cleanup_failed', 'execution_workspace.reopen_failed', 'runtime_service.start_failed',
		 'attempts.refs_failed')`).Scan(&audits); err != nil || audits != 4 {
		t.Fatalf("%d audit events (%v), want 4", audits, err)
	}
}
