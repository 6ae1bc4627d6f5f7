package services

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"berth/db"
	"berth/environment"
	"berth/workspace"
)

// specFor reads what a start needs: the workspace (ready, services allowed by its plan), the
// service's definition (read at each start), its environment, its placement and the paths. A
// plugin environment's spec has no placement: the plugin places the service (startRemote).
func (m *Supervisor) specFor(ctx context.Context, svc db.RuntimeService) (environment.ServiceSpec, db.ServiceDefinition, db.Environment, error) {
	var def db.ServiceDefinition
	var env db.Environment
	ws, err := db.ExecutionWorkspaceByID(ctx, m.deps.Pool, svc.CompanyID, svc.ExecutionWorkspaceID)
	if err != nil {
		return environment.ServiceSpec{}, def, env, err
	}
	if ws.Status != db.WorkspaceReady {
		return environment.ServiceSpec{}, def, env, fmt.Errorf("the workspace is %s, not ready", ws.Status)
	}
	var plan workspace.Plan
	_ = json.Unmarshal(ws.Plan, &plan)
	if ws.Trust == "low" || !plan.ServicesAllowed {
		return environment.ServiceSpec{}, def, env, errors.New("the workspace's plan denies runtime services (low trust)")
	}
	if svc.ProjectWorkspaceID == "" {
		return environment.ServiceSpec{}, def, env, errors.New("the project workspace that defined the service is gone")
	}
	pw, err := db.ProjectWorkspaceByID(ctx, m.deps.Pool, svc.CompanyID, svc.ProjectWorkspaceID)
	if err != nil {
		return environment.ServiceSpec{}, def, env, fmt.Errorf("the service's project workspace: %w", err)
	}
	found := false
	for _, d := range pw.Services {
		if d.Name == svc.Name {
			def, found = d, true
		}
	}
	if !found {
		return environment.ServiceSpec{}, def, env, fmt.Errorf("the project workspace no longer defines service %q", svc.Name)
	}
	if m.deps.Workspaces == nil || m.deps.Data.Root == "" {
		return environment.ServiceSpec{}, def, env, errors.New("this node has no workspaces or data dir")
	}
	root, err := m.deps.Workspaces.Root(ws.Ref)
	if err != nil {
		return environment.ServiceSpec{}, def, env, err
	}
	env, err = db.EnvironmentByID(ctx, m.deps.Pool, svc.CompanyID, plan.EnvironmentID)
	if err != nil {
		return environment.ServiceSpec{}, def, env, fmt.Errorf("the workspace's environment: %w", err)
	}
	var pl environment.Placement
	if env.Driver != environment.DriverPlugin {
		home := ""
		if m.deps.HomeDir != "" {
			home = filepath.Join(m.deps.HomeDir, ws.Ref)
		}
		if m.deps.Egress != nil {
			m.deps.Egress.Bind(ws.ID, env.CompanyID, env.ID, nil, nil) // the service's connections follow its environment's policy
		}
		if pl, err = servicePlacement(ctx, m.deps, env, home); err != nil {
			return environment.ServiceSpec{}, def, env, err
		}
	}
	logDir := m.deps.Data.ServiceLogs()
	if err := os.MkdirAll(logDir, 0o700); err != nil {
		return environment.ServiceSpec{}, def, env, err
	}
	// The preview origin serves the service at its root; a definition with strip_prefix false
	// keeps the older /preview/{id}/ base (docs/previews.md "Paths").
	health, base := def.HealthPath, "/"
	if def.StripPrefix != nil && !*def.StripPrefix {
		base = "/preview/" + svc.ID + "/"
		health = "/preview/" + svc.ID + health
	}
	timeout := def.ReadyTimeoutS
	if timeout <= 0 {
		timeout = 30
	}
	return environment.ServiceSpec{ID: svc.ID, WorkspaceID: ws.ID, Command: def.Command, Root: root, PortEnv: def.PortEnv,
		Port: svc.Port, HealthPath: health, PreviewBase: base, ReadyTimeout: time.Duration(timeout) * time.Second,
		LogPath: filepath.Join(logDir, svc.ID+".log"), Placement: pl}, def, env, nil
}

// servicePlacement is environment.ServicePlacement for a stored environment, with the options a
// run of it gets (secrets opened, the data dir and server home masked, the sandbox image layer).
func servicePlacement(ctx context.Context, d Deps, env db.Environment, home string) (environment.Placement, error) {
	cfg, err := environment.Load(env.Driver, env.Config)
	if err != nil {
		return environment.Placement{}, err
	}
	var sec environment.Secrets
	if len(env.Secrets) > 0 {
		if d.Secrets == nil {
			return environment.Placement{}, errors.New("no key to open the environment's secrets")
		}
		b, err := d.Secrets.Open(env.Secrets, environment.SecretsAAD(env.ID))
		if err != nil || json.Unmarshal(b, &sec) != nil {
			return environment.Placement{}, errors.New("the environment's secrets do not open with this server's key")
		}
	}
	opts := environment.Options{NodeID: d.NodeID, Secrets: sec, Jail: d.Jail, DataDir: d.Data.Root, Masks: d.Masks, Networks: d.Networks}
	if cfg.Injects() && d.Egress != nil {
		opts.CABundle = d.Egress.Bundle()
	}
	if d.Data.Root != "" {
		opts.Masks = append([]string{d.Data.Root}, opts.Masks...)
	}
	if cfg.Driver == environment.DriverSandbox {
		v, err := db.ActiveImageVersion(ctx, d.Pool, env.CompanyID, env.ID)
		if err != nil {
			return environment.Placement{}, fmt.Errorf("the sandbox has no active image version: %w", err)
		}
		opts.ImageDir = d.Data.ImageLayer(env.ID, v.Number)
	}
	return environment.ServicePlacement(cfg, opts, home)
}

// failReason is the stop reason of a service whose start failed with err.
func failReason(err error) string {
	switch {
	case errors.Is(err, environment.ErrServicesUnsupported):
		return StopServicesUnsupported
	case errors.Is(err, environment.ErrServiceExited):
		return "exited"
	case errors.Is(err, environment.ErrServiceNotReady):
		return "not_ready"
	}
	return "start_failed"
}
