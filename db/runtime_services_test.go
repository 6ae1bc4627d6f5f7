package db_test

import (
	"context"
	"errors"
	"testing"

	"berth/db"
)

// TestRuntimeServiceLifecycle: a service row is created once per (workspace, name) and reused by
// every start (same id, generation + 1); a live service holds its port on its node, and a stale
// generation settles nothing.
func TestRuntimeServiceLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newRunWorld(t)
	var ws string
	if err := w.pool.QueryRow(ctx, `INSERT INTO execution_workspaces (company_id, project_id, mode, strategy, ref)
		VALUES ($1, $2, 'isolated', 'copy', 'ws-0123456789abcdef0123456789abcdef') RETURNING id`, w.companyID, w.projectID).Scan(&ws); err != nil {
		t.Fatal(err)
	}
	def := db.ServiceDefinition{Name: "web", Command: "serve", StopPolicy: "manual", Lifecycle: "ephemeral"}
	a, err := db.EnsureRuntimeService(ctx, w.pool, w.companyID, ws, "", def)
	if err != nil || a.Status != db.ServiceStopped || a.DesiredState != db.DesiredStopped || a.Generation != 0 {
		t.Fatalf("ensure: %+v %v", a, err)
	}
	def.Command = "serve --fast"
	b, err := db.EnsureRuntimeService(ctx, w.pool, w.companyID, ws, "", def)
	if err != nil || b.ID != a.ID || b.Command != "serve --fast" {
		t.Fatalf("ensure again: %+v %v", b, err)
	}
	if _, err := db.RuntimeServiceByID(ctx, w.pool, "00000000-0000-0000-0000-000000000000", a.ID); !errors.Is(err, db.ErrNotFound) {
		t.Fatalf("another company's service: %v", err)
	}
	s, err := db.MarkRuntimeServiceStarting(ctx, w.pool, a.ID, db.ServiceStart{Port: 41000, NodeID: "n1"})
	if err != nil || s.Generation != 1 || s.Status != db.ServiceStarting {
		t.Fatalf("starting: %+v %v", s, err)
	}
	other, _ := db.EnsureRuntimeService(ctx, w.pool, w.companyID, ws, "", db.ServiceDefinition{Name: "api", Command: "x", StopPolicy: "manual", Lifecycle: "shared"})
	if _, err := db.MarkRuntimeServiceStarting(ctx, w.pool, other.ID, db.ServiceStart{Port: 41000, NodeID: "n1"}); !errors.Is(err, db.ErrPortTaken) {
		t.Fatalf("same port on the same node: %v", err)
	}
	if _, err := db.MarkRuntimeServiceStarting(ctx, w.pool, other.ID, db.ServiceStart{Port: 41000, NodeID: "n2"}); err != nil {
		t.Fatalf("same port on another node: %v", err)
	}
	ports, _ := db.NodeServicePorts(ctx, w.pool, "n1")
	if !ports[41000] || len(ports) != 1 {
		t.Fatalf("ports = %v", ports)
	}
	if _, err := db.MarkRuntimeServiceRunning(ctx, w.pool, a.ID, 7, 1, 1, 1); !errors.Is(err, db.ErrServiceState) {
		t.Fatalf("stale generation: %v", err)
	}
	s, err = db.MarkRuntimeServiceRunning(ctx, w.pool, a.ID, 1, 123, 123, 99)
	if err != nil || s.Status != db.ServiceRunning || s.Health != db.HealthHealthy || s.PID != 123 || s.ProcessStart != 99 {
		t.Fatalf("running: %+v %v", s, err)
	}
	code := 0
	s, err = db.MarkRuntimeServiceEnded(ctx, w.pool, a.ID, 1, db.ServiceEnd{Status: db.ServiceStopped, ExitCode: &code, StopReason: "requested"})
	if err != nil || s.Status != db.ServiceStopped || s.PID != 0 || s.StopReason != "requested" || s.Port != 41000 {
		t.Fatalf("ended: %+v %v", s, err)
	}
	ports, _ = db.NodeServicePorts(ctx, w.pool, "n1")
	if len(ports) != 0 {
		t.Fatalf("a stopped service still holds its port: %v", ports)
	}
	list, err := db.WorkspaceRuntimeServices(ctx, w.pool, w.companyID, ws)
	if err != nil || len(list) != 2 || list[0].Name != "api" {
		t.Fatalf("list: %v %v", list, err)
	}
}
