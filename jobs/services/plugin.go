package services

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/riverqueue/river"

	"berth/db"
	"berth/environment"
	"berth/workspace"
)

// Runtime services of plugin environments (docs/plugins.md "Services and terminals"). Such a
// service never runs on this host: it gets an instance of its own from the plugin (Acquire with
// a key of the service and its generation), the workspace is realized there, the plugin's
// StartService starts it and answers the 127.0.0.1 port it published, and that port is the
// row's. Health is checked there, previews dial it there (DialService), and a stop is the
// plugin's StopService followed by Release, which removes the instance with whatever is left.
// A plugin that does not name the services capability is refused: services_unsupported.

// StopServicesUnsupported is the stop reason of a service its environment cannot run (a plugin
// without the services capability, a sandbox without network, an ssh host).
const StopServicesUnsupported = "services_unsupported"

// remoteStopTimeout bounds a plugin service's stop: StopService and Release, each also under
// the plugin's own call deadline.
const remoteStopTimeout = 2 * time.Minute

// remoteService is a service this process started on a plugin instance.
type remoteService struct {
	workspaceID string
	port        int
}

// remoteRunning is the port of plugin service id while this process runs it.
func (m *Supervisor) remoteRunning(id string) (remoteService, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.remote[id]
	return r, ok
}

// remoteFor reports whether port of workspace workspaceID is a plugin service this process runs.
func (m *Supervisor) remoteFor(workspaceID string, port int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.remote {
		if r.workspaceID == workspaceID && r.port == port {
			return true
		}
	}
	return false
}

// cannotStart settles a service that cannot start at all (the row says why; a retry would say
// the same, so the job is cancelled).
func (m *Supervisor) cannotStart(ctx context.Context, svc db.RuntimeService, err error) error {
	reason := "cannot_start"
	if errors.Is(err, environment.ErrServicesUnsupported) {
		reason = StopServicesUnsupported
	}
	_, e := db.MarkRuntimeServiceEnded(ctx, m.deps.Pool, svc.ID, 0, db.ServiceEnd{Status: db.ServiceFailed,
		LogExcerpt: err.Error(), StopReason: reason})
	m.log.InfoContext(ctx, "service cannot start", "service_id", svc.ID, "reason", reason, "err", err)
	return errors.Join(e, river.JobCancel(err))
}

// driver builds the driver of a stored environment as a run of it gets it (Deps.Driver).
func (d Deps) driver(ctx context.Context, env db.Environment) (environment.Driver, error) {
	if d.Driver == nil {
		return nil, fmt.Errorf("environment %s: this process builds no drivers", env.Name)
	}
	return d.Driver(ctx, env)
}

// startRemote starts svc on an instance of its plugin environment env; the caller holds its lock.
func (m *Supervisor) startRemote(ctx context.Context, svc db.RuntimeService, spec environment.ServiceSpec, def db.ServiceDefinition, env db.Environment) error {
	drv, err := m.deps.driver(ctx, env)
	if err != nil {
		return m.cannotStart(ctx, svc, err)
	}
	rs, _, err := environment.ServicesOf(ctx, drv)
	if err != nil {
		if errors.Is(err, environment.ErrServicesUnsupported) {
			return m.cannotStart(ctx, svc, err)
		}
		return err // the plugin did not start or answer: the job's retry tries again
	}
	ws, err := db.ExecutionWorkspaceByID(ctx, m.deps.Pool, svc.CompanyID, svc.ExecutionWorkspaceID)
	if err != nil {
		return err
	}
	row, err := db.MarkRuntimeServiceStarting(ctx, m.deps.Pool, svc.ID, db.ServiceStart{NodeID: m.deps.NodeID,
		SupervisorID: m.supervisorID(), LogPath: spec.LogPath, Command: spec.Command, IdleTimeoutS: idleSeconds(def)})
	if err != nil {
		return err
	}
	op, err := db.StartOperation(ctx, m.deps.Pool, db.NewOperation{CompanyID: svc.CompanyID, ExecutionWorkspaceID: svc.ExecutionWorkspaceID,
		RunID: svc.RunID, Phase: "service_start", Command: spec.Command, NodeID: m.deps.NodeID})
	if err != nil {
		return err
	}
	logLine(spec.LogPath, "--- berth: starting service on plugin %s at %s", env.Name, time.Now().UTC().Format(time.RFC3339))
	started, err := rs.StartRemoteService(ctx, environment.RemoteServiceRequest{
		Key: "svc-" + svc.ID + "-" + strconv.FormatInt(row.Generation, 10), Tag: svc.ID, WorkspaceRef: ws.Ref, HostPath: spec.Root,
		Name: svc.Name, Command: spec.Command, PortEnv: spec.PortEnv,
		Env: map[string]string{environment.WorkspaceVar: ws.ID, environment.PreviewBaseVar: previewBase(spec)}})
	if err == nil {
		row, err = db.MarkRuntimeServiceRemote(ctx, m.deps.Pool, svc.ID, row.Generation, started.Port, started.Instance.Ref)
		if err == nil {
			logLine(spec.LogPath, "--- berth: the plugin published it on %s", started.Address)
			err = environment.WaitHealthy(ctx, nil, nil, started.Port, spec.HealthPath, spec.ReadyTimeout)
		}
		if err != nil {
			bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), remoteStopTimeout)
			err = errors.Join(err, rs.StopRemoteService(bg, started.Instance, svc.Name))
			cancel()
		}
	}
	if err != nil {
		logLine(spec.LogPath, "--- berth: %v", err)
		excerpt, _ := environment.LogTail(spec.LogPath, serviceExcerpt)
		_, e1 := db.MarkRuntimeServiceEnded(ctx, m.deps.Pool, svc.ID, row.Generation, db.ServiceEnd{Status: db.ServiceFailed,
			LogExcerpt: excerpt, StopReason: failReason(err), Restarts: svc.Restarts})
		e2 := db.FinishOperation(ctx, m.deps.Pool, op.ID, db.OperationResult{Status: "failed", Log: []byte(excerpt),
			LogBytes: int64(len(excerpt)), Error: err.Error()})
		m.log.InfoContext(ctx, "plugin service failed to start", "service_id", svc.ID, "err", err)
		return errors.Join(e1, e2)
	}
	row, err = db.MarkRuntimeServiceRunning(ctx, m.deps.Pool, svc.ID, row.Generation, 0, 0, 0)
	if err != nil {
		bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), remoteStopTimeout)
		defer cancel()
		return errors.Join(err, rs.StopRemoteService(bg, started.Instance, svc.Name))
	}
	m.mu.Lock()
	m.remote[svc.ID] = remoteService{workspaceID: ws.ID, port: started.Port}
	m.mu.Unlock()
	excerpt, _ := environment.LogTail(spec.LogPath, serviceExcerpt)
	_ = db.FinishOperation(ctx, m.deps.Pool, op.ID, db.OperationResult{Status: "succeeded", Log: []byte(excerpt), LogBytes: int64(len(excerpt))})
	m.recordPreview(ctx, row)
	return nil
}

// stopRemote stops a plugin service and releases its instance (bounded by remoteStopTimeout).
func (m *Supervisor) stopRemote(ctx context.Context, svc db.RuntimeService) error {
	err := stopRemoteService(ctx, m.deps, svc)
	if err == nil {
		m.mu.Lock()
		delete(m.remote, svc.ID)
		m.mu.Unlock()
	}
	return err
}

// stopRemoteService is stopRemote for any process of the node (the sweep settles the plugin
// services of a Berth process that is gone).
func stopRemoteService(ctx context.Context, d Deps, svc db.RuntimeService) error {
	inst, ok := environment.RemoteInstance(svc.ProviderRef)
	if !ok || inst.Driver != environment.DriverPlugin {
		return fmt.Errorf("stop service: %q is no plugin instance", svc.ProviderRef)
	}
	ws, err := db.ExecutionWorkspaceByID(ctx, d.Pool, svc.CompanyID, svc.ExecutionWorkspaceID)
	if err != nil {
		return fmt.Errorf("stop service: %w", err)
	}
	var plan workspace.Plan
	_ = json.Unmarshal(ws.Plan, &plan)
	env, err := db.EnvironmentByID(ctx, d.Pool, svc.CompanyID, plan.EnvironmentID)
	if err != nil {
		return fmt.Errorf("stop service: the workspace's environment: %w", err)
	}
	drv, err := d.driver(ctx, env)
	if err != nil {
		return fmt.Errorf("stop service: %w", err)
	}
	rs, ok := drv.(environment.RemoteServices)
	if !ok {
		return fmt.Errorf("stop service: environment %s is not a plugin's any more", env.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, remoteStopTimeout)
	defer cancel()
	return rs.StopRemoteService(ctx, inst, svc.Name)
}

// idleSeconds is a definition's idle timeout in seconds (default 30 minutes).
func idleSeconds(def db.ServiceDefinition) int {
	if def.IdleTimeoutM > 0 {
		return def.IdleTimeoutM * 60
	}
	return 1800
}

// previewBase is the path the service is served under on its preview origin (ServiceSpec).
func previewBase(spec environment.ServiceSpec) string {
	if spec.PreviewBase == "" {
		return "/"
	}
	return spec.PreviewBase
}

// logLine appends one of Berth's own lines to a service's log (a plugin's service writes its
// output inside its instance, where Berth does not read it).
func logLine(path, format string, args ...any) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, format+"\n", args...)
}
