package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"berth/db"
	"berth/db/dbtest"
	"berth/environment"
	"berth/environment/jail/jailtest"
	"berth/jobs"
	"berth/workspace"
)

// Crash recovery end to end (DESIGN §8 Runs): a real `berth worker` process is SIGKILLed while
// a run's command (or its setup command) runs; a second worker with the same node id starts, and
// the run must leave its live status as failed/orphaned within 2 minutes, with no process of it
// left, its lease not active, finalize settled, and nothing executed twice, even once River
// rescues the dead worker's job and retries it.

// crashNode is the node id both workers of a test share, as a restarted node would.
const crashNode = "crash-node"

// crashWorld is a database with a company, a local environment and a project on a git
// repository, and a data directory for its workers.
type crashWorld struct {
	t                      testing.TB
	conn                   string
	pool                   *pgxpool.Pool
	company, user, project string
	dataDir                string
	ins                    *river.Client[pgx.Tx]
}

func newCrashWorld(t testing.TB, setup string) *crashWorld {
	t.Helper()
	return crashWorldOn(t, dbtest.ConnString(t), jailtest.Dir(t), setup)
}

// crashWorldOn seeds the database at conn (migrated) with a crash world's company, board member,
// local environment and project; the project workspace runs setup ("" for none).
func crashWorldOn(t testing.TB, conn, dataDir, setup string) *crashWorld {
	t.Helper()
	ctx := context.Background()
	w := &crashWorld{t: t, conn: conn, dataDir: dataDir}
	pool, err := db.Open(ctx, w.conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	w.pool = pool
	co, err := db.CreateCompany(ctx, pool, "Acme", "acme")
	if err != nil {
		t.Fatal(err)
	}
	w.company = co.ID
	u, err := db.CreateUser(ctx, pool, "board@example.com", "x", false)
	if err != nil {
		t.Fatal(err)
	}
	w.user = u.ID
	if _, err := db.AddMember(ctx, pool, co.ID, u.ID, db.RoleBoard); err != nil {
		t.Fatal(err)
	}

	repo := jailtest.Dir(t)
	git := func(args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	git("init", "-q", "--initial-branch=main")
	if err := os.WriteFile(filepath.Join(repo, "README.md"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git("add", "-A")
	git("-c", "user.name=T", "-c", "user.email=t@example.com", "commit", "-qm", "init")

	doc, err := environment.Config{Driver: "local"}.Document()
	if err != nil {
		t.Fatal(err)
	}
	env, err := db.CreateEnvironment(ctx, pool, db.NewEnvironment{ID: "6f0d3a52-7a0f-4e47-9d43-00000000c0de",
		CompanyID: w.company, Name: "local", Driver: "local", Config: doc})
	if err != nil {
		t.Fatal(err)
	}
	p, err := db.CreateProject(ctx, pool, w.company, db.ProjectFields{Name: "P", Key: "PRJ", Policy: db.ExecutionPolicy{
		DefaultMode: "isolated", EnvironmentID: env.ID, Strategy: "git_worktree", BranchTemplate: "berth/{task_key}"}})
	if err != nil {
		t.Fatal(err)
	}
	w.project = p.ID
	pw, err := db.CreateProjectWorkspace(ctx, pool, w.company, p.ID, db.ProjectWorkspaceFields{Name: "main",
		SourceType: "git", Source: repo, DefaultRef: "main", SetupCommand: setup})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.SetPrimaryProjectWorkspace(ctx, pool, w.company, p.ID, pw.ID); err != nil {
		t.Fatal(err)
	}
	w.ins, err = jobs.NewClient(jobs.Deps{Pool: pool, Log: slog.New(slog.DiscardHandler)}, jobs.ClientOptions{Work: false})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// admit creates a task with command and admits a run of it the way POST /api/tasks/{id}/runs
// does: the resolved plan on a queued run and its provision job, in one transaction.
func (w *crashWorld) admit(command string) (taskID, runID string) {
	w.t.Helper()
	ctx := context.Background()
	task, err := db.CreateTask(ctx, w.pool, w.company, w.project, w.user, db.TaskFields{Title: "T", Command: command,
		Trust: "standard", WorkspaceMode: "inherit"})
	if err != nil {
		w.t.Fatal(err)
	}
	err = db.InTx(ctx, w.pool, func(tx pgx.Tx) error {
		snap, err := db.LoadPlanSnapshot(ctx, tx, w.company, task.ID)
		if err != nil {
			return err
		}
		plan := workspace.ResolvePlan(crashPlanInput(snap))
		if plan.Blocked {
			return errors.New("the plan is blocked")
		}
		b, err := json.Marshal(plan)
		if err != nil {
			return err
		}
		run, err := db.CreateRun(ctx, tx, db.NewRun{CompanyID: w.company, TaskID: task.ID, EnvironmentID: plan.EnvironmentID,
			CreatedBy: w.user, Command: command, Plan: b, TimeoutS: 3600})
		if err != nil {
			return err
		}
		runID = run.ID
		_, err = w.ins.InsertTx(ctx, tx, jobs.ProvisionArgs{RunID: run.ID}, nil)
		return err
	})
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { _, _ = environment.KillTagged(context.Background(), runID, time.Second) })
	return task.ID, runID
}

// crashPlanInput is handlers.planInput: a task's snapshot as the resolver's input.
func crashPlanInput(s db.PlanSnapshot) workspace.PlanInput {
	in := workspace.PlanInput{ProjectID: s.Task.ProjectID,
		Policy: workspace.ProjectPolicy{DefaultMode: s.Policy.DefaultMode, AllowTaskOverride: s.Policy.AllowTaskOverride,
			EnvironmentID: s.Policy.EnvironmentID, Strategy: s.Policy.Strategy, BranchTemplate: s.Policy.BranchTemplate},
		TaskKey: s.Task.Key, TaskTrust: s.Task.Trust, TaskMode: s.Task.WorkspaceMode, TaskEnvID: s.Task.EnvironmentID,
		PrimarySource: s.PrimarySource, Environments: map[string]workspace.PlanEnvironment{}}
	for _, e := range s.Environments {
		in.Environments[e.ID] = workspace.PlanEnvironment{ID: e.ID, Name: e.Name, Driver: e.Driver,
			Archived: e.Status != "active", Qualified: e.Qualified}
	}
	if s.Binding.Revision > 0 {
		in.BindingMode, in.BindingTargetID = s.Binding.Mode, s.Binding.ExecutionWorkspaceID
	}
	if t := s.Target; t != nil {
		in.BindingTarget = &workspace.PlanWorkspace{ID: t.ID, ProjectID: t.ProjectID, Mode: t.Mode, Trust: t.Trust,
			Status: t.Status, Reusable: t.Reusable}
	}
	return in
}

// worker is a running `berth worker` process.
type worker struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

// startWorker starts `berth worker` on the world's database and data directory as crashNode.
func (w *crashWorld) startWorker() *worker {
	w.t.Helper()
	cmd := berthProc(w.t, map[string]string{"DATABASE_URL": w.conn, "BERTH_DATA_DIR": w.dataDir,
		"BERTH_NODE_ID": crashNode, "BERTH_LOG_LEVEL": "info"}, "", "worker")
	p := &worker{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	w.t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
		if w.t.Failed() {
			w.t.Logf("worker %d output:\n%s", cmd.Process.Pid, p.out.String())
		}
	})
	return p
}

// crash SIGKILLs the worker process alone (not its process group) and reaps it.
func (w *crashWorld) crash(p *worker) {
	w.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		w.t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		w.t.Fatal("the SIGKILLed worker did not exit")
	}
}

// waitFor polls cond every 100 ms until it holds or within passes.
func (w *crashWorld) waitFor(what string, within time.Duration, cond func() bool) {
	w.t.Helper()
	waitUntil(w.t, what, within, cond)
}

func (w *crashWorld) run(id string) db.Run {
	w.t.Helper()
	return runRow(w.t, w.pool, id)
}

func (w *crashWorld) count(sql string, args ...any) int {
	w.t.Helper()
	return countRows(w.t, w.pool, sql, args...)
}

// inWorkspace is the path of name in the world's one execution workspace, looked up when called
// ("" while there is none yet).
func (w *crashWorld) inWorkspace(name string) func() string {
	return func() string {
		found, _ := filepath.Glob(filepath.Join(w.dataDir, "workspaces", "ws-*", name))
		if len(found) != 1 {
			return filepath.Join(w.dataDir, "no-workspace-yet", name)
		}
		return found[0]
	}
}

// lines counts the lines of a marker file ("" and missing: 0).
func lines(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

// survivors lists the command names of the live processes tagged with runID.
func survivors(t testing.TB, runID string) []string {
	t.Helper()
	pids, err := environment.FindTagged(runID)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
		if err == nil {
			names = append(names, strings.TrimSpace(string(b)))
		}
	}
	return names
}

// afterCrash checks what the SIGKILL left: nothing of the command. Its jail dies with the worker
// (bubblewrap's --die-with-parent, then its pid namespace takes every process in it, daemonized
// or not), and the run is still live in the database until the restarted node settles it.
func (w *crashWorld) afterCrash(runID, status string) {
	w.t.Helper()
	var left []string
	w.waitFor("every process of the command to die with the worker", 5*time.Second, func() bool {
		left = survivors(w.t, runID)
		return len(left) == 0
	})
	if r := w.run(runID); r.Status != status {
		w.t.Fatalf("run after the crash = %s, want still %s", r.Status, status)
	}
}

// recovered waits for the restarted node to end the run, and checks everything that must hold
// then: failed/orphaned, no tagged process, lease not active, finalize settled.
func (w *crashWorld) recovered(runID string, crashedAt, restartedAt time.Time) db.Run {
	w.t.Helper()
	ctx := context.Background()
	var r db.Run
	w.waitFor("recovery of the orphaned run", 2*time.Minute, func() bool {
		r = w.run(runID)
		return !r.Live()
	})
	w.t.Logf("recovered: %s after the restart, %s after the crash",
		time.Since(restartedAt).Round(time.Millisecond), time.Since(crashedAt).Round(time.Millisecond))
	if r.Status != db.RunFailed || r.ErrorCode != "orphaned" {
		w.t.Fatalf("run = %s/%s (%s), want failed/orphaned", r.Status, r.ErrorCode, r.ErrorMessage)
	}
	if left := survivors(w.t, runID); len(left) > 0 {
		w.t.Fatalf("processes of the orphaned run still alive: %v", left)
	}
	if r.LeaseID == "" {
		w.t.Fatal("the run had no lease")
	}
	w.waitFor("finalize to settle and release the lease", time.Minute, func() bool {
		l, err := db.LeaseByID(ctx, w.pool, w.company, r.LeaseID)
		if err != nil {
			w.t.Fatal(err)
		}
		return l.Status != db.LeaseActive && w.count(`SELECT count(*) FROM execution_workspaces
			WHERE id = $1 AND finalize_state = 'settled'`, r.ExecutionWorkspaceID) == 1
	})
	return r
}

// rescue makes River's rescuer treat the dead worker's still-running jobs of the run as stuck
// (they would be after JobTimeout + 1 h) and waits until each ended; it returns their final
// states by kind. The sweep asked River to cancel them, so the rescuer cancels them rather than
// retrying them (and it would never rescue an execute_run otherwise: that kind has no timeout).
func (w *crashWorld) rescue(runID string) map[string]string {
	w.t.Helper()
	ctx := context.Background()
	// River completes jobs asynchronously, so a provision that returned before the crash may
	// still read running too: both kinds are rescued.
	tag, err := w.pool.Exec(ctx, `UPDATE river_job SET attempted_at = now() - interval '3 hours'
		WHERE state = 'running' AND kind IN ('provision', 'execute_run') AND args->>'run_id' = $1`, runID)
	if err != nil {
		w.t.Fatal(err)
	}
	if tag.RowsAffected() == 0 {
		w.t.Fatal("no job of the run left running by the dead worker")
	}
	w.t.Logf("jobs of the run left running by the dead worker: %d", tag.RowsAffected())
	w.waitFor("River to rescue and end the dead worker's job", 2*time.Minute, func() bool {
		return w.count(`SELECT count(*) FROM river_job WHERE args->>'run_id' = $1
			AND state IN ('available', 'pending', 'running', 'retryable', 'scheduled')`, runID) == 0
	})
	states := map[string]string{}
	rows, err := w.pool.Query(ctx, `SELECT kind, state::text FROM river_job WHERE args->>'run_id' = $1 AND kind <> 'finalize'`, runID)
	if err != nil {
		w.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var k, s string
		if err := rows.Scan(&k, &s); err != nil {
			w.t.Fatal(err)
		}
		states[k] = s
	}
	return states
}

// TestCrashMidRun: the worker dies while the run's command runs.
func TestCrashMidRun(t *testing.T) {
	t.Parallel()
	w := newCrashWorld(t, "")
	// Jailed commands write only their workspace: the markers live there.
	_, runID := w.admit("echo started >> marker; sleep 300")
	marker := w.inWorkspace("marker")

	first := w.startWorker()
	w.waitFor("the command to start", time.Minute, func() bool {
		return w.run(runID).Status == db.RunRunning && lines(t, marker()) == 1
	})
	w.crash(first)
	crashedAt := time.Now()
	w.afterCrash(runID, db.RunRunning)

	w.startWorker()
	restartedAt := time.Now()
	w.recovered(runID, crashedAt, restartedAt)

	states := w.rescue(runID)
	if states["execute_run"] != "cancelled" || (states["provision"] != "completed" && states["provision"] != "cancelled") {
		t.Fatalf("job states after the rescue = %v, want execute_run cancelled, provision completed (or cancelled, "+
			"when its completion had not reached the database before the crash)", states)
	}
	if r := w.run(runID); r.Status != db.RunFailed || r.ErrorCode != "orphaned" {
		t.Fatalf("after the rescue: %s/%s", r.Status, r.ErrorCode)
	}
	if n := lines(t, marker()); n != 1 {
		t.Fatalf("the command ran %d times, want once", n)
	}
	if left := survivors(t, runID); len(left) > 0 {
		t.Fatalf("processes after the rescue: %v", left)
	}
}

// TestCrashMidProvision: the worker dies while the setup command (part of provision) runs. The
// run ends failed/orphaned too (not setup_failed: nobody saw the setup end), with its one
// workspace, and its command never runs.
func TestCrashMidProvision(t *testing.T) {
	t.Parallel()
	w := newCrashWorld(t, "echo setup >> setup-marker; sleep 300")
	taskID, runID := w.admit("echo ran >> run-marker")
	setupMarker, runMarker := w.inWorkspace("setup-marker"), w.inWorkspace("run-marker")

	first := w.startWorker()
	w.waitFor("the setup command to start", time.Minute, func() bool {
		return lines(t, setupMarker()) == 1 && w.count(`SELECT count(*) FROM workspace_operations
			WHERE run_id = $1 AND phase = 'setup' AND status = 'running'`, runID) == 1
	})
	w.crash(first)
	crashedAt := time.Now()
	w.afterCrash(runID, db.RunPreparing)

	w.startWorker()
	restartedAt := time.Now()
	r := w.recovered(runID, crashedAt, restartedAt)

	if n := w.count(`SELECT count(*) FROM workspace_operations WHERE run_id = $1 AND phase = 'setup'
		AND status = 'failed' AND finished_at IS NOT NULL`, runID); n != 1 {
		t.Fatalf("the interrupted setup step is not settled failed (%d)", n)
	}
	states := w.rescue(runID)
	if states["provision"] != "cancelled" || states["execute_run"] != "" {
		t.Fatalf("job states after the rescue = %v, want provision cancelled and no execute_run", states)
	}
	if n := w.count(`SELECT count(*) FROM execution_workspaces WHERE source_task_id = $1`, taskID); n != 1 {
		t.Fatalf("%d execution workspaces for the task, want 1", n)
	}
	if n := w.count(`SELECT count(*) FROM workspace_operations WHERE run_id = $1 AND phase = 'setup'`, runID); n != 1 {
		t.Fatalf("%d setup steps, want 1", n)
	}
	if n := lines(t, setupMarker()); n != 1 {
		t.Fatalf("the setup command ran %d times, want once", n)
	}
	if n := lines(t, runMarker()); n != 0 {
		t.Fatal("the command of a run orphaned in provision ran")
	}
	if r2 := w.run(runID); r2.Status != db.RunFailed || r2.ErrorCode != "orphaned" || r2.LeaseID != r.LeaseID {
		t.Fatalf("after the rescue: %s/%s lease %s", r2.Status, r2.ErrorCode, r2.LeaseID)
	}
	if left := survivors(t, runID); len(left) > 0 {
		t.Fatalf("processes after the rescue: %v", left)
	}
}
