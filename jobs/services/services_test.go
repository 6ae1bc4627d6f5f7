package services

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/db/dbtest"
	"berth/environment"
	"berth/environment/datadir"
	"berth/environment/jail"
	"berth/environment/jail/jailtest"
	"berth/jobs/internal/jobstest"
	"berth/workspace"
)

// serviceWorld is a ready shared workspace over a directory with an index.html, in a local
// environment, whose project workspace defines the service "web" (python's http.server).
type serviceWorld struct {
	t    *testing.T
	deps Deps
	svc  db.RuntimeService
	ws   db.ExecutionWorkspace
}

func newServiceWorld(t *testing.T) serviceWorld {
	t.Helper()
	return newServiceWorldDef(t, db.ServiceDefinition{Name: "web", Command: `exec /usr/bin/python3 -m http.server "$PORT" --bind 127.0.0.1`,
		PortEnv: "PORT", HealthPath: "/", ReadyTimeoutS: 15, StopPolicy: "on_run_finish", Lifecycle: "ephemeral"})
}

// newServiceWorldDef is a service world whose one service is def.
func newServiceWorldDef(t *testing.T, def db.ServiceDefinition) serviceWorld {
	t.Helper()
	ctx := context.Background()
	h, err := jail.Detect(ctx)
	if err != nil {
		t.Fatalf("these tests need bubblewrap: %v", err)
	}
	pool := dbtest.New(t)
	data, src := jailtest.Dir(t), jailtest.Dir(t)
	if err := os.WriteFile(filepath.Join(src, "index.html"), []byte("preview of the workspace"), 0o644); err != nil {
		t.Fatal(err)
	}
	mgr, err := workspace.NewManager(data, workspace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := mgr.RealizeShared(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	company := jobstest.Company(t, pool)
	project := jobstest.Project(t, pool, company, db.ExecutionPolicy{DefaultMode: "shared", Strategy: "copy",
		BranchTemplate: "berth/{task_key}"})
	env := jobstest.LocalEnvironment(t, pool, company)
	pw, err := db.CreateProjectWorkspace(ctx, pool, company, project, db.ProjectWorkspaceFields{Name: "main", SourceType: "directory",
		Source: src, Services: []db.ServiceDefinition{def}})
	if err != nil {
		t.Fatal(err)
	}
	plan, _ := json.Marshal(workspace.Plan{EnvironmentID: env, ServicesAllowed: true})
	ws, err := db.CreateExecutionWorkspace(ctx, pool, db.NewExecutionWorkspace{CompanyID: company, ProjectID: project,
		ProjectWorkspaceID: pw.ID, Mode: "shared", Strategy: "shared", Trust: "standard", Ref: res.Ref, Plan: plan})
	if err != nil {
		t.Fatal(err)
	}
	if ws, err = db.MarkExecutionWorkspaceReady(ctx, pool, ws.ID, ws.Generation, db.Realized{}); err != nil {
		t.Fatal(err)
	}
	node := "svc-" + jobstest.UUID()[:8]
	d := Deps{Pool: pool, Log: jobstest.Log(), Workspaces: mgr, NodeID: node, SupervisorID: node + "@first", Data: datadir.At(data),
		Jail: &h, Masks: []string{data}}
	svc, err := db.EnsureRuntimeService(ctx, pool, company, ws.ID, pw.ID, def)
	if err != nil {
		t.Fatal(err)
	}
	if svc, err = db.SetRuntimeServiceDesired(ctx, pool, svc.ID, db.DesiredRunning, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = environment.StopService(context.Background(), svc.ID, 0, 0, time.Second) })
	return serviceWorld{t: t, deps: d, svc: svc, ws: ws}
}

func (w serviceWorld) row() db.RuntimeService {
	w.t.Helper()
	s, err := db.RuntimeServiceByID(context.Background(), w.deps.Pool, w.svc.CompanyID, w.svc.ID)
	if err != nil {
		w.t.Fatal(err)
	}
	return s
}

// starts records the start jobs Reconcile asks for, as Reconcile's enqueueStart.
type starts []string

func (s *starts) enqueue(_ context.Context, tx pgx.Tx, id string) error {
	if tx == nil {
		return fmt.Errorf("start of %s asked for outside a transaction", id)
	}
	*s = append(*s, id)
	return nil
}

func get(t *testing.T, port int) string {
	t.Helper()
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/index.html")
	if err != nil {
		t.Fatalf("GET: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// servers counts the service's server processes (its jails' bubblewrap processes aside).
func servers(t *testing.T, id string) int {
	t.Helper()
	m, err := environment.TaggedServices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, pid := range m[id] {
		if b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); len(b) > 0 && string(b[:len(b)-1]) != "bwrap" {
			n++
		}
	}
	return n
}

// TestServicesLifecycle: start → running + healthy with pid, start time, a preview_url work
// product and a ledger step; a second start changes nothing; a crash (SIGKILL of the jail) while
// it should run → restarted on the same row, id and port; finalize's on_run_finish stop → stopped
// with the port free and nothing left.
func TestServicesLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newServiceWorld(t)
	m := New(w.deps)
	defer m.Close()
	if err := m.Start(ctx, w.svc.ID, false); err != nil {
		t.Fatal(err)
	}
	s := w.row()
	if s.Status != db.ServiceRunning || s.Health != db.HealthHealthy || s.PID == 0 || s.ProcessStart == 0 || s.Generation != 1 {
		t.Fatalf("after start: %+v", s)
	}
	if got := get(t, s.Port); got != "preview of the workspace" {
		t.Fatalf("served %q", got)
	}
	if err := m.Start(ctx, w.svc.ID, false); err != nil || w.row().Generation != 1 {
		t.Fatalf("a second start restarted it: %v", err)
	}
	var products, ops int
	_ = w.deps.Pool.QueryRow(ctx, `SELECT count(*) FROM work_products WHERE kind = 'preview_url' AND url = $1`, "/preview/"+s.ID+"/").Scan(&products)
	_ = w.deps.Pool.QueryRow(ctx, `SELECT count(*) FROM workspace_operations WHERE phase = 'service_start' AND status = 'succeeded'`).Scan(&ops)
	if products != 1 || ops != 1 {
		t.Fatalf("preview work products %d, service_start steps %d", products, ops)
	}

	// A crash while it should run: restarted (after the backoff) on the same row and port.
	if err := syscall.Kill(s.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := w.row()
		if r.Status == db.ServiceRunning && r.Generation == 2 {
			if r.ID != s.ID || r.Port != s.Port || r.Restarts != 1 || r.PID == s.PID {
				t.Fatalf("restart changed identity: %+v (was %+v)", r, s)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no restart after a crash: %+v", r)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := servers(t, s.ID); n != 1 {
		t.Fatalf("%d servers after the crash restart, want 1", n)
	}

	if err := m.StopWorkspace(ctx, s.CompanyID, s.ExecutionWorkspaceID, StopRunFinished, true); err != nil {
		t.Fatal(err)
	}
	r := w.row()
	if r.Status != db.ServiceStopped || r.DesiredState != db.DesiredStopped || r.StopReason != StopRunFinished || r.PID != 0 {
		t.Fatalf("after stop: %+v", r)
	}
	if n := servers(t, s.ID); n != 0 || !environment.PortFree(s.Port) {
		t.Fatalf("after stop: %d servers, port free %v", n, environment.PortFree(s.Port))
	}
}

// TestServicesAfterRestart: a Berth process goes away (its Supervisor stops watching) and the
// server is SIGKILLed under the running preview; the next process's Reconcile (its startup
// sweep) settles the row (never running on a dead port) and asks for one start, which brings up
// exactly one server. A server that is still alive, still the recorded process and healthy is
// adopted instead.
func TestServicesAfterRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newServiceWorld(t)
	old := New(w.deps)
	if err := old.Start(ctx, w.svc.ID, false); err != nil {
		t.Fatal(err)
	}
	first := w.row()

	// The process "restarts" while the server lives: the sweep adopts it.
	old.Close()
	var asked starts
	d2 := w.deps
	d2.SupervisorID = w.deps.NodeID + "@second" // another process of the node
	if err := Reconcile(ctx, d2, nil, asked.enqueue); err != nil {
		t.Fatal(err)
	}
	if r := w.row(); r.Status != db.ServiceRunning || r.PID != first.PID || r.Generation != first.Generation || len(asked) != 0 {
		t.Fatalf("a live, healthy, recorded server was not adopted: %+v, starts asked for %v", r, asked)
	}

	// Now the server dies with nobody watching: the next startup sweep settles the row.
	if err := syscall.Kill(first.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	d3 := w.deps
	d3.SupervisorID = w.deps.NodeID + "@third"
	if err := Reconcile(ctx, d3, nil, asked.enqueue); err != nil {
		t.Fatal(err)
	}
	r := w.row()
	if r.Status != db.ServiceStopped || r.StopReason != stopSupervisorGone || r.DesiredState != db.DesiredRunning {
		t.Fatalf("after the sweep: %+v", r)
	}
	if len(asked) != 1 || asked[0] != r.ID {
		t.Fatalf("starts asked for %v, want one of %s", asked, r.ID)
	}
	// The start job, run by the new process.
	m3 := New(d3)
	defer m3.Close()
	if err := m3.Start(ctx, r.ID, false); err != nil {
		t.Fatal(err)
	}
	r = w.row()
	if r.Status != db.ServiceRunning || r.ID != first.ID || servers(t, r.ID) != 1 {
		t.Fatalf("after the restart: %+v with %d servers", r, servers(t, r.ID))
	}
	if got := get(t, r.Port); got != "preview of the workspace" {
		t.Fatalf("served %q", got)
	}
	if err := m3.Stop(ctx, r.ID, ""); err != nil {
		t.Fatal(err)
	}
	if n := servers(t, r.ID); n != 0 {
		t.Fatalf("%d servers after stop", n)
	}
}

// TestSweepLeavesItsOwnServices: Reconcile leaves the services this very process supervises to
// their watchers, also when the process has no supervisor id (no River client id: its rows then
// carry the node id), even if "/" does not answer as the sweep's liveness check wants; a service
// of another supervisor in the same state is settled (the negative control). The sweep once read
// its own id as "" there and SIGTERMed a service half a second into its life
// (TestRuntimeServicesAPI).
func TestSweepLeavesItsOwnServices(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Healthy on /ok (its health path), 503 on / (what the sweep checks of a service it adopts).
	def := db.ServiceDefinition{Name: "web", Command: `exec /usr/bin/python3 -c '
import http.server, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/ok" else 503)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()'`,
		PortEnv: "PORT", HealthPath: "/ok", ReadyTimeoutS: 15, StopPolicy: "manual", Lifecycle: "ephemeral"}
	w := newServiceWorldDef(t, def)
	w.deps.SupervisorID = "" // no client id: the rows carry the node id
	m := New(w.deps)
	defer m.Close() // Close is idempotent: the negative control below closes it first
	if err := m.Start(ctx, w.svc.ID, false); err != nil {
		t.Fatal(err)
	}
	before := w.row()
	if before.Status != db.ServiceRunning || before.SupervisorID != w.deps.NodeID {
		t.Fatalf("after start: %+v", before)
	}
	var asked starts
	if err := Reconcile(ctx, w.deps, m, asked.enqueue); err != nil {
		t.Fatal(err)
	}
	if r := w.row(); r.Status != db.ServiceRunning || r.Generation != before.Generation || r.PID != before.PID {
		t.Fatalf("the sweep settled its own process's service: %+v", r)
	}
	// The same process whose River client was built after its Supervisor (jobs.NewClient gives
	// the client an id the Supervisor never wrote): its sweep knows its services by own's id.
	late := w.deps
	late.SupervisorID = w.deps.NodeID + "@client"
	if err := Reconcile(ctx, late, m, asked.enqueue); err != nil {
		t.Fatal(err)
	}
	if r := w.row(); r.Status != db.ServiceRunning || r.Generation != before.Generation || r.PID != before.PID {
		t.Fatalf("the sweep of a client built after the Supervisor settled its service: %+v", r)
	}

	// The negative control: this process goes away (its watcher would restart what the other
	// sweep stops), and another process of the node sweeps.
	m.Close()
	other := w.deps
	other.SupervisorID = w.deps.NodeID + "@other" // another process of the node
	if err := Reconcile(ctx, other, nil, asked.enqueue); err != nil {
		t.Fatal(err)
	}
	if r := w.row(); r.Status != db.ServiceStopped || r.StopReason != stopSupervisorGone {
		t.Fatalf("another supervisor's sweep left an unanswering service: %+v", r)
	}
}
