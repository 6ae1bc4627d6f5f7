package handlers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"berth/db"
	"berth/environment"
	"berth/jobs"
)

// leaseEnv is a server with an insert-only job client and, in companies A and B of the standard
// cast, an environment, a project and a task to lease for.
type leaseEnv struct {
	*testEnv
	r          roles
	envA, envB string
	projA      string
	projB      string
	taskA      db.Task
	taskB      db.Task
}

func setupLeaseEnv(t *testing.T) *leaseEnv {
	t.Helper()
	e := setup(t, func(d *Deps) {
		client, err := jobs.NewClient(jobs.Deps{Pool: d.Pool, Log: slog.New(slog.NewTextHandler(io.Discard, nil))},
			jobs.ClientOptions{Work: false})
		if err != nil {
			t.Fatal(err)
		}
		d.Jobs = client
	})
	le := &leaseEnv{testEnv: e, r: e.roles()}
	le.envA = le.environment(le.r.A.ID, "local-a")
	le.envB = le.environment(le.r.B.ID, "local-b")
	le.projA, le.taskA = le.projectTask(le.r.A.ID, le.envA, le.r.Board.User.ID)
	le.projB, le.taskB = le.projectTask(le.r.B.ID, le.envB, le.r.Other.User.ID)
	return le
}

// environment creates a local environment named name in a company (names are not validated here,
// so tests can store markup).
func (le *leaseEnv) environment(companyID, name string) string {
	le.t.Helper()
	doc, err := environment.Config{Driver: "local"}.Document()
	if err != nil {
		le.t.Fatal(err)
	}
	env, err := db.CreateEnvironment(context.Background(), le.pool, db.NewEnvironment{ID: newEnvironmentID(),
		CompanyID: companyID, Name: name, Driver: "local", Config: doc})
	if err != nil {
		le.t.Fatal(err)
	}
	return env.ID
}

func (le *leaseEnv) projectTask(companyID, envID, userID string) (string, db.Task) {
	le.t.Helper()
	ctx := context.Background()
	p, err := db.CreateProject(ctx, le.pool, companyID, db.ProjectFields{Name: "P", Key: "PRJ", Policy: db.ExecutionPolicy{
		DefaultMode: "isolated", EnvironmentID: envID, Strategy: "copy", BranchTemplate: "berth/{task_key}"}})
	if err != nil {
		le.t.Fatal(err)
	}
	task, err := db.CreateTask(ctx, le.pool, companyID, p.ID, userID,
		db.TaskFields{Title: "T", Command: "true", Trust: "standard", WorkspaceMode: "inherit"})
	if err != nil {
		le.t.Fatal(err)
	}
	return p.ID, task
}

// lease acquires a fresh active lease on envID in company A (or B when envID is B's) for a new
// execution workspace and a new run of a new task of the company's project (a task has one live
// run at a time).
func (le *leaseEnv) lease(envID string) db.Lease {
	le.t.Helper()
	ctx := context.Background()
	cid, proj, user := le.r.A.ID, le.projA, le.r.Board.User.ID
	if envID == le.envB {
		cid, proj, user = le.r.B.ID, le.projB, le.r.Other.User.ID
	}
	t, err := db.CreateTask(ctx, le.pool, cid, proj, user, db.TaskFields{Title: "Leased", Command: "true", Trust: "standard",
		WorkspaceMode: "inherit"})
	if err != nil {
		le.t.Fatal(err)
	}
	task := t.ID
	var b [16]byte
	_, _ = rand.Read(b[:])
	ws, err := db.CreateExecutionWorkspace(ctx, le.pool, db.NewExecutionWorkspace{CompanyID: cid, ProjectID: proj,
		Mode: "isolated", Strategy: "copy", Trust: "standard", Ref: "ws-" + hex.EncodeToString(b[:])})
	if err != nil {
		le.t.Fatal(err)
	}
	run, err := db.CreateRun(ctx, le.pool, db.NewRun{CompanyID: cid, TaskID: task, EnvironmentID: envID, CreatedBy: user,
		Command: "true", TimeoutS: 60})
	if err != nil {
		le.t.Fatal(err)
	}
	l, err := db.AcquireLease(ctx, le.pool, db.LeaseRequest{CompanyID: cid, EnvironmentID: envID,
		ExecutionWorkspaceID: ws.ID, TaskID: task, RunID: run.ID, TTL: time.Hour})
	if err != nil {
		le.t.Fatal(err)
	}
	return l
}

// leaseRowJSON is the whole stored lease row as JSON, to compare before and after a refusal.
func leaseRowJSON(e *testEnv, id string) string {
	e.t.Helper()
	var s string
	if err := e.pool.QueryRow(context.Background(), `SELECT coalesce((SELECT to_jsonb(l)::text
		FROM environment_leases l WHERE id = $1), '')`, id).Scan(&s); err != nil {
		e.t.Fatal(err)
	}
	return s
}

// leaseCleanupJobs counts the cleanup_lease jobs enqueued for a lease at a generation.
func leaseCleanupJobs(e *testEnv, id string, gen int64) int {
	e.t.Helper()
	return e.count(`SELECT count(*) FROM river_job WHERE kind = 'cleanup_lease' AND args->>'lease_id' = $1
		AND (args->>'generation')::bigint = $2`, id, gen)
}

// leaseIDs returns the ids of a list response's items, in order.
func leaseIDs(t *testing.T, out map[string]any) []string {
	t.Helper()
	items, ok := out["items"].([]any)
	if !ok {
		t.Fatalf("no items in %v", out)
	}
	ids := []string{}
	for _, it := range items {
		ids = append(ids, it.(map[string]any)["id"].(string))
	}
	return ids
}

// leaseForm posts an empty form as a browser.
func (e *testEnv) leaseForm(c *http.Client, path string) *http.Response {
	e.t.Helper()
	return e.do(c, http.MethodPost, path, strings.NewReader(""),
		map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
}

// TestLeaseAPIRoleMatrix: readers of the company read; writes are for instance admins (403 and an
// audited denial for members, 404 for another company), and refusals change nothing.
func TestLeaseAPIRoleMatrix(t *testing.T) {
	t.Parallel()
	le := setupLeaseEnv(t)
	l := le.lease(le.envA)
	r := le.r

	for who, a := range map[string]actor{"viewer": r.Viewer, "board": r.Board, "admin": r.Admin} {
		code, out := le.call(a, http.MethodGet, "/api/companies/"+r.A.ID+"/leases", nil)
		if code != http.StatusOK || !slices.Equal(leaseIDs(t, out), []string{l.ID}) {
			t.Errorf("%s list = %d %v", who, code, out)
		}
		code, got := le.call(a, http.MethodGet, "/api/leases/"+l.ID, nil)
		if code != http.StatusOK || got["id"] != l.ID {
			t.Errorf("%s get = %d %v", who, code, got)
		}
	}
	if code, _ := le.call(r.Other, http.MethodGet, "/api/companies/"+r.A.ID+"/leases", nil); code != http.StatusNotFound {
		t.Errorf("other company list = %d, want 404", code)
	}
	if code, _ := le.call(r.Other, http.MethodGet, "/api/leases/"+l.ID, nil); code != http.StatusNotFound {
		t.Errorf("other company get = %d, want 404", code)
	}
	for _, id := range []string{"not-a-uuid", "00000000-0000-4000-8000-000000000000"} {
		if code, _ := le.call(r.Admin, http.MethodGet, "/api/leases/"+id, nil); code != http.StatusNotFound {
			t.Errorf("get %s = %d, want 404", id, code)
		}
	}
	if code, _ := le.call(actor{}, http.MethodGet, "/api/leases/"+l.ID, nil); code != http.StatusUnauthorized {
		t.Errorf("anonymous get = %d, want 401", code)
	}

	// The object's shape.
	_, got := le.call(r.Viewer, http.MethodGet, "/api/leases/"+l.ID, nil)
	keys := []string{}
	for k := range got {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	want := []string{"acquired_at", "cleanup_attempts", "cleanup_status", "environment_id", "execution_workspace_id",
		"expires_at", "failure_reason", "generation", "heartbeat_age_s", "heartbeat_at", "id", "released_at", "run_id",
		"status", "task_id"}
	if !slices.Equal(keys, want) {
		t.Errorf("lease keys = %v, want %v", keys, want)
	}
	if got["status"] != "active" || got["generation"] != float64(1) || got["run_id"] != l.RunID ||
		got["environment_id"] != le.envA || got["released_at"] != nil || got["failure_reason"] != nil ||
		got["cleanup_status"] != "none" {
		t.Errorf("lease = %v", got)
	}
	if age, ok := got["heartbeat_age_s"].(float64); !ok || age < 0 || age > 60 {
		t.Errorf("heartbeat_age_s = %v", got["heartbeat_age_s"])
	}

	// Writes by members: 403, audited, nothing changed; another company: 404.
	before := leaseRowJSON(le.testEnv, l.ID)
	for _, path := range []string{"/release", "/retry-cleanup"} {
		for who, a := range map[string]actor{"viewer": r.Viewer, "board": r.Board} {
			if code, out := le.call(a, http.MethodPost, "/api/leases/"+l.ID+path, nil); code != http.StatusForbidden {
				t.Errorf("%s %s = %d %v, want 403", who, path, code, out)
			}
		}
		if code, _ := le.call(r.Other, http.MethodPost, "/api/leases/"+l.ID+path, nil); code != http.StatusNotFound {
			t.Errorf("other company %s = %d, want 404", path, code)
		}
	}
	if after := leaseRowJSON(le.testEnv, l.ID); after != before {
		t.Fatalf("refused writes changed the lease:\n%s\n%s", before, after)
	}
	for action, n := range map[string]int{"lease.force_release.denied": 2, "lease.retry_cleanup.denied": 2} {
		if got := le.count(`SELECT count(*) FROM audit_events WHERE action = $1 AND target_id = $2 AND company_id = $3`,
			action, l.ID, r.A.ID); got != n {
			t.Errorf("%s events = %d, want %d", action, got, n)
		}
	}
	// A body naming server-owned fields is refused too.
	if code, _ := le.call(r.Admin, http.MethodPost, "/api/leases/"+l.ID+"/release", map[string]any{"generation": 7}); code != http.StatusBadRequest {
		t.Errorf("release with a generation = %d, want 400", code)
	}
	if after := leaseRowJSON(le.testEnv, l.ID); after != before {
		t.Fatal("a refused body changed the lease")
	}
	if n := le.count(`SELECT count(*) FROM river_job WHERE kind = 'cleanup_lease'`); n != 0 {
		t.Fatalf("refusals enqueued %d cleanup jobs", n)
	}

	// The instance admin releases (200, generation bumped, audited) …
	code, out := le.call(r.Admin, http.MethodPost, "/api/leases/"+l.ID+"/release", nil)
	if code != http.StatusOK || out["status"] != "released" || out["generation"] != float64(2) ||
		out["cleanup_status"] != "pending" || out["released_at"] == nil {
		t.Fatalf("admin release = %d %v", code, out)
	}
	if n := le.count(`SELECT count(*) FROM audit_events WHERE action = 'lease.force_released' AND target_id = $1
		AND actor_id = $2 AND company_id = $3 AND (details->>'previous_generation')::int = 1`, l.ID, r.Admin.User.ID, r.A.ID); n != 1 {
		t.Errorf("lease.force_released events = %d", n)
	}
	if n := leaseCleanupJobs(le.testEnv, l.ID, 2); n != 1 {
		t.Errorf("cleanup_lease jobs after the release = %d, want 1", n)
	}
	// … and a retry of a cleanup that has not failed is a conflict.
	before = leaseRowJSON(le.testEnv, l.ID)
	code, out = le.call(r.Admin, http.MethodPost, "/api/leases/"+l.ID+"/retry-cleanup", nil)
	if errObj, _ := out["error"].(map[string]any); code != http.StatusConflict || errObj["code"] != "cleanup_not_failed" {
		t.Fatalf("retry of a pending cleanup = %d %v", code, out)
	}
	if leaseRowJSON(le.testEnv, l.ID) != before {
		t.Fatal("a refused retry changed the lease")
	}
}

// TestLeaseForceReleaseFencesHolder: force release bumps the generation, so the holder's next
// heartbeat (and release) with the old generation is fenced and changes nothing; a second force
// release is 409 lease_not_live.
func TestLeaseForceReleaseFencesHolder(t *testing.T) {
	t.Parallel()
	le := setupLeaseEnv(t)
	ctx := context.Background()
	l := le.lease(le.envA)
	other := le.lease(le.envA) // another workspace's lease on the same environment stays untouched
	otherBefore := leaseRowJSON(le.testEnv, other.ID)

	code, out := le.call(le.r.Admin, http.MethodPost, "/api/leases/"+l.ID+"/release", map[string]any{})
	if code != http.StatusOK || out["generation"] != float64(l.Generation+1) || out["status"] != "released" {
		t.Fatalf("release = %d %v", code, out)
	}
	released := leaseRowJSON(le.testEnv, l.ID)
	if _, err := db.HeartbeatLease(ctx, le.pool, l.ID, l.Generation, time.Minute); !errors.Is(err, db.ErrFenced) {
		t.Fatalf("heartbeat with the old generation = %v, want ErrFenced", err)
	}
	if _, err := db.ReleaseLease(ctx, le.pool, l, "run done"); !errors.Is(err, db.ErrFenced) {
		t.Fatalf("release with the old generation = %v, want ErrFenced", err)
	}
	if leaseRowJSON(le.testEnv, l.ID) != released {
		t.Fatal("fenced writes changed the lease")
	}
	if n := le.count(`SELECT count(*) FROM audit_events WHERE action = 'lease.fenced' AND target_id = $1`, l.ID); n != 2 {
		t.Errorf("lease.fenced events = %d, want 2", n)
	}
	code, out = le.call(le.r.Admin, http.MethodPost, "/api/leases/"+l.ID+"/release", nil)
	if errObj, _ := out["error"].(map[string]any); code != http.StatusConflict || errObj["code"] != "lease_not_live" {
		t.Fatalf("second release = %d %v", code, out)
	}
	if leaseRowJSON(le.testEnv, l.ID) != released {
		t.Fatal("a refused release changed the lease")
	}
	if leaseRowJSON(le.testEnv, other.ID) != otherBefore {
		t.Fatal("releasing one lease changed another")
	}
	// The slot is free again: a new lease can be taken for the released lease's workspace.
	if _, err := db.AcquireLease(ctx, le.pool, db.LeaseRequest{CompanyID: le.r.A.ID, EnvironmentID: le.envA,
		ExecutionWorkspaceID: l.ExecutionWorkspaceID, TTL: time.Minute}); err != nil {
		t.Fatalf("acquire after force release: %v", err)
	}
}

// TestLeaseForceReleaseDuringRun: a real run holds its lease while its command sleeps; force
// release fences it (the old generation's heartbeat is refused), the run can still be cancelled and
// finalized, and the lease pages show no host paths.
func TestLeaseForceReleaseDuringRun(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	task := re.task("echo started; sleep 30")
	id := re.start(task.ID, nil)
	run := re.waitRun(id, "the command start", func(r map[string]any) bool { return r["status"] == "running" })
	leaseID, _ := run["lease_id"].(string)
	if leaseID == "" {
		t.Fatalf("running run without a lease: %v", run)
	}
	code, l := re.call(re.r.Viewer, http.MethodGet, "/api/leases/"+leaseID, nil)
	if code != http.StatusOK || l["status"] != "active" || l["run_id"] != id {
		t.Fatalf("lease of the running run = %d %v", code, l)
	}
	gen := int64(l["generation"].(float64))
	if code, _ := re.call(re.r.Board, http.MethodPost, "/api/leases/"+leaseID+"/release", nil); code != http.StatusForbidden {
		t.Fatalf("board release = %d, want 403", code)
	}
	code, out := re.call(re.r.Admin, http.MethodPost, "/api/leases/"+leaseID+"/release", nil)
	if code != http.StatusOK || out["status"] != "released" || out["generation"] != float64(gen+1) {
		t.Fatalf("admin release during the run = %d %v", code, out)
	}
	// The run's watcher heartbeats with the generation it acquired: from now on that is fenced.
	if _, err := db.HeartbeatLease(context.Background(), re.pool, leaseID, gen, time.Minute); !errors.Is(err, db.ErrFenced) {
		t.Fatalf("holder heartbeat after force release = %v, want ErrFenced", err)
	}

	// The pages show the lease and its run, and nothing of the host's paths.
	admin := re.browser(re.r.Admin)
	for _, path := range []string{"/leases", "/leases/" + leaseID} {
		resp := re.do(admin, http.MethodGet, path, nil, nil)
		body := readBody(t, resp)
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, "/runs/"+id) {
			t.Fatalf("%s = %d, want a link to the run:\n%s", path, resp.StatusCode, body)
		}
		for _, p := range []string{re.repo, os.TempDir() + "/"} {
			if strings.Contains(body, p) {
				t.Fatalf("%s shows the host path %q", path, p)
			}
		}
	}

	// The cleanup_lease job the release enqueued stops the run's processes, so the run ends well
	// before its next heartbeat (a cancel, if it comes first, ends it too); finalize still settles.
	if code, _ := re.call(re.r.Board, http.MethodPost, "/api/runs/"+id+"/cancel", nil); code != http.StatusAccepted &&
		code != http.StatusConflict {
		t.Fatalf("cancel = %d", code)
	}
	run = re.waitRun(id, "the end", ended)
	if run["status"] != "cancelled" && run["status"] != "failed" {
		t.Fatalf("run after force release = %v", run)
	}
	if pids, _ := environment.FindTagged(id); len(pids) != 0 {
		t.Fatalf("processes of the force-released run still run: %v", pids)
	}
	if fin, status := re.settled(run); fin != "settled" || status != "released" {
		t.Fatalf("finalize %q, lease %q", fin, status)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, l = re.call(re.r.Viewer, http.MethodGet, "/api/leases/"+leaseID, nil)
		if l["cleanup_status"] == "succeeded" || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if l["generation"] != float64(gen+1) || l["status"] != "released" || l["cleanup_status"] != "succeeded" {
		t.Fatalf("lease after finalize and cleanup = %v", l)
	}
}

// TestLeaseRetryCleanup: only a failed cleanup goes back to pending (attempts kept, audited);
// pending, succeeded and live leases are 409; without a job client nothing changes.
func TestLeaseRetryCleanup(t *testing.T) {
	t.Parallel()
	le := setupLeaseEnv(t)
	ctx := context.Background()
	live := le.lease(le.envA)
	l := le.lease(le.envA)
	l, err := db.ReleaseLease(ctx, le.pool, l, "run succeeded")
	if err != nil {
		t.Fatal(err)
	}
	retry := func(a actor, id string) (int, map[string]any) {
		return le.call(a, http.MethodPost, "/api/leases/"+id+"/retry-cleanup", nil)
	}
	conflict := func(what, id string) {
		t.Helper()
		before := leaseRowJSON(le.testEnv, id)
		code, out := retry(le.r.Admin, id)
		if errObj, _ := out["error"].(map[string]any); code != http.StatusConflict || errObj["code"] != "cleanup_not_failed" {
			t.Fatalf("retry of %s = %d %v, want 409 cleanup_not_failed", what, code, out)
		}
		if leaseRowJSON(le.testEnv, id) != before {
			t.Fatalf("retry of %s changed the lease", what)
		}
	}
	conflict("a live lease", live.ID)
	conflict("a pending cleanup", l.ID)

	if l, err = db.MarkLeaseCleanup(ctx, le.pool, l.ID, l.Generation, false, "rm: device busy"); err != nil {
		t.Fatal(err)
	}
	failed := leaseRowJSON(le.testEnv, l.ID)
	for who, a := range map[string]actor{"viewer": le.r.Viewer, "board": le.r.Board} {
		if code, _ := retry(a, l.ID); code != http.StatusForbidden {
			t.Errorf("%s retry = %d, want 403", who, code)
		}
	}
	if code, _ := retry(le.r.Other, l.ID); code != http.StatusNotFound {
		t.Errorf("other company retry = %d, want 404", code)
	}
	if leaseRowJSON(le.testEnv, l.ID) != failed {
		t.Fatal("refused retries changed the lease")
	}
	if n := le.count(`SELECT count(*) FROM river_job WHERE kind = 'cleanup_lease'`); n != 0 {
		t.Fatalf("refused retries enqueued %d cleanup jobs", n)
	}
	code, out := retry(le.r.Admin, l.ID)
	if code != http.StatusAccepted || out["cleanup_status"] != "pending" || out["cleanup_attempts"] != float64(1) ||
		out["status"] != "released" || out["generation"] != float64(l.Generation) || out["failure_reason"] != "rm: device busy" {
		t.Fatalf("admin retry = %d %v", code, out)
	}
	if n := le.count(`SELECT count(*) FROM audit_events WHERE action = 'lease.cleanup_retried' AND target_id = $1
		AND actor_id = $2`, l.ID, le.r.Admin.User.ID); n != 1 {
		t.Errorf("lease.cleanup_retried events = %d", n)
	}
	if n := leaseCleanupJobs(le.testEnv, l.ID, l.Generation); n != 1 {
		t.Errorf("cleanup_lease jobs after the retry = %d, want 1", n)
	}
	conflict("a cleanup already pending again", l.ID)
	// The cleanup job works at the generation the retry returned.
	if l, err = db.MarkLeaseCleanup(ctx, le.pool, l.ID, l.Generation, true, ""); err != nil || l.CleanupAttempts != 2 {
		t.Fatalf("cleanup after the retry: %v %d", err, l.CleanupAttempts)
	}
	conflict("a succeeded cleanup", l.ID)

	// A process without a job client refuses, and changes nothing.
	plain := setup(t)
	pr := plain.roles()
	var leaseID string
	if err := plain.pool.QueryRow(ctx, `INSERT INTO environment_leases (company_id, status, generation, released_at,
		cleanup_status, cleanup_attempts, failure_reason) VALUES ($1, 'expired', 2, now(), 'failed', 3, 'gone') RETURNING id`,
		pr.A.ID).Scan(&leaseID); err != nil {
		t.Fatal(err)
	}
	before := leaseRowJSON(plain, leaseID)
	if code, out := plain.call(pr.Admin, http.MethodPost, "/api/leases/"+leaseID+"/retry-cleanup", nil); code != http.StatusServiceUnavailable {
		t.Fatalf("retry without a job client = %d %v, want 503", code, out)
	}
	if leaseRowJSON(plain, leaseID) != before {
		t.Fatal("a refused retry changed the lease")
	}
}

// TestLeaseListFiltersAndPagination: status (one, a comma list, live), environment, bad
// parameters, newest-first keyset pages, and a full 200-item page that still has a next page.
func TestLeaseListFiltersAndPagination(t *testing.T) {
	t.Parallel()
	le := setupLeaseEnv(t)
	ctx := context.Background()
	envA2 := le.environment(le.r.A.ID, "local-a2")
	active1 := le.lease(le.envA)
	active2 := le.lease(envA2)
	released := le.lease(le.envA)
	if _, err := db.ReleaseLease(ctx, le.pool, released, "done"); err != nil {
		t.Fatal(err)
	}
	failed := le.lease(envA2)
	if _, err := db.FailLease(ctx, le.pool, failed.ID, failed.Generation, "lost"); err != nil {
		t.Fatal(err)
	}
	expired := le.lease(le.envA)
	if _, err := le.pool.Exec(ctx, `UPDATE environment_leases SET expires_at = now() - interval '1 minute' WHERE id = $1`, expired.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := db.ExpireLeases(ctx, le.pool, 10); err != nil || len(got) != 1 {
		t.Fatalf("expire: %v %d", err, len(got))
	}
	le.lease(le.envB) // another company's: never listed for A

	// Newest first: created_at, then id (as the database orders them).
	var newest []string
	rows, err := le.pool.Query(ctx, `SELECT id::text FROM environment_leases WHERE company_id = $1
		ORDER BY created_at DESC, id DESC`, le.r.A.ID)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		newest = append(newest, id)
	}
	rows.Close()
	if len(newest) != 5 || newest[0] != expired.ID || newest[4] != active1.ID {
		t.Fatalf("company A's leases, newest first = %v", newest)
	}
	only := func(ids ...string) []string {
		return slices.DeleteFunc(slices.Clone(newest), func(id string) bool { return !slices.Contains(ids, id) })
	}
	list := func(query string) (int, map[string]any) {
		return le.call(le.r.Viewer, http.MethodGet, "/api/companies/"+le.r.A.ID+"/leases"+query, nil)
	}
	for query, want := range map[string][]string{
		"":                           newest,
		"?status=active":             only(active1.ID, active2.ID),
		"?status=live":               only(active1.ID, active2.ID),
		"?status=released,failed":    only(released.ID, failed.ID),
		"?status=failed,%20released": only(released.ID, failed.ID),
		"?status=expired":            {expired.ID},
		"?status=acquiring":          {},
		"?environment_id=" + envA2:   only(failed.ID, active2.ID),
		"?environment_id=" + envA2 + "&status=live": {active2.ID},
		"?environment_id=" + le.envB:                {},
	} {
		code, out := list(query)
		if code != http.StatusOK || !slices.Equal(leaseIDs(t, out), want) {
			t.Errorf("list%s = %d %v, want %v", query, code, out, want)
		}
	}
	for _, query := range []string{"?status=bogus", "?status=active,bogus", "?environment_id=nope", "?cursor=!!!",
		"?cursor=e30", "?limit=0", "?limit=201", "?limit=x"} {
		if code, _ := list(query); code != http.StatusBadRequest {
			t.Errorf("list%s = %d, want 400", query, code)
		}
	}

	// Keyset pages of 2 through a merged (multi-status) filter return everything once, in order.
	var got []string
	cursor := ""
	for range 10 {
		q := url.Values{"limit": {"2"}, "status": {"active,released,failed,expired"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		code, out := list("?" + q.Encode())
		if code != http.StatusOK {
			t.Fatalf("page = %d %v", code, out)
		}
		ids := leaseIDs(t, out)
		if len(ids) > 2 {
			t.Fatalf("page of %d items with limit 2", len(ids))
		}
		got = append(got, ids...)
		cursor, _ = out["next_cursor"].(string)
		if cursor == "" {
			break
		}
	}
	if !slices.Equal(got, newest) {
		t.Fatalf("paged = %v, want %v", got, newest)
	}

	// Company B gets 201 more leases: a page of 200 still says there is more.
	if _, err := le.pool.Exec(ctx, `INSERT INTO environment_leases (company_id, environment_id, status, generation,
			released_at, cleanup_status, created_at)
		SELECT $1, $2, 'released', 1, now(), 'succeeded', now() - g * interval '1 second' FROM generate_series(1, 201) g`,
		le.r.B.ID, le.envB); err != nil {
		t.Fatal(err)
	}
	code, out := le.call(le.r.Other, http.MethodGet, "/api/companies/"+le.r.B.ID+"/leases?limit=200", nil)
	next, _ := out["next_cursor"].(string)
	if code != http.StatusOK || len(leaseIDs(t, out)) != 200 || next == "" {
		t.Fatalf("first page of 202 = %d, %d items, next %q", code, len(leaseIDs(t, out)), next)
	}
	code, out = le.call(le.r.Other, http.MethodGet, "/api/companies/"+le.r.B.ID+"/leases?limit=200&cursor="+next, nil)
	if code != http.StatusOK || len(leaseIDs(t, out)) != 2 || out["next_cursor"] != "" {
		t.Fatalf("second page = %d %d %v", code, len(leaseIDs(t, out)), out["next_cursor"])
	}
}

// TestLeasePages: /leases shows every readable company's leases (a company column when there
// are several), filters, pages, escapes what it shows and never shows host paths; the detail page
// offers the admin actions to instance admins only; the empty state explains leases.
func TestLeasePages(t *testing.T) {
	t.Parallel()
	le := setupLeaseEnv(t)
	ctx := context.Background()
	evil := le.environment(le.r.A.ID, `<script>alert("env")</script>`)
	la := le.lease(evil)
	lb := le.lease(le.envB)
	ended := le.lease(le.envA)
	ended, err := db.ReleaseLease(ctx, le.pool, ended, "done")
	if err != nil {
		t.Fatal(err)
	}
	hostPath := "/srv/berth-secret-data/workspaces/ws-0123"
	if _, err := db.MarkLeaseCleanup(ctx, le.pool, ended.ID, ended.Generation, false,
		`<b>rm failed</b>: remove `+hostPath+`: device busy`); err != nil {
		t.Fatal(err)
	}

	if resp := le.do(le.client(), http.MethodGet, "/leases", nil, nil); resp.StatusCode != http.StatusSeeOther ||
		resp.Header.Get("Location") != "/login" {
		t.Fatalf("anonymous /leases = %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}

	get := func(c *http.Client, path string) (int, string) {
		t.Helper()
		resp := le.do(c, http.MethodGet, path, nil, nil)
		return resp.StatusCode, readBody(t, resp)
	}
	viewer, admin, other := le.browser(le.r.Viewer), le.browser(le.r.Admin), le.browser(le.r.Other)

	code, body := get(viewer, "/leases")
	if code != http.StatusOK || !strings.Contains(body, "/leases/"+la.ID) || !strings.Contains(body, "/leases/"+ended.ID) ||
		strings.Contains(body, "/leases/"+lb.ID) || !strings.Contains(body, "/runs/"+la.RunID) {
		t.Fatalf("viewer /leases = %d:\n%s", code, body)
	}
	if strings.Contains(body, "<th>Company</th>") {
		t.Error("a one-company reader sees a company column")
	}
	if strings.Contains(body, `<script>alert("env")`) || !strings.Contains(body, "&lt;script&gt;alert(") {
		t.Error("the environment name is not escaped on /leases")
	}
	if !strings.Contains(body, " s ago") {
		t.Error("/leases shows no heartbeat age")
	}
	code, body = get(admin, "/leases")
	if code != http.StatusOK || !strings.Contains(body, "/leases/"+la.ID) || !strings.Contains(body, "/leases/"+lb.ID) ||
		!strings.Contains(body, "<th>Company</th>") || !strings.Contains(body, "Beta") {
		t.Fatalf("admin /leases = %d:\n%s", code, body)
	}
	if _, body = get(other, "/leases"); strings.Contains(body, "/leases/"+la.ID) || !strings.Contains(body, "/leases/"+lb.ID) {
		t.Fatal("company B's board member sees the wrong leases")
	}

	// Filters.
	for path, want := range map[string][]string{
		"/leases?status=released":                            {ended.ID},
		"/leases?status=live":                                {la.ID, lb.ID},
		"/leases?environment_id=" + evil:                     {la.ID},
		"/leases?company_id=" + le.r.B.ID:                    {lb.ID},
		"/leases?environment_id=" + le.envB + "&status=live": {lb.ID},
	} {
		code, body := get(admin, path)
		if code != http.StatusOK {
			t.Fatalf("%s = %d", path, code)
		}
		for _, l := range []string{la.ID, lb.ID, ended.ID} {
			if strings.Contains(body, "/leases/"+l) != slices.Contains(want, l) {
				t.Errorf("%s: lease %s shown = %v", path, l, !slices.Contains(want, l))
			}
		}
	}
	if code, body := get(viewer, "/leases?environment_id="+le.envB); code != http.StatusOK ||
		strings.Contains(body, "/leases/"+lb.ID) || !strings.Contains(body, "No leases match") {
		t.Fatalf("viewer filtering on another company's environment = %d", code)
	}
	if code, _ := get(viewer, "/leases?status=bogus"); code != http.StatusBadRequest {
		t.Fatalf("bad status filter = %d", code)
	}
	code, body = get(admin, "/leases?limit=1")
	if code != http.StatusOK || !strings.Contains(body, "Older leases") || !strings.Contains(body, "cursor=") {
		t.Fatalf("paged /leases = %d", code)
	}

	// Detail: readers see it, only the instance admin gets the forms, another company gets 404.
	code, body = get(viewer, "/leases/"+ended.ID)
	if code != http.StatusOK || strings.Contains(body, `action="/leases/`+ended.ID+`/retry-cleanup"`) ||
		!strings.Contains(body, "Only an instance administrator") {
		t.Fatalf("viewer lease page = %d:\n%s", code, body)
	}
	if strings.Contains(body, hostPath) || strings.Contains(body, "/srv/") || !strings.Contains(body, "[path]") {
		t.Error("the lease page shows the host path of a cleanup error")
	}
	if strings.Contains(body, "<b>rm failed</b>") || !strings.Contains(body, "&lt;b&gt;rm failed&lt;/b&gt;") {
		t.Error("the failure reason is not escaped")
	}
	_, body = get(admin, "/leases/"+ended.ID)
	if !strings.Contains(body, `action="/leases/`+ended.ID+`/retry-cleanup"`) || strings.Contains(body, `/release"`) ||
		!strings.Contains(body, "data-confirm=") {
		t.Fatalf("admin page of a lease whose cleanup failed:\n%s", body)
	}
	_, body = get(admin, "/leases/"+la.ID)
	if !strings.Contains(body, `action="/leases/`+la.ID+`/release"`) || strings.Contains(body, "/retry-cleanup") ||
		strings.Contains(body, `<script>alert("env")`) {
		t.Fatalf("admin page of a live lease:\n%s", body)
	}
	if code, _ := get(other, "/leases/"+la.ID); code != http.StatusNotFound {
		t.Errorf("other company lease page = %d, want 404", code)
	}
	// The API does not leak the path either.
	if _, out := le.call(le.r.Viewer, http.MethodGet, "/api/leases/"+ended.ID, nil); strings.Contains(out["failure_reason"].(string), "/srv/") {
		t.Errorf("API failure_reason = %v", out["failure_reason"])
	}

	// Empty states: a company without leases, and a user without companies.
	c := le.company("Gamma", "gamma")
	lonely := le.actorWith("board@gamma.test", false, c.ID, "board")
	if code, body := get(le.browser(lonely), "/leases"); code != http.StatusOK || !strings.Contains(body, "No leases yet") ||
		!strings.Contains(body, "A lease is one run") {
		t.Fatalf("empty /leases = %d:\n%s", code, body)
	}
	nobody := le.actorWith("nobody@test.test", false, "", "")
	if code, body := get(le.browser(nobody), "/leases"); code != http.StatusOK || !strings.Contains(body, "not a member of any company") {
		t.Fatalf("/leases without companies = %d", code)
	}
}

// TestLeasePageForms: the force release and retry cleanup forms: members 403 and nothing changed,
// another company 404, the admin 303 back to the lease, and a lease that moved on shows why.
func TestLeasePageForms(t *testing.T) {
	t.Parallel()
	le := setupLeaseEnv(t)
	ctx := context.Background()
	l := le.lease(le.envA)
	viewer, board, admin, other := le.browser(le.r.Viewer), le.browser(le.r.Board), le.browser(le.r.Admin), le.browser(le.r.Other)

	before := leaseRowJSON(le.testEnv, l.ID)
	for who, c := range map[string]*http.Client{"viewer": viewer, "board": board} {
		if resp := le.leaseForm(c, "/leases/"+l.ID+"/release"); resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s release form = %d, want 403", who, resp.StatusCode)
		}
	}
	if resp := le.leaseForm(other, "/leases/"+l.ID+"/release"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("other company release form = %d, want 404", resp.StatusCode)
	}
	if leaseRowJSON(le.testEnv, l.ID) != before {
		t.Fatal("refused forms changed the lease")
	}
	resp := le.leaseForm(admin, "/leases/"+l.ID+"/release")
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/leases/"+l.ID {
		t.Fatalf("admin release form = %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	cur, err := db.LeaseByID(ctx, le.pool, le.r.A.ID, l.ID)
	if err != nil || cur.Status != db.LeaseReleased || cur.Generation != l.Generation+1 {
		t.Fatalf("after the form: %v %+v", err, cur)
	}
	if n := leaseCleanupJobs(le.testEnv, l.ID, cur.Generation); n != 1 {
		t.Fatalf("cleanup_lease jobs after the release form = %d", n)
	}
	resp = le.leaseForm(admin, "/leases/"+l.ID+"/release")
	if body := readBody(t, resp); resp.StatusCode != http.StatusConflict || !strings.Contains(body, "already ended") {
		t.Fatalf("second release form = %d:\n%s", resp.StatusCode, body)
	}

	// Retry cleanup from the page.
	if _, err := db.MarkLeaseCleanup(ctx, le.pool, l.ID, cur.Generation, false, "busy"); err != nil {
		t.Fatal(err)
	}
	before = leaseRowJSON(le.testEnv, l.ID)
	if resp := le.leaseForm(viewer, "/leases/"+l.ID+"/retry-cleanup"); resp.StatusCode != http.StatusForbidden {
		t.Errorf("viewer retry form = %d, want 403", resp.StatusCode)
	}
	if leaseRowJSON(le.testEnv, l.ID) != before {
		t.Fatal("a refused retry form changed the lease")
	}
	resp = le.leaseForm(admin, "/leases/"+l.ID+"/retry-cleanup")
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("admin retry form = %d", resp.StatusCode)
	}
	if cur, _ = db.LeaseByID(ctx, le.pool, le.r.A.ID, l.ID); cur.CleanupStatus != db.LeaseCleanupPending {
		t.Fatalf("cleanup after the retry form = %s", cur.CleanupStatus)
	}
	resp = le.leaseForm(admin, "/leases/"+l.ID+"/retry-cleanup")
	if body := readBody(t, resp); resp.StatusCode != http.StatusConflict || !strings.Contains(body, "cleanup failed") {
		t.Fatalf("second retry form = %d:\n%s", resp.StatusCode, body)
	}
}

// TestLeaseRedactHostPaths: absolute and home paths in messages are replaced, the rest kept.
func TestLeaseRedactHostPaths(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":              "",
		"run succeeded": "run succeeded",
		"expired: no heartbeat before expires_at": "expired: no heartbeat before expires_at",
		"remove /var/lib/berth/ws-1: busy":        "remove [path]: busy",
		"/etc/passwd":                             "[path]",
		`open "/root/.ssh/id_ed25519".`:           `open "[path]".`,
		"cd ~/secret and retry":                   "cd [path] and retry",
		"a/b relative stays":                      "a/b relative stays",
		"either / or":                             "either / or",
		"path=/tmp/x,other=/opt/y":                "path=[path],other=[path]",
	} {
		if got := redactHostPaths(in); got != want {
			t.Errorf("redactHostPaths(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestLeaseHumanDuration: the ages the pages show.
func TestLeaseHumanDuration(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		-time.Second:                  "0 s",
		12 * time.Second:              "12 s",
		3*time.Minute + 5*time.Second: "3 min 5 s",
		42 * time.Minute:              "42 min",
		2*time.Hour + 10*time.Minute:  "2 h 10 min",
		100 * time.Hour:               "4 d",
	} {
		if got := humanDuration(d); got != want {
			t.Errorf("humanDuration(%v) = %q, want %q", d, got, want)
		}
	}
}
