package jobs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"berth/db"
	"berth/db/dbtest"
	"berth/environment"
	"berth/jobs/executing"
	"berth/jobs/internal/jobstest"
	"berth/workspace"
)

func TestVerdict(t *testing.T) {
	t.Parallel()
	e := executing.New("n1")
	e.Add("executing-here")
	self := e.ClientID()
	running := func(holder string, old bool) db.CandidateJob {
		return db.CandidateJob{State: "running", Holder: holder, Old: old}
	}
	cases := []struct {
		name   string
		c      db.OrphanCandidate
		sole   bool
		reason string
		orphan bool
	}{
		{"executing in this process", db.OrphanCandidate{ID: "executing-here", Stale: true, Jobs: []db.CandidateJob{running("n1@dead", true)}}, true, "", false},
		{"job waiting for a worker", db.OrphanCandidate{ID: "r", Stale: true, Quiet: true, Jobs: []db.CandidateJob{{State: "available"}}}, true, "", false},
		{"job snoozed", db.OrphanCandidate{ID: "r", Stale: true, Jobs: []db.CandidateJob{running("n1@dead", true), {State: "scheduled"}}}, true, "", false},
		{"job just fetched here", db.OrphanCandidate{ID: "r", Jobs: []db.CandidateJob{running(self, false)}}, true, "", false},
		{"dead process of this node, sole", db.OrphanCandidate{ID: "r", Jobs: []db.CandidateJob{running("n1@dead", false)}}, true, reasonNodeRestarted, true},
		{"dead process of this node, not sole", db.OrphanCandidate{ID: "r", Jobs: []db.CandidateJob{running("n1@dead", false)}}, false, "", false},
		{"another node's live executor", db.OrphanCandidate{ID: "r", Jobs: []db.CandidateJob{running("n2@x", false)}}, true, "", false},
		{"another node, stale run, fresh attempt", db.OrphanCandidate{ID: "r", Stale: true, Jobs: []db.CandidateJob{running("n2@x", false)}}, true, "", false},
		{"another node, stale", db.OrphanCandidate{ID: "r", Stale: true, Jobs: []db.CandidateJob{running("n2@x", true)}}, true, reasonStale, true},
		{"node prefix is not enough", db.OrphanCandidate{ID: "r", Jobs: []db.CandidateJob{running("n10@x", false)}}, true, "", false},
		{"no job, quiet", db.OrphanCandidate{ID: "r", Quiet: true}, false, reasonNoJob, true},
		{"no job, heartbeat recent", db.OrphanCandidate{ID: "r"}, true, reasonNoJob, false},
	}
	for _, tc := range cases {
		reason, orphan := verdict(tc.c, e, tc.sole)
		if orphan != tc.orphan || (orphan && reason != tc.reason) {
			t.Errorf("%s: verdict = %q %v, want %q %v", tc.name, reason, orphan, tc.reason, tc.orphan)
		}
	}
	// Without a registry (a client built without one) nothing is taken for this node's.
	if _, orphan := verdict(db.OrphanCandidate{ID: "r", Jobs: []db.CandidateJob{running("n1@dead", false)}}, nil, true); orphan {
		t.Error("a nil registry claimed a node")
	}
}

// sweepWorld is a company with a local environment, a project, a task and an execution
// workspace, to hang runs on.
type sweepWorld struct {
	t                                  *testing.T
	pool                               *pgxpool.Pool
	company, env, project, task, space string
	user                               string
	ins                                *river.Client[pgx.Tx]
}

func newSweepWorld(t *testing.T) *sweepWorld {
	t.Helper()
	ctx := context.Background()
	w := &sweepWorld{t: t, pool: dbtest.New(t)}
	w.company = jobstest.Company(t, w.pool)
	u, err := db.CreateUser(ctx, w.pool, "board@example.com", "x", false)
	if err != nil {
		t.Fatal(err)
	}
	w.env = jobstest.LocalEnvironment(t, w.pool, w.company)
	w.project = jobstest.Project(t, w.pool, w.company, db.ExecutionPolicy{DefaultMode: "isolated", EnvironmentID: w.env,
		Strategy: "copy"})
	task, err := db.CreateTask(ctx, w.pool, w.company, w.project, u.ID, db.TaskFields{Title: "T", Command: "true",
		Trust: "standard", WorkspaceMode: "inherit"})
	if err != nil {
		t.Fatal(err)
	}
	w.task, w.user = task.ID, u.ID
	w.space = w.workspace()
	w.ins, err = NewClient(Deps{Pool: w.pool, Log: jobstest.Log()}, ClientOptions{Work: false})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func (w *sweepWorld) workspace() string {
	w.t.Helper()
	var b [16]byte
	_, _ = rand.Read(b[:])
	ws, err := db.CreateExecutionWorkspace(context.Background(), w.pool, db.NewExecutionWorkspace{CompanyID: w.company,
		ProjectID: w.project, SourceTaskID: w.task, Mode: "isolated", Strategy: "copy", Trust: "standard",
		Ref: "ws-" + hex.EncodeToString(b[:])})
	if err != nil {
		w.t.Fatal(err)
	}
	return ws.ID
}

// run inserts a run in status on node, its heartbeat age ago (-1: none), created age ago too. Each
// run has a task of its own: a task has one live run at a time.
func (w *sweepWorld) run(status, node string, age time.Duration) string {
	w.t.Helper()
	task, err := db.CreateTask(context.Background(), w.pool, w.company, w.project, w.user, db.TaskFields{Title: "T",
		Command: "true", Trust: "standard", WorkspaceMode: "inherit"})
	if err != nil {
		w.t.Fatal(err)
	}
	var id string
	err = w.pool.QueryRow(context.Background(), `INSERT INTO runs (company_id, task_id, environment_id,
			execution_workspace_id, status, command, node_id, created_at, heartbeat_at)
		VALUES ($1, $2, $3, CASE WHEN $4 = 'queued' THEN NULL ELSE $5::uuid END, $4, 'true', $6,
			now() - $7::interval, CASE WHEN $4 = 'queued' THEN NULL ELSE now() - $7::interval END)
		RETURNING id`, w.company, task.ID, w.env, status, w.workspace(), node, age).Scan(&id)
	if err != nil {
		w.t.Fatal(err)
	}
	return id
}

// job inserts a run job and, when holder is not "", makes it running under that client since
// age ago.
func (w *sweepWorld) job(args river.JobArgs, holder string, age time.Duration) {
	w.t.Helper()
	ctx := context.Background()
	res, err := w.ins.Insert(ctx, args, nil)
	if err != nil {
		w.t.Fatal(err)
	}
	if holder == "" {
		return
	}
	if _, err := w.pool.Exec(ctx, `UPDATE river_job SET state = 'running', attempt = 1, attempted_by = ARRAY[$2],
		attempted_at = now() - $3::interval WHERE id = $1`, res.Job.ID, holder, age); err != nil {
		w.t.Fatal(err)
	}
}

func (w *sweepWorld) runRow(id string) db.Run {
	w.t.Helper()
	r, err := db.RunForJob(context.Background(), w.pool, id)
	if err != nil {
		w.t.Fatal(err)
	}
	return r
}

func (w *sweepWorld) count(sql string, args ...any) int {
	w.t.Helper()
	var n int
	if err := w.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		w.t.Fatal(err)
	}
	return n
}

// tagged starts `sleep 300` tagged with runID in a session of its own; the returned channel
// closes when it has exited.
func tagged(t *testing.T, runID string) (pid int, gone <-chan struct{}) {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	cmd.Env = append(os.Environ(), environment.TagVar+"="+runID)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	return cmd.Process.Pid, done
}

func exited(gone <-chan struct{}, within time.Duration) bool {
	select {
	case <-gone:
		return true
	case <-time.After(within):
		return false
	}
}

// TestSweepOrphans runs the startup sweep of a restarted node "n1" over runs in every situation
// the verdict distinguishes, on real PostgreSQL, River job rows and processes.
func TestSweepOrphans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newSweepWorld(t)
	e := executing.New("n1")
	if err := e.Claim(ctx, w.pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)

	// Orphaned: a dead process of this node was executing it (the restart case).
	dead := w.run(db.RunRunning, "n1", 0)
	w.job(ExecuteRunArgs{RunID: dead}, "n1@dead", 0)
	if _, err := db.StartOperation(ctx, w.pool, db.NewOperation{CompanyID: w.company, RunID: dead, Phase: "setup",
		Command: "make"}); err != nil {
		t.Fatal(err)
	}
	_, deadGone := tagged(t, dead)
	// Orphaned: the same mid-provision.
	deadProv := w.run(db.RunPreparing, "n1", 0)
	w.job(ProvisionArgs{RunID: deadProv}, "n1@dead", 0)
	// Orphaned without a kill: another node's run that stopped beating long ago.
	stale := w.run(db.RunRunning, "n2", 5*time.Minute)
	w.job(ExecuteRunArgs{RunID: stale}, "n2@x", 5*time.Minute)
	_, staleGone := tagged(t, stale) // on this host, but not this node's: left alone
	// Orphaned: queued with no job left, quiet for two minutes.
	lost := w.run(db.RunQueued, "", 2*time.Minute)

	// Kept: executing in this process, just fetched here, waiting, another node's live one,
	// and a queued run with no job that is too fresh to judge.
	here := w.run(db.RunRunning, "n1", 0)
	w.job(ExecuteRunArgs{RunID: here}, "n1@dead", 0)
	done := e.Add(here)
	defer done()
	fetched := w.run(db.RunPreparing, "n1", 0)
	w.job(ProvisionArgs{RunID: fetched}, e.ClientID(), 0)
	waiting := w.run(db.RunPreparing, "n1", 10*time.Minute)
	w.job(ExecuteRunArgs{RunID: waiting}, "", 0)
	alive := w.run(db.RunRunning, "n2", 0)
	w.job(ExecuteRunArgs{RunID: alive}, "n2@x", 5*time.Minute)
	fresh := w.run(db.RunQueued, "", 0)

	if err := SweepOrphans(ctx, Deps{Pool: w.pool, Log: jobstest.Log(), NodeID: "n1", Executing: e}); err != nil {
		t.Fatal(err)
	}

	for _, id := range []string{dead, deadProv, stale, lost} {
		r := w.runRow(id)
		if r.Status != db.RunFailed || r.ErrorCode != codeOrphaned || r.FinishedAt == nil || r.ErrorMessage == "" {
			t.Errorf("run %s = %s/%s (%q), want failed/orphaned", id, r.Status, r.ErrorCode, r.ErrorMessage)
		}
		if n := w.count(`SELECT count(*) FROM river_job WHERE kind = 'finalize' AND args->>'run_id' = $1`, id); n != 1 {
			t.Errorf("run %s: %d finalize jobs, want 1", id, n)
		}
		if n := w.count(`SELECT count(*) FROM audit_events WHERE action = 'run.orphaned' AND target_id = $1`, id); n != 1 {
			t.Errorf("run %s: %d run.orphaned events, want 1", id, n)
		}
	}
	for _, id := range []string{here, fetched, waiting, alive, fresh} {
		if r := w.runRow(id); !r.Live() {
			t.Errorf("run %s was ended (%s/%s); it has a live executor or a waiting job", id, r.Status, r.ErrorCode)
		}
	}
	if !exited(deadGone, 5*time.Second) {
		t.Error("the restarted node's orphan still has its process")
	}
	if exited(staleGone, 100*time.Millisecond) {
		t.Error("another node's run's process was killed from this node")
	}
	if n := w.count(`SELECT count(*) FROM workspace_operations WHERE run_id = $1 AND status = 'failed'
		AND finished_at IS NOT NULL`, dead); n != 1 {
		t.Errorf("the orphan's running step was not settled (%d)", n)
	}
	var fin string
	if err := w.pool.QueryRow(ctx, `SELECT w.finalize_state FROM execution_workspaces w JOIN runs r
		ON r.execution_workspace_id = w.id WHERE r.id = $1`, dead).Scan(&fin); err != nil || fin != "pending" {
		t.Errorf("finalize_state = %q (%v), want pending", fin, err)
	}
	var details []byte
	if err := w.pool.QueryRow(ctx, `SELECT details FROM audit_events WHERE action = 'run.orphaned' AND target_id = $1`,
		dead).Scan(&details); err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	_ = json.Unmarshal(details, &d)
	if d["reason"] != reasonNodeRestarted || d["processes_killed"] != float64(1) {
		t.Errorf("audit details = %v", d)
	}
	// The gone executor's jobs are marked for cancellation (River's rescuer cancels them instead
	// of retrying them); the live ones are not.
	if n := w.count(`SELECT count(*) FROM river_job WHERE args->>'run_id' = ANY($1) AND kind <> 'finalize'
		AND metadata ? 'cancel_attempted_at'`, []string{dead, deadProv, stale}); n != 3 {
		t.Errorf("%d of the orphans' 3 jobs marked for cancellation", n)
	}
	if n := w.count(`SELECT count(*) FROM river_job WHERE metadata ? 'cancel_attempted_at'`); n != 3 {
		t.Errorf("%d jobs marked for cancellation, want only the orphans' 3", n)
	}

	// A second sweep finds nothing more to do and enqueues nothing twice.
	if err := SweepOrphans(ctx, Deps{Pool: w.pool, Log: jobstest.Log(), NodeID: "n1", Executing: e}); err != nil {
		t.Fatal(err)
	}
	if n := w.count(`SELECT count(*) FROM river_job WHERE kind = 'finalize'`); n != 4 {
		t.Errorf("%d finalize jobs after a second sweep, want 4", n)
	}
}

// TestSweepSharedNodeID: while another live process claims the same node id, a job running
// under another client id of the node may be that process's, so it is not taken for an orphan;
// once that process is gone it is.
func TestSweepSharedNodeID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newSweepWorld(t)
	me, other := executing.New("n1"), executing.New("n1")
	for _, e := range []*executing.Registry{me, other} {
		if err := e.Claim(ctx, w.pool); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Close)
	}
	id := w.run(db.RunRunning, "n1", 0)
	w.job(ExecuteRunArgs{RunID: id}, other.ClientID(), 0)
	deps := Deps{Pool: w.pool, Log: jobstest.Log(), NodeID: "n1", Executing: me}
	if err := SweepOrphans(ctx, deps); err != nil {
		t.Fatal(err)
	}
	if r := w.runRow(id); !r.Live() {
		t.Fatalf("a run of a live process sharing the node id was ended: %s/%s", r.Status, r.ErrorCode)
	}
	other.Close() // the server ends its session (and claim) a moment later
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := SweepOrphans(ctx, deps); err != nil {
			t.Fatal(err)
		}
		r := w.runRow(id)
		if r.Status == db.RunFailed && r.ErrorCode == codeOrphaned {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the other process went: %s/%s, want failed/orphaned", r.Status, r.ErrorCode)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRescuedJobsDoNotRerun: when River rescues a dead process's job long after the sweep ended
// its run, the retried job does nothing: no command, no setup, no new step, no status change.
func TestRescuedJobsDoNotRerun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newSweepWorld(t)
	marker := filepath.Join(t.TempDir(), "ran")
	for _, status := range []string{db.RunRunning, db.RunPreparing} {
		id := w.run(status, "n1", 0)
		code, msg := codeOrphaned, "gone"
		if _, err := db.TransitionRun(ctx, w.pool, id, db.LiveRunStatuses, db.RunFailed,
			db.RunUpdate{ErrorCode: &code, ErrorMessage: &msg, Finished: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := w.pool.Exec(ctx, `UPDATE runs SET command = $2 WHERE id = $1`, id, "echo x >> "+marker); err != nil {
			t.Fatal(err)
		}
		rw := runWorker{deps: Deps{Pool: w.pool, Log: jobstest.Log(), NodeID: "n1", Executing: executing.New("n1")}}
		row := &rivertype.JobRow{Attempt: 2, MaxAttempts: 10}
		if err := (&ExecuteRunWorker{runWorker: rw}).Work(ctx, &river.Job[ExecuteRunArgs]{JobRow: row, Args: ExecuteRunArgs{RunID: id}}); err != nil {
			t.Errorf("%s run: execute_run retry = %v", status, err)
		}
		if err := (&ProvisionWorker{runWorker: rw}).Work(ctx, &river.Job[ProvisionArgs]{JobRow: row, Args: ProvisionArgs{RunID: id}}); err != nil {
			t.Errorf("%s run: provision retry = %v", status, err)
		}
		if r := w.runRow(id); r.Status != db.RunFailed || r.ErrorCode != codeOrphaned {
			t.Errorf("%s run after the retries: %s/%s", status, r.Status, r.ErrorCode)
		}
		if n := w.count(`SELECT count(*) FROM workspace_operations WHERE run_id = $1`, id); n != 0 {
			t.Errorf("%s run: the retries wrote %d steps", status, n)
		}
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Error("a retried job ran the command")
	}
}

// TestRunMiddleware: while a provision job works, its run is in the registry and its run and
// lease heartbeats are fresh; afterwards the run is out of the registry.
func TestRunMiddleware(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newSweepWorld(t)
	id := w.run(db.RunPreparing, "n1", 10*time.Minute)
	r := w.runRow(id)
	lease, err := db.AcquireLease(ctx, w.pool, db.LeaseRequest{CompanyID: w.company, EnvironmentID: w.env,
		ExecutionWorkspaceID: r.ExecutionWorkspaceID, TaskID: r.TaskID, RunID: id, TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lid := lease.ID
	if _, err := db.TransitionRun(ctx, w.pool, id, []string{db.RunPreparing}, db.RunPreparing, db.RunUpdate{LeaseID: &lid}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.pool.Exec(ctx, `UPDATE runs SET heartbeat_at = now() - interval '10 minutes' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	e := executing.New("n1")
	m := &runMiddleware{deps: Deps{Pool: w.pool, Log: jobstest.Log(), NodeID: "n1", Executing: e}}
	args, _ := json.Marshal(ProvisionArgs{RunID: id})
	err = m.Work(ctx, &rivertype.JobRow{Kind: "provision", EncodedArgs: args}, func(ctx context.Context) error {
		if !e.Has(id) {
			t.Error("the run is not registered while its job works")
		}
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if w.count(`SELECT count(*) FROM runs WHERE id = $1 AND heartbeat_at > now() - interval '5 seconds'`, id) == 1 &&
				w.count(`SELECT count(*) FROM environment_leases WHERE id = $1 AND expires_at > now() + interval '1 minute'`, lid) == 1 {
				return nil
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Error("the run or its lease was not heartbeaten")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if e.Has(id) {
		t.Error("the run stays registered after its job ended")
	}
}

// TestSettleOperations: steps left running by a dead executor are settled, live ones are not.
func TestSettleOperations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newSweepWorld(t)
	ended := w.run(db.RunRunning, "n2", 0)
	if _, err := w.pool.Exec(ctx, `UPDATE runs SET status = 'failed' WHERE id = $1`, ended); err != nil {
		t.Fatal(err)
	}
	live := w.run(db.RunRunning, "n2", 0)
	w.job(ExecuteRunArgs{RunID: live}, "n2@x", 0)
	op := func(run, phase string, age time.Duration) string {
		o, err := db.StartOperation(ctx, w.pool, db.NewOperation{CompanyID: w.company, RunID: run, Phase: phase})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.pool.Exec(ctx, `UPDATE workspace_operations SET started_at = now() - $2::interval WHERE id = $1`, o.ID, age); err != nil {
			t.Fatal(err)
		}
		return o.ID
	}
	settled := []string{op(ended, "setup", 20*time.Minute), op(live, "setup", 2*time.Hour), op("", "cleanup", 2*time.Hour)}
	kept := []string{op(ended, "finalize", 20*time.Minute), op(ended, "setup", 5*time.Minute), op(live, "setup", 20*time.Minute)}
	if err := sweepOrphans(ctx, Deps{Pool: w.pool, Log: jobstest.Log(), NodeID: "n1"}, false); err != nil {
		t.Fatal(err)
	}
	status := func(id string) string {
		var s string
		if err := w.pool.QueryRow(ctx, `SELECT status FROM workspace_operations WHERE id = $1`, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, id := range settled {
		if s := status(id); s != "failed" {
			t.Errorf("stuck step %s is %s, want failed", id, s)
		}
	}
	for _, id := range kept {
		if s := status(id); s != "running" {
			t.Errorf("step %s is %s, want running", id, s)
		}
	}
}

// TestUnmanagedReport: entries under the managed base without an owner are reported (names
// only), once per change, and never deleted.
func TestUnmanagedReport(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newSweepWorld(t)
	mgr, err := workspace.NewManager(t.TempDir(), workspace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "a.txt"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := mgr.RealizeCopy(ctx, src) // recorded by the manager, no execution_workspaces row
	if err != nil {
		t.Fatal(err)
	}
	junk := filepath.Join(mgr.Base(), "junk")
	if err := os.Mkdir(junk, 0o700); err != nil {
		t.Fatal(err)
	}
	recent := filepath.Join(mgr.Base(), "recent")
	if err := os.Mkdir(recent, 0o700); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(junk, old, old); err != nil {
		t.Fatal(err)
	}
	deps := Deps{Pool: w.pool, Log: jobstest.Log(), NodeID: "n1", Workspaces: mgr, Executing: executing.New("n1"),
		Unmanaged: new(UnmanagedMemo)}
	reports := func() []unmanagedReport {
		t.Helper()
		rows, err := w.pool.Query(ctx, `SELECT details FROM audit_events WHERE action = 'workspace.unmanaged_reported'
			AND target_id = 'n1' AND company_id IS NULL ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []unmanagedReport
		for rows.Next() {
			var b []byte
			var r unmanagedReport
			if err := rows.Scan(&b); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatal(err)
			}
			out = append(out, r)
		}
		return out
	}
	for range 2 {
		if err := sweepOrphans(ctx, deps, false); err != nil {
			t.Fatal(err)
		}
	}
	got := reports()
	if len(got) != 1 || !slices.Equal(got[0].Unmanaged, []string{"junk"}) || !slices.Equal(got[0].Unrecorded, []string{res.Ref}) {
		t.Fatalf("reports = %+v, want one with junk and %s", got, res.Ref)
	}
	if _, err := os.Stat(junk); err != nil {
		t.Fatal("the unmanaged directory was touched")
	}
	// A new process knows the last report from the database: no repeat.
	deps.Executing, deps.Unmanaged = executing.New("n1"), new(UnmanagedMemo)
	if err := sweepOrphans(ctx, deps, false); err != nil {
		t.Fatal(err)
	}
	if n := len(reports()); n != 1 {
		t.Fatalf("a restarted process repeated the report (%d)", n)
	}
	// The set changes: reported again, empty included.
	if err := os.Remove(junk); err != nil {
		t.Fatal(err)
	}
	if err := mgr.Destroy(ctx, res.Ref); err != nil {
		t.Fatal(err)
	}
	if err := sweepOrphans(ctx, deps, false); err != nil {
		t.Fatal(err)
	}
	got = reports()
	if len(got) != 2 || len(got[1].Unmanaged) != 0 || len(got[1].Unrecorded) != 0 {
		t.Fatalf("reports = %+v, want a second, empty one", got)
	}
}

// TestExpireLeasesAndCleanup: a working client expires a lease whose holder stopped beating,
// and its cleanup stops what the run left on this host and records the cleanup.
func TestExpireLeasesAndCleanup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newSweepWorld(t)
	id := w.run(db.RunRunning, "n1", 0)
	r := w.runRow(id)
	lease, err := db.AcquireLease(ctx, w.pool, db.LeaseRequest{CompanyID: w.company, EnvironmentID: w.env,
		ExecutionWorkspaceID: r.ExecutionWorkspaceID, TaskID: r.TaskID, RunID: id, TTL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// The run is "executing" in this process, so the sweep leaves it to the lease machinery.
	e := executing.New("n1")
	defer e.Add(id)()
	_, gone := tagged(t, id)
	client, err := NewClient(Deps{Pool: w.pool, Log: jobstest.Log(), NodeID: "n1", Executing: e}, ClientOptions{Work: true, MaxWorkers: 4})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.Stop(stopCtx)
	})
	deadline := time.Now().Add(90 * time.Second)
	for {
		l, err := db.LeaseByID(ctx, w.pool, w.company, lease.ID)
		if err != nil {
			t.Fatal(err)
		}
		if l.Status == db.LeaseExpired && l.CleanupStatus == db.LeaseCleanupSucceeded {
			if l.Generation != lease.Generation+1 || l.CleanupAttempts != 1 {
				t.Fatalf("expired lease = %+v", l)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease not expired and cleaned within 90 s: %s/%s", l.Status, l.CleanupStatus)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !exited(gone, 5*time.Second) {
		t.Fatal("the expired lease's run still has its process")
	}
	if n := w.count(`SELECT count(*) FROM audit_events WHERE action = 'lease.expired' AND target_id = $1`, lease.ID); n != 1 {
		t.Fatalf("%d lease.expired events", n)
	}
	// A second cleanup of the same lease (an admin retry racing the first) changes nothing.
	cw := &CleanupLeaseWorker{deps: Deps{Pool: w.pool, Log: jobstest.Log(), NodeID: "n1"}}
	if err := cw.Work(ctx, &river.Job[CleanupLeaseArgs]{JobRow: &rivertype.JobRow{Attempt: 1, MaxAttempts: 5},
		Args: CleanupLeaseArgs{LeaseID: lease.ID}}); err != nil {
		t.Fatalf("second cleanup: %v", err)
	}
	if l, _ := db.LeaseByID(ctx, w.pool, w.company, lease.ID); l.CleanupAttempts != 1 {
		t.Fatalf("a second cleanup counted an attempt: %+v", l)
	}
}

// TestCleanupLeaseOtherNodeAndLiveLease: a cleanup does not reach into another node's run, and
// refuses a lease that is still live.
func TestCleanupLeaseOtherNodeAndLiveLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newSweepWorld(t)
	id := w.run(db.RunRunning, "n2", 0)
	r := w.runRow(id)
	lease, err := db.AcquireLease(ctx, w.pool, db.LeaseRequest{CompanyID: w.company, EnvironmentID: w.env,
		ExecutionWorkspaceID: r.ExecutionWorkspaceID, TaskID: r.TaskID, RunID: id, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cw := &CleanupLeaseWorker{deps: Deps{Pool: w.pool, Log: jobstest.Log(), NodeID: "n1"}}
	job := &river.Job[CleanupLeaseArgs]{JobRow: &rivertype.JobRow{Attempt: 1, MaxAttempts: 5}, Args: CleanupLeaseArgs{LeaseID: lease.ID}}
	var cancel *river.JobCancelError
	if err := cw.Work(ctx, job); err == nil || !errors.As(err, &cancel) {
		t.Fatalf("cleanup of a live lease = %v, want a cancel", err)
	}
	_, gone := tagged(t, id)
	if _, err := db.ForceReleaseLease(ctx, w.pool, w.company, lease.ID); err != nil {
		t.Fatal(err)
	}
	if err := cw.Work(ctx, job); err != nil {
		t.Fatal(err)
	}
	if l, _ := db.LeaseByID(ctx, w.pool, w.company, lease.ID); l.CleanupStatus != db.LeaseCleanupSucceeded {
		t.Fatalf("cleanup status = %s", l.CleanupStatus)
	}
	if exited(gone, 100*time.Millisecond) {
		t.Fatal("a cleanup killed another node's run's process")
	}
}
