package jobs

import (
	"context"
	"testing"

	"berth/db"
	"berth/environment"
	"berth/jobs/executing"
	"berth/jobs/internal/jobstest"
)

// TestSweepEnqueuesServiceStart: the services part of the sweep is services.Reconcile with this
// node's start jobs: a row left starting by a supervisor that is gone is settled stopped, and the
// start it still wants lands as one runtime_service job (through jobs.Enqueue). The supervisor's
// own behaviour is tested in package jobs/services.
func TestSweepEnqueuesServiceStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newSweepWorld(t)
	def := db.ServiceDefinition{Name: "web", Command: "true", PortEnv: "PORT", HealthPath: "/", ReadyTimeoutS: 5,
		StopPolicy: "manual", Lifecycle: "ephemeral"}
	pw, err := db.CreateProjectWorkspace(ctx, w.pool, w.company, w.project, db.ProjectWorkspaceFields{Name: "main",
		SourceType: "directory", Source: t.TempDir(), Services: []db.ServiceDefinition{def}})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := db.EnsureRuntimeService(ctx, w.pool, w.company, w.space, pw.ID, def)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.SetRuntimeServiceDesired(ctx, w.pool, svc.ID, db.DesiredRunning, ""); err != nil {
		t.Fatal(err)
	}
	port, err := environment.ReservePort(0, func(int) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.MarkRuntimeServiceStarting(ctx, w.pool, svc.ID, db.ServiceStart{Port: port, NodeID: "n1",
		SupervisorID: "n1@gone", Command: def.Command}); err != nil {
		t.Fatal(err)
	}
	d := Deps{Pool: w.pool, Log: jobstest.Log(), NodeID: "n1", Executing: executing.New("n1")}
	if err := (sweeper{deps: d, log: jobstest.Log(), ins: w.ins}).sweepServices(ctx, true); err != nil {
		t.Fatal(err)
	}
	r, err := db.RuntimeServiceForProxy(ctx, w.pool, svc.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != db.ServiceStopped || r.StopReason != "supervisor_gone" || r.DesiredState != db.DesiredRunning {
		t.Fatalf("after the sweep: %+v", r)
	}
	if n := w.count(`SELECT count(*) FROM river_job WHERE kind = 'runtime_service' AND args->>'service_id' = $1
		AND args->>'action' = 'start'`, svc.ID); n != 1 {
		t.Fatalf("%d start jobs enqueued, want 1", n)
	}
}
