package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"berth/db"
	"berth/environment"
	"berth/workspace"
)

// Runtime services (docs/previews.md). The API records what a caller wants (desired_state) and
// enqueues runtime_service in the same transaction; this node's Services carries it out with the
// environment's supervisor and records every step on the row and in the workspace's ledger
// (service_start, service_stop). A service that crashes while it should run is restarted with a
// bounded backoff, then left failed. The orphan sweep settles rows whose process is gone and
// kills tagged processes no row owns (sweepServices).

// Service control actions.
const (
	ServiceStart   = "start"
	ServiceStop    = "stop"
	ServiceRestart = "restart"
)

const (
	// serviceMaxRestarts bounds the crash restarts of a service before it is left failed.
	serviceMaxRestarts = 3
	// serviceBackoff is the wait before the first crash restart; it doubles each time.
	serviceBackoff = time.Second
	// serviceExcerpt is how much of a service's log a failure keeps on its row.
	serviceExcerpt = 4096
)

// Stop reasons recorded on a stopped service.
const (
	StopRequested       = "requested"
	StopRunFinished     = "run_finished"
	StopIdle            = "idle_timeout"
	StopWorkspaceClosed = "workspace_closed"
	stopSupervisorGone  = "supervisor_gone"
	stopCrashed         = "crashed"
)

// RuntimeServiceArgs asks this node to start, stop or restart one runtime service.
type RuntimeServiceArgs struct {
	ServiceID string `json:"service_id"`
	Action    string `json:"action"`
	Reason    string `json:"reason,omitempty"`
}

// Kind names the job in River.
func (RuntimeServiceArgs) Kind() string { return "runtime_service" }

// InsertOpts: a failed control step is retried a few times (the row tells what is wanted).
func (RuntimeServiceArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{MaxAttempts: 3} }

// RuntimeServiceWorker carries out one control step through the node's Services.
type RuntimeServiceWorker struct {
	river.WorkerDefaults[RuntimeServiceArgs]
	deps Deps
}

// Work starts, stops or restarts the service; each is idempotent (a started service that runs
// healthy is left alone, a stopped one stays stopped).
func (w *RuntimeServiceWorker) Work(ctx context.Context, job *river.Job[RuntimeServiceArgs]) error {
	if w.deps.Services == nil {
		return errors.New("runtime service: this process has no supervisor")
	}
	switch job.Args.Action {
	case ServiceStart:
		return w.deps.Services.Start(ctx, job.Args.ServiceID, false)
	case ServiceRestart:
		return w.deps.Services.Start(ctx, job.Args.ServiceID, true)
	case ServiceStop:
		return w.deps.Services.Stop(ctx, job.Args.ServiceID, job.Args.Reason)
	}
	return river.JobCancel(fmt.Errorf("runtime service: unknown action %q", job.Args.Action))
}

// Services runs this process's runtime services: one supervisor, one lock per service (a start
// and a stop of one service never overlap), and a watcher per running process.
type Services struct {
	deps Deps
	sup  *environment.Supervisor
	life context.Context // watchers and crash restarts live as long as the process
	end  context.CancelFunc
	mu   sync.Mutex
	lock map[string]*sync.Mutex
	log  *slog.Logger
	// remote are the services this process started on plugin instances, by id (under mu).
	remote map[string]remoteService
}

// NewServices builds the runtime services of a process; Workers makes one when Deps has none.
func NewServices(d Deps) *Services {
	log := d.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	life, end := context.WithCancel(context.Background())
	return &Services{deps: d, sup: &environment.Supervisor{}, life: life, end: end, lock: map[string]*sync.Mutex{},
		remote: map[string]remoteService{}, log: log.With("component", "services")}
}

// Close stops watching: no crash restart happens after it. The processes themselves end with
// this process (the jail dies with its parent); the next sweep of the node settles their rows.
func (m *Services) Close() { m.end() }

// supervisorID names this process on the rows it owns.
func (m *Services) supervisorID() string { return m.deps.supervisorID() }

// supervisorID is who supervises the services this process starts: its River client id, or the
// node id without one. The sweep leaves rows of this very supervisor to its watchers.
func (d Deps) supervisorID() string {
	if d.Executing != nil {
		return d.Executing.ClientID()
	}
	return d.NodeID
}

func (m *Services) locked(id string) func() {
	m.mu.Lock()
	l, ok := m.lock[id]
	if !ok {
		l = &sync.Mutex{}
		m.lock[id] = l
	}
	m.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// Start starts service id if it should run and is not already running healthy here (restart:
// stop it first, keeping the row, the id, the URL and, when still free, the port).
func (m *Services) Start(ctx context.Context, id string, restart bool) error {
	defer m.locked(id)()
	svc, err := db.RuntimeServiceForProxy(ctx, m.deps.Pool, id)
	if err != nil {
		return fmt.Errorf("start service: %w", err)
	}
	if svc.DesiredState != db.DesiredRunning {
		return nil
	}
	if _, ok := m.sup.Running(id); ok && svc.Status == db.ServiceRunning && !restart {
		return nil
	}
	if _, ok := m.remoteRunning(id); ok && svc.Status == db.ServiceRunning && !restart {
		return nil
	}
	if restart && svc.Live() {
		// The old server holds the port: end it first, so the new one keeps the port (its
		// watcher then finds a new generation and records nothing).
		if _, ok := m.sup.Running(id); ok {
			err = m.sup.Stop(ctx, id)
		} else if svc.ProviderRef != "" {
			err = m.stopRemote(ctx, svc)
		} else {
			err = environment.StopService(ctx, id, 0, svc.Port, environment.DefaultGrace)
		}
		if err != nil {
			return fmt.Errorf("restart service: %w", err)
		}
	}
	return m.start(ctx, svc)
}

// start starts svc under a new generation; the caller holds its lock.
func (m *Services) start(ctx context.Context, svc db.RuntimeService) error {
	spec, def, env, err := m.specFor(ctx, svc)
	if err == nil && env.Driver == environment.DriverPlugin {
		return m.startRemote(ctx, svc, spec, def, env)
	}
	if err != nil {
		return m.cannotStart(ctx, svc, err)
	}
	taken, err := db.NodeServicePorts(ctx, m.deps.Pool, m.deps.NodeID)
	if err != nil {
		return err
	}
	if svc.Status != db.ServiceStopped && svc.Status != db.ServiceFailed {
		delete(taken, svc.Port) // its own port, still held by its previous generation
	}
	var row db.RuntimeService
	for attempt := 0; ; attempt++ {
		port, err := environment.ReservePort(svc.Port, func(p int) bool { return taken[p] })
		if err != nil {
			return err
		}
		row, err = db.MarkRuntimeServiceStarting(ctx, m.deps.Pool, svc.ID, db.ServiceStart{Port: port, NodeID: m.deps.NodeID,
			SupervisorID: m.supervisorID(), LogPath: spec.LogPath, Command: spec.Command, IdleTimeoutS: idleSeconds(def)})
		if errors.Is(err, db.ErrPortTaken) && attempt < 5 {
			taken[port] = true
			continue
		}
		if err != nil {
			return err
		}
		spec.Port = port
		break
	}
	op, err := db.StartOperation(ctx, m.deps.Pool, db.NewOperation{CompanyID: svc.CompanyID, ExecutionWorkspaceID: svc.ExecutionWorkspaceID,
		RunID: svc.RunID, Phase: "service_start", Command: spec.Command, NodeID: m.deps.NodeID})
	if err != nil {
		return err
	}
	p, err := m.sup.Start(ctx, spec)
	excerpt, _ := environment.LogTail(spec.LogPath, serviceExcerpt)
	if err != nil {
		end := db.ServiceEnd{Status: db.ServiceFailed, LogExcerpt: excerpt, StopReason: failReason(err), Restarts: svc.Restarts}
		if p != nil && p.ExitCode() >= 0 {
			code := p.ExitCode()
			end.ExitCode = &code
		}
		_, e1 := db.MarkRuntimeServiceEnded(ctx, m.deps.Pool, svc.ID, row.Generation, end)
		e2 := db.FinishOperation(ctx, m.deps.Pool, op.ID, db.OperationResult{Status: db.OpFailed, ExitCode: end.ExitCode,
			Log: []byte(excerpt), LogBytes: int64(len(excerpt)), Error: err.Error()})
		m.log.InfoContext(ctx, "service failed to start", "service_id", svc.ID, "err", err)
		return errors.Join(e1, e2)
	}
	row, err = db.MarkRuntimeServiceRunning(ctx, m.deps.Pool, svc.ID, row.Generation, p.PID, p.PGID, p.StartTime)
	if err != nil {
		_ = m.sup.Stop(context.WithoutCancel(ctx), svc.ID)
		return err
	}
	_ = db.FinishOperation(ctx, m.deps.Pool, op.ID, db.OperationResult{Status: db.OpSucceeded, Log: []byte(excerpt), LogBytes: int64(len(excerpt))})
	m.recordPreview(ctx, row)
	go m.watch(p, row)
	return nil
}

// recordPreview records the healthy preview as a preview_url work product of the workspace's
// task (once per workspace and service).
func (m *Services) recordPreview(ctx context.Context, svc db.RuntimeService) {
	ws, err := db.ExecutionWorkspaceByID(ctx, m.deps.Pool, svc.CompanyID, svc.ExecutionWorkspaceID)
	if err != nil {
		return
	}
	err = db.AddWorkProduct(ctx, m.deps.Pool, db.WorkProduct{CompanyID: svc.CompanyID, TaskID: ws.SourceTaskID,
		ExecutionWorkspaceID: svc.ExecutionWorkspaceID, Kind: "preview_url", Ref: svc.ID, URL: "/preview/" + svc.ID + "/",
		Metadata: map[string]any{"service": svc.Name}})
	if err != nil {
		m.log.WarnContext(ctx, "preview work product", "service_id", svc.ID, "err", err)
	}
}

// watch waits for a running service's process to end. If it ended by itself while the service
// should run, that is a crash: restart after a backoff, at most serviceMaxRestarts times, then
// leave it failed with its exit code and log.
func (m *Services) watch(p *environment.Process, started db.RuntimeService) {
	select {
	case <-p.Done():
	case <-m.life.Done():
		return
	}
	ctx := m.life
	unlock := m.locked(started.ID)
	svc, err := db.RuntimeServiceForProxy(ctx, m.deps.Pool, started.ID)
	if err != nil || svc.Generation != started.Generation || svc.Status != db.ServiceRunning {
		unlock() // stopped or restarted meanwhile: whoever did it recorded it
		return
	}
	code := p.ExitCode()
	excerpt, _ := environment.LogTail(svc.LogPath, serviceExcerpt)
	// The jail's first process is gone, so its pid namespace is; an uncontained service may
	// have left children, and its port must be free before anything reuses it.
	_ = environment.StopService(ctx, svc.ID, 0, svc.Port, 2*time.Second)
	end := db.ServiceEnd{Status: db.ServiceFailed, ExitCode: &code, LogExcerpt: excerpt, StopReason: stopCrashed, Restarts: svc.Restarts + 1}
	svc, err = db.MarkRuntimeServiceEnded(ctx, m.deps.Pool, svc.ID, svc.Generation, end)
	unlock()
	if err != nil || svc.DesiredState != db.DesiredRunning || svc.Restarts > serviceMaxRestarts {
		m.log.Info("service crashed", "service_id", started.ID, "exit_code", code, "restarts", svc.Restarts)
		return
	}
	select {
	case <-time.After(serviceBackoff << (svc.Restarts - 1)):
	case <-m.life.Done():
		return
	}
	defer m.locked(svc.ID)()
	svc, err = db.RuntimeServiceForProxy(ctx, m.deps.Pool, svc.ID)
	if err != nil || svc.DesiredState != db.DesiredRunning || svc.Status != db.ServiceFailed || svc.StopReason != stopCrashed {
		return // stopped, or started again by someone else, during the backoff
	}
	if err := m.start(ctx, svc); err != nil {
		m.log.Warn("service restart", "service_id", svc.ID, "err", err)
	}
}

// Stop stops service id: its processes gone and its port free, then stopped with reason.
func (m *Services) Stop(ctx context.Context, id, reason string) error {
	defer m.locked(id)()
	svc, err := db.RuntimeServiceForProxy(ctx, m.deps.Pool, id)
	if err != nil {
		return fmt.Errorf("stop service: %w", err)
	}
	return m.stop(ctx, svc, reason)
}

func (m *Services) stop(ctx context.Context, svc db.RuntimeService, reason string) error {
	if reason == "" {
		reason = StopRequested
	}
	if !svc.Live() {
		// Nothing of it should run; make sure nothing tagged with it does.
		return environment.StopService(ctx, svc.ID, 0, 0, m.sup.Grace)
	}
	if err := db.MarkRuntimeServiceStopping(ctx, m.deps.Pool, svc.ID); err != nil {
		return err
	}
	op, err := db.StartOperation(ctx, m.deps.Pool, db.NewOperation{CompanyID: svc.CompanyID, ExecutionWorkspaceID: svc.ExecutionWorkspaceID,
		RunID: svc.RunID, Phase: "service_stop", Command: "berth: stop service " + svc.Name, NodeID: m.deps.NodeID})
	if err != nil {
		return err
	}
	var stopErr error
	var code *int
	if p, ok := m.sup.Running(svc.ID); ok {
		stopErr = m.sup.Stop(ctx, svc.ID)
		if c := p.ExitCode(); c >= 0 {
			code = &c
		}
	} else if svc.ProviderRef != "" {
		stopErr = m.stopRemote(ctx, svc)
	} else {
		stopErr = environment.StopService(ctx, svc.ID, 0, svc.Port, environment.DefaultGrace)
	}
	excerpt, _ := environment.LogTail(svc.LogPath, serviceExcerpt)
	if stopErr != nil {
		_ = db.FinishOperation(ctx, m.deps.Pool, op.ID, db.OperationResult{Status: db.OpFailed, Error: stopErr.Error()})
		return stopErr
	}
	_, err = db.MarkRuntimeServiceEnded(ctx, m.deps.Pool, svc.ID, 0, db.ServiceEnd{Status: db.ServiceStopped, ExitCode: code,
		LogExcerpt: excerpt, StopReason: reason})
	return errors.Join(err, db.FinishOperation(ctx, m.deps.Pool, op.ID, db.OperationResult{Status: db.OpSucceeded}))
}

// StopWorkspace stops every service of a workspace that is live or should run (close; finalize
// with onRunFinish limits it to the on_run_finish services), wanting them stopped from now on.
func (m *Services) StopWorkspace(ctx context.Context, companyID, workspaceID, reason string, onRunFinish bool) error {
	list, err := db.WorkspaceRuntimeServices(ctx, m.deps.Pool, companyID, workspaceID)
	if err != nil {
		return err
	}
	var errs []error
	for _, svc := range list {
		if onRunFinish && svc.StopPolicy != "on_run_finish" {
			continue
		}
		if !svc.Live() && svc.DesiredState != db.DesiredRunning {
			continue
		}
		if _, err := db.SetRuntimeServiceDesired(ctx, m.deps.Pool, svc.ID, db.DesiredStopped, ""); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, m.Stop(ctx, svc.ID, reason))
	}
	return errors.Join(errs...)
}

// specFor reads what a start needs: the workspace (ready, services allowed by its plan), the
// service's definition (read at each start), its environment, its placement and the paths. A
// plugin environment's spec has no placement: the plugin places the service (startRemote).
func (m *Services) specFor(ctx context.Context, svc db.RuntimeService) (environment.ServiceSpec, db.ServiceDefinition, db.Environment, error) {
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
		m.deps.Egress.Bind(ws.ID, env.CompanyID, env.ID, nil, nil) // the service's connections follow its environment's policy
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
	if cfg.Injects() {
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

// EnqueueService enqueues a control step for a service inside tx.
func EnqueueService(ctx context.Context, ins jobClient, tx pgx.Tx, id, action, reason string) error {
	_, err := Enqueue(ctx, ins, tx, RuntimeServiceArgs{ServiceID: id, Action: action, Reason: reason})
	return err
}
