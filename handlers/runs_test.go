package handlers

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"berth/db"
	"berth/environment"
	"berth/environment/jail"
	"berth/environment/jail/jailtest"
	"berth/environment/netns"
	"berth/jobs"
	"berth/workspace"

	"berth/environment/datadir"
)

// runEnv is a server whose River client works jobs, with a project ready to run: a local
// environment, a primary git workspace and a board member with a token.
type runEnv struct {
	*testEnv
	r       roles
	repo    string
	project string
	dataDir string
}

func setupRuns(t testing.TB, opts ...func(*Deps)) *runEnv {
	t.Helper()
	return setupRunsWorkers(t, nil, opts...)
}

// setupRunsWorkers is setupRuns whose workers' deps workers changes first (their own pool, a
// lease TTL), when it is not nil.
func setupRunsWorkers(t testing.TB, workers func(*jobs.Deps), opts ...func(*Deps)) *runEnv {
	t.Helper()
	dataDir := jailtest.Dir(t) // commands run in the jail, which hides /tmp and must reach these
	host, err := jail.Detect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	e := setup(t, append([]func(*Deps){func(d *Deps) {
		mgr, err := workspace.NewManager(dataDir, workspace.Options{Jail: &host})
		if err != nil {
			t.Fatal(err)
		}
		artifacts, err := workspace.NewArtifacts(dataDir)
		if err != nil {
			t.Fatal(err)
		}
		jd := jobs.Deps{Pool: d.Pool, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Workspaces: mgr, Artifacts: artifacts, APIURL: "http://127.0.0.1:1", NodeID: "test", Secrets: d.Secrets, ReceiptKey: d.ReceiptKey,
			HomeDir: filepath.Join(dataDir, "homes"), Jail: &host, Data: datadir.At(dataDir)}
		eg, err := jobs.NewEgress(d.Pool, d.Secrets, datadir.At(dataDir), nil)
		if err != nil {
			t.Fatal(err)
		}
		jd.Egress, d.OnEnvironmentChange = eg, eg.Invalidate
		if netns.Available() { // every workspace's jails in a network namespace, as cmd/berth does as root
			nets, err := netns.NewNetworks(netns.Serve(nil, eg.Proxy))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nets.Close)
			jd.Networks = nets
		}
		if workers != nil {
			workers(&jd)
		}
		jd.Services = jobs.NewServices(jd) // shared with the preview proxy, as cmd/berth does
		t.Cleanup(jd.Services.Close)
		d.LocalServices, d.DialService = jd.Services, jd.Services.DialService
		client, err := jobs.NewClient(jd, jobs.ClientOptions{Work: true, MaxWorkers: 4})
		if err != nil {
			t.Fatal(err)
		}
		if err := client.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = client.Stop(ctx)
		})
		d.Jobs = client
		d.Workspaces = mgr
	}}, opts...)...) // then the caller's options
	re := &runEnv{testEnv: e, r: e.roles(), repo: jailtest.Dir(t), dataDir: dataDir}
	git := func(args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = re.repo
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	git("init", "-q", "--initial-branch=main")
	if err := os.WriteFile(filepath.Join(re.repo, "README.md"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git("add", "-A")
	git("-c", "user.name=T", "-c", "user.email=t@example.com", "commit", "-qm", "init")

	ctx := context.Background()
	doc, err := environment.Config{Driver: "local"}.Document()
	if err != nil {
		t.Fatal(err)
	}
	env, err := db.CreateEnvironment(ctx, e.pool, db.NewEnvironment{ID: "6f0d3a52-7a0f-4e47-9d43-000000000001", CompanyID: re.r.A.ID,
		Name: "local", Driver: "local", Config: doc})
	if err != nil {
		t.Fatal(err)
	}
	p, err := db.CreateProject(ctx, e.pool, re.r.A.ID, db.ProjectFields{Name: "P", Key: "PRJ", Policy: db.ExecutionPolicy{
		DefaultMode: "isolated", EnvironmentID: env.ID, Strategy: "git_worktree", BranchTemplate: "berth/{task_key}"}})
	if err != nil {
		t.Fatal(err)
	}
	re.project = p.ID
	return re
}

// workspaceWith adds the primary git workspace, with an optional setup command.
func (re *runEnv) workspaceWith(setup string) {
	re.t.Helper()
	ctx := context.Background()
	ws, err := db.CreateProjectWorkspace(ctx, re.pool, re.r.A.ID, re.project, db.ProjectWorkspaceFields{Name: "main",
		SourceType: "git", Source: re.repo, DefaultRef: "main", SetupCommand: setup})
	if err != nil {
		re.t.Fatal(err)
	}
	if _, err := db.SetPrimaryProjectWorkspace(ctx, re.pool, re.r.A.ID, re.project, ws.ID); err != nil {
		re.t.Fatal(err)
	}
}

// task creates a task with a command.
func (re *runEnv) task(command string) db.Task {
	re.t.Helper()
	t, err := db.CreateTask(context.Background(), re.pool, re.r.A.ID, re.project, re.r.Board.User.ID,
		db.TaskFields{Title: "T", Command: command, Trust: "standard", WorkspaceMode: "inherit"})
	if err != nil {
		re.t.Fatal(err)
	}
	return t
}

// start admits a run through the API.
func (re *runEnv) start(taskID string, body any) string {
	re.t.Helper()
	code, out := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+taskID+"/runs", body)
	if code != http.StatusAccepted || out["status"] != "queued" {
		re.t.Fatalf("start run = %d %v", code, out)
	}
	return out["id"].(string)
}

// waitRun polls the run until cond holds or the deadline passes.
func (re *runEnv) waitRun(id string, what string, cond func(map[string]any) bool) map[string]any {
	re.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		_, run := re.call(re.r.Viewer, http.MethodGet, "/api/runs/"+id, nil)
		if cond(run) {
			return run
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, run := re.call(re.r.Viewer, http.MethodGet, "/api/runs/"+id, nil)
	re.t.Fatalf("run %s: %s did not happen within 90 s: %v", id, what, run)
	return nil
}

func ended(run map[string]any) bool {
	s, _ := run["status"].(string)
	return s == "succeeded" || s == "failed" || s == "cancelled" || s == "timed_out"
}

// settled waits for the run's workspace finalize to settle and its lease to leave active.
func (re *runEnv) settled(run map[string]any) (finalize, lease string) {
	re.t.Helper()
	ws, _ := run["execution_workspace_id"].(string)
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		_ = re.pool.QueryRow(context.Background(), `SELECT finalize_state FROM execution_workspaces WHERE id = $1`, ws).Scan(&finalize)
		_ = re.pool.QueryRow(context.Background(), `SELECT status FROM environment_leases WHERE run_id = $1`, run["id"]).Scan(&lease)
		if finalize == "settled" || finalize == "failed" {
			return finalize, lease
		}
		time.Sleep(100 * time.Millisecond)
	}
	re.t.Fatalf("finalize of run %v did not settle: %q", run["id"], finalize)
	return
}

func (re *runEnv) log(id string) string {
	re.t.Helper()
	resp := re.do(re.client(), http.MethodGet, "/api/runs/"+id+"/log", nil, map[string]string{"Authorization": "Bearer " + re.r.Viewer.Token})
	return readBody(re.t, resp)
}

// TestRunHappyPath: isolated worktree → command → commit on the task branch → work products →
// lease released → finalize settled.
func TestRunHappyPath(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("echo setting up > setup.txt")
	task := re.task(`echo "hello from $BERTH_TASK_ID"; test -n "$BERTH_RUN_TOKEN" && test -z "$DATABASE_URL" && echo work > result.txt`)
	id := re.start(task.ID, nil)
	run := re.waitRun(id, "the end", ended)
	if run["status"] != "succeeded" || run["exit_code"] != float64(0) {
		t.Fatalf("run = %v", run)
	}
	if log := re.log(id); !strings.Contains(log, "hello from "+task.ID) {
		t.Fatalf("log = %q", log)
	}
	if fin, lease := re.settled(run); fin != "settled" || lease != "released" {
		t.Fatalf("finalize %q, lease %q; want settled and released", fin, lease)
	}
	out, err := exec.Command("git", "-C", re.repo, "show", "--stat", "--format=%s", "berth/PRJ-1").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "result.txt") || !strings.Contains(string(out), "setup.txt") {
		t.Fatalf("task branch commit: %v\n%s", err, out)
	}
	var kinds []string
	rows, _ := re.pool.Query(context.Background(), `SELECT kind FROM work_products WHERE run_id = $1 ORDER BY kind`, id)
	for rows.Next() {
		var k string
		_ = rows.Scan(&k)
		kinds = append(kinds, k)
	}
	rows.Close()
	if strings.Join(kinds, ",") != "branch,commit" {
		t.Fatalf("work products = %v", kinds)
	}
	var phases string
	_ = re.pool.QueryRow(context.Background(), `SELECT string_agg(phase || ':' || status, ',' ORDER BY started_at)
		FROM workspace_operations WHERE run_id = $1`, id).Scan(&phases)
	if phases != "realize:succeeded,setup:succeeded,finalize:succeeded" {
		t.Fatalf("operations = %s", phases)
	}
	// A second run of the task continues in the same workspace and commits on the same branch.
	id2 := re.start(task.ID, nil)
	run2 := re.waitRun(id2, "the second run's end", ended)
	if run2["status"] != "succeeded" || run2["execution_workspace_id"] != run["execution_workspace_id"] {
		t.Fatalf("second run = %v, want success in workspace %v", run2, run["execution_workspace_id"])
	}
	if fin, lease := re.settled(run2); fin != "settled" || lease != "released" {
		t.Fatalf("second run: finalize %q, lease %q", fin, lease)
	}
	// A viewer browses the run's execution workspace (not the project's own directories).
	code, roots := re.call(re.r.Viewer, http.MethodGet, "/api/tasks/"+task.ID+"/file-resources/roots", nil)
	items, _ := roots["items"].([]any)
	if code != http.StatusOK || len(items) != 1 || !strings.HasPrefix(items[0].(map[string]any)["name"].(string), "execution-workspace:") {
		t.Fatalf("viewer roots = %d %v", code, roots)
	}
	code, content := re.call(re.r.Viewer, http.MethodGet, "/api/tasks/"+task.ID+"/file-resources/content?path=result.txt", nil)
	if code != http.StatusOK || content["content"] != "work\n" {
		t.Fatalf("viewer reads result.txt = %d %v", code, content)
	}
	// The run page shows the log to a viewer.
	resp := re.do(re.browser(re.r.Viewer), http.MethodGet, "/runs/"+id, nil, nil)
	if body := readBody(t, resp); resp.StatusCode != 200 || !strings.Contains(body, "hello from") {
		t.Fatalf("run page = %d", resp.StatusCode)
	}
}

// TestRunFailures: a failing command, a failing setup (the command never runs), a timeout and a
// cancel all end the run with the right status and still settle finalize and release the lease.
func TestRunFailures(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith(`test ! -e /nonexistent-marker || exit 0; [ "$FAIL_SETUP" = "" ]`)

	failing := re.task("echo partial > partial.txt; exit 3")
	id := re.start(failing.ID, nil)
	run := re.waitRun(id, "the end", ended)
	if run["status"] != "failed" || run["error_code"] != "command_failed" || run["exit_code"] != float64(3) {
		t.Fatalf("failing command: %v", run)
	}
	if fin, lease := re.settled(run); fin != "settled" || lease != "released" {
		t.Fatalf("failing command: finalize %q lease %q", fin, lease)
	}

	timeout := re.task("sleep 30")
	id = re.start(timeout.ID, map[string]any{"timeout_s": 1})
	run = re.waitRun(id, "the timeout", ended)
	if run["status"] != "timed_out" {
		t.Fatalf("timeout: %v", run)
	}
	if fin, lease := re.settled(run); fin != "settled" || lease != "released" {
		t.Fatalf("timeout: finalize %q lease %q", fin, lease)
	}

	cancel := re.task("echo started; sleep 30")
	id = re.start(cancel.ID, nil)
	re.waitRun(id, "the command start", func(r map[string]any) bool { return r["status"] == "running" })
	if code, out := re.call(re.r.Viewer, http.MethodPost, "/api/runs/"+id+"/cancel", nil); code != http.StatusForbidden {
		t.Fatalf("viewer cancel = %d %v", code, out)
	}
	if code, out := re.call(re.r.Board, http.MethodPost, "/api/runs/"+id+"/cancel", nil); code != http.StatusAccepted {
		t.Fatalf("cancel = %d %v", code, out)
	}
	run = re.waitRun(id, "the cancel", ended)
	if run["status"] != "cancelled" {
		t.Fatalf("cancel: %v", run)
	}
	if code, _ := re.call(re.r.Board, http.MethodPost, "/api/runs/"+id+"/cancel", nil); code != http.StatusConflict {
		t.Fatalf("cancel after the end = %d, want 409", code)
	}
	if pids, _ := environment.FindTagged(id); len(pids) != 0 {
		t.Fatalf("processes of the cancelled run still run: %v", pids)
	}
}

// TestRunSetupFailure: the setup step fails, the command never runs.
func TestRunSetupFailure(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("echo broken setup; exit 7")
	marker := filepath.Join(t.TempDir(), "ran")
	task := re.task("touch " + marker)
	id := re.start(task.ID, nil)
	run := re.waitRun(id, "the end", ended)
	if run["status"] != "failed" || run["error_code"] != "setup_failed" {
		t.Fatalf("setup failure: %v", run)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran although setup failed")
	}
	var status string
	var exit *int
	_ = re.pool.QueryRow(context.Background(), `SELECT status, exit_code FROM workspace_operations WHERE run_id = $1 AND phase = 'setup'`, id).Scan(&status, &exit)
	if status != "failed" || exit == nil || *exit != 7 {
		t.Fatalf("setup operation: %s %v", status, exit)
	}
	if fin, lease := re.settled(run); fin != "settled" || lease != "released" {
		t.Fatalf("setup failure: finalize %q lease %q", fin, lease)
	}
}

// TestRunAdmission: a blocked plan records a failed run and provisions nothing; roles; no command.
func TestRunAdmission(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	task := re.task("true") // no primary workspace yet: configuration_incomplete
	code, out := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/runs", nil)
	errObj, _ := out["error"].(map[string]any)
	if code != http.StatusConflict || errObj["code"] != "configuration_incomplete" || errObj["run"] == nil || errObj["blockers"] == nil {
		t.Fatalf("blocked admission = %d %v", code, out)
	}
	if n := re.count(`SELECT count(*) FROM river_job WHERE kind = 'provision'`); n != 0 {
		t.Fatalf("a blocked plan enqueued %d provision jobs", n)
	}
	if n := re.count(`SELECT count(*) FROM runs WHERE status = 'failed' AND error_code = 'configuration_incomplete'`); n != 1 {
		t.Fatalf("blocked runs recorded = %d", n)
	}
	for who, a := range map[string]actor{"viewer": re.r.Viewer, "admin": re.r.Admin} {
		if code, _ := re.call(a, http.MethodPost, "/api/tasks/"+task.ID+"/runs", nil); code != http.StatusForbidden {
			t.Errorf("%s start = %d, want 403", who, code)
		}
	}
	if code, _ := re.call(re.r.Other, http.MethodPost, "/api/tasks/"+task.ID+"/runs", nil); code != http.StatusNotFound {
		t.Errorf("other company start = %d, want 404", code)
	}
	empty := re.task("")
	re.workspaceWith("")
	if code, out := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+empty.ID+"/runs", nil); code != http.StatusUnprocessableEntity {
		t.Fatalf("task without a command = %d %v", code, out)
	}
	if code, _ := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/runs", map[string]any{"timeout_s": 0}); code != http.StatusUnprocessableEntity {
		t.Fatalf("timeout 0 = %d", code)
	}
}

// TestRunCopyWorkspaceArtifact: an isolated copy of a directory source; finalize packs the result
// into the artifact store and records it, with the changed paths, as a work product.
func TestRunCopyWorkspaceArtifact(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "notes.txt"), []byte("v1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ws, err := db.CreateProjectWorkspace(ctx, re.pool, re.r.A.ID, re.project, db.ProjectWorkspaceFields{Name: "dir",
		SourceType: "directory", Source: src})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.SetPrimaryProjectWorkspace(ctx, re.pool, re.r.A.ID, re.project, ws.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := re.pool.Exec(ctx, `UPDATE projects SET execution_policy = execution_policy || '{"strategy":"copy"}'`); err != nil {
		t.Fatal(err)
	}
	task := re.task("echo v2 > notes.txt && echo new > added.txt")
	id := re.start(task.ID, nil)
	run := re.waitRun(id, "the end", ended)
	if run["status"] != "succeeded" {
		t.Fatalf("run = %v", run)
	}
	if fin, lease := re.settled(run); fin != "settled" || lease != "released" {
		t.Fatalf("finalize %q lease %q", fin, lease)
	}
	var ref string
	var meta map[string]any
	if err := re.pool.QueryRow(ctx, `SELECT ref, metadata FROM work_products WHERE run_id = $1 AND kind = 'artifact'`, id).Scan(&ref, &meta); err != nil {
		t.Fatalf("artifact work product: %v", err)
	}
	digest, ok := strings.CutPrefix(ref, "sha256:")
	if !ok || len(digest) != 64 {
		t.Fatalf("artifact ref = %q", ref)
	}
	if _, err := os.Stat(filepath.Join(re.dataDir, "artifacts", digest)); err != nil {
		t.Fatalf("the capsule is not in the artifact store: %v", err)
	}
	if fmt.Sprint(meta["added"]) != "[added.txt]" || fmt.Sprint(meta["modified"]) != "[notes.txt]" {
		t.Fatalf("changed paths = added %v modified %v", meta["added"], meta["modified"])
	}
	if b, _ := os.ReadFile(filepath.Join(src, "notes.txt")); string(b) != "v1\n" {
		t.Fatalf("the source directory was changed: %q", b)
	}
}

// TestRunCommitsInTheJail: a run's own git work works inside the jail (status, commit on its task
// branch); finalize brings the commit home onto the task branch in the source repository, while
// the run could move no other ref and wrote nothing into the source's own files.
func TestRunCommitsInTheJail(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	mainBefore := gitOut(t, re.repo, "rev-parse", "refs/heads/main")
	task := re.task(`git status --porcelain && echo agent > agent.txt && git add agent.txt && ` +
		`git -c user.name=agent -c user.email=agent@example.com commit -qm "work from the agent" && ` +
		`! git update-ref refs/heads/main HEAD 2>/dev/null && ! touch "$(git rev-parse --git-common-dir)/planted" 2>/dev/null && ` +
		`echo uncommitted > later.txt`)
	id := re.start(task.ID, nil)
	run := re.waitRun(id, "the end", ended)
	if run["status"] != "succeeded" {
		_, logText := re.call(re.r.Board, http.MethodGet, "/api/runs/"+id+"/log", nil)
		t.Fatalf("run = %v log %v", run, logText)
	}
	if fin, _ := re.settled(run); fin != "settled" {
		t.Fatalf("finalize = %q", fin)
	}
	log := gitOut(t, re.repo, "log", "--format=%s", "berth/PRJ-1")
	if !strings.Contains(log, "work from the agent") || !strings.Contains(log, "work from run") {
		t.Fatalf("task branch log %q: want the agent's commit and finalize's on top", log)
	}
	if got := gitOut(t, re.repo, "show", "berth/PRJ-1:agent.txt"); got != "agent" {
		t.Fatalf("agent.txt on the branch = %q", got)
	}
	if got := gitOut(t, re.repo, "show", "berth/PRJ-1:later.txt"); got != "uncommitted" {
		t.Fatalf("later.txt on the branch = %q", got)
	}
	if got := gitOut(t, re.repo, "rev-parse", "refs/heads/main"); got != mainBefore {
		t.Fatalf("main moved from %s to %s", mainBefore, got)
	}
	if _, err := os.Stat(filepath.Join(re.repo, ".git", "planted")); err == nil {
		t.Fatal("the run wrote into the source repository's git dir")
	}
	if out, err := exec.Command("git", "-C", re.repo, "fsck", "--no-dangling").CombinedOutput(); err != nil {
		t.Fatalf("source repository after the run: %v %s", err, out)
	}
}

func gitOut(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).Output()
	if err != nil {
		t.Fatalf("git %v: %v", args, err)
	}
	return strings.TrimSpace(string(out))
}

// useSandbox adds a sandbox environment with its image version 1 (the empty layer, active) and
// makes it the project's environment.
func (re *runEnv) useSandbox(cfg environment.SandboxConfig) string {
	re.t.Helper()
	ctx := context.Background()
	doc, err := environment.Config{Driver: "sandbox", Sandbox: cfg}.Document()
	if err != nil {
		re.t.Fatal(err)
	}
	env, err := db.CreateEnvironment(ctx, re.pool, db.NewEnvironment{ID: "6f0d3a52-7a0f-4e47-9d43-000000000002", CompanyID: re.r.A.ID,
		Name: "sandbox", Driver: "sandbox", Config: doc})
	if err != nil {
		re.t.Fatal(err)
	}
	if _, err := db.CreateImageVersion(ctx, re.pool, db.NewImageVersion{CompanyID: re.r.A.ID, EnvironmentID: env.ID,
		Digest: workspace.Manifest{}.Digest(), Status: db.ImageActive}); err != nil {
		re.t.Fatal(err)
	}
	if _, err := re.pool.Exec(ctx, `UPDATE projects SET execution_policy = jsonb_set(execution_policy, '{environment_id}', to_jsonb($1::text))
		WHERE id = $2`, env.ID, re.project); err != nil {
		re.t.Fatal(err)
	}
	return env.ID
}

// TestRunSandboxLowTrust: a low-trust task runs in the sandbox (the sandbox user, /workspace, no data
// dir, no network), and finalize commits what it wrote on the task branch.
func TestRunSandboxLowTrust(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	re.useSandbox(environment.SandboxConfig{MemoryMB: 512, PidsMax: 256, TimeoutS: 120})
	task := re.task(`id -u > who.txt && pwd >> who.txt && ! ls ` + re.dataDir + ` 2>/dev/null && ! ls /root 2>/dev/null && ` +
		`! python3 -c 'import socket; socket.create_connection(("127.0.0.1", 1), 1)' 2>/dev/null && echo done`)
	if _, err := re.pool.Exec(context.Background(), `UPDATE tasks SET trust = 'low' WHERE id = $1`, task.ID); err != nil {
		t.Fatal(err)
	}
	id := re.start(task.ID, nil)
	run := re.waitRun(id, "the end", ended)
	if run["status"] != "succeeded" {
		_, logText := re.call(re.r.Board, http.MethodGet, "/api/runs/"+id+"/log", nil)
		t.Fatalf("run = %v log %v", run, logText)
	}
	if fin, _ := re.settled(run); fin != "settled" {
		t.Fatalf("finalize = %q", fin)
	}
	host, _ := jail.Detect(context.Background())
	if got, want := gitOut(t, re.repo, "show", "berth/PRJ-1:who.txt"), fmt.Sprintf("%d\n/workspace", host.SandboxUser().UID); got != want {
		t.Fatalf("who.txt on the task branch = %q", got)
	}
}
