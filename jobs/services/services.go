// Package services is this node's runtime-service supervisor (docs/previews.md). It owns the
// runtime-service processes this Berth process starts, the watcher of each and its crash
// restarts, and the state transitions of their runtime_services rows (starting, running,
// stopping, stopped, failed) with their service_start and service_stop ledger steps; for the
// orphan sweep it reconciles this node's rows with the processes on this host (Reconcile).
//
// It may touch the database (package db), processes, ports, jails and plugin instances (package
// environment, its Supervisor and drivers), the workspaces' network namespaces
// (environment/netns), their roots (workspace) and the data dir (environment/datadir). It inserts
// no job and imports nothing of package jobs: the runtime_service job kind, finalize and close
// call it, and Reconcile asks its caller to enqueue the starts it finds wanted.
package services

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/environment"
	"berth/environment/datadir"
	"berth/environment/jail"
	"berth/environment/netns"
	"berth/environment/seal"
	"berth/workspace"
)

// The API records what a caller wants (desired_state) and enqueues runtime_service in the same
// transaction; the job asks this node's Supervisor, which carries it out with the environment's
// supervisor and records every step on the row and in the workspace's ledger (service_start,
// service_stop). A service that crashes while it should run is restarted with a bounded backoff,
// then left failed. The orphan sweep settles rows whose process is gone and kills tagged
// processes no row owns (Reconcile).

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

// Deps are what the supervisor needs from the process that runs it (jobs.NewServices builds
// them from jobs.Deps).
type Deps struct {
	Pool *pgxpool.Pool
	Log  *slog.Logger
	// NodeID names this node on the rows and ledger steps of the services it starts.
	NodeID string
	// SupervisorID names this process on the rows it starts (its River client id); empty: NodeID.
	// Reconcile leaves the rows of this very supervisor to its watchers.
	SupervisorID string
	// Workspaces finds an execution workspace's root on this node's disk.
	Workspaces *workspace.Manager
	// Data is Berth's data dir (service logs, image layers); with Masks (the server user's home)
	// its root is hidden from every service's jail.
	Data  datadir.Layout
	Masks []string
	// HomeDir holds a private HOME per workspace for its services (outside every workspace).
	HomeDir string
	// Secrets opens environments' sealed secrets for the services' placement.
	Secrets *seal.Sealer
	// Jail is this host's bubblewrap and run user (jail.Detect); nil: contained services refuse.
	Jail *jail.Host
	// Networks are this node's workspace network namespaces: a service joins its workspace's and
	// DialService reaches it there. Nil when Berth is not root.
	Networks *netns.Networks
	// Egress is this node's egress proxy; nil: no policy is bound and no CA injected.
	Egress Egress
	// Driver builds the driver of a stored environment as a run of it gets it: plugin services
	// start and stop through it (plugin.go). Nil: plugin environments cannot run services here.
	Driver func(ctx context.Context, env db.Environment) (environment.Driver, error)
}

// Egress is the part of this node's egress proxy (jobs.Egress) a service's jail needs: its
// connections follow its environment's policy, and an environment whose credentials the proxy
// injects trusts the proxy's CA.
type Egress interface {
	Bind(key, companyID, environmentID string, run *db.Run, log io.Writer) (unbind func())
	Bundle() string
}

// supervisorID is who supervises the services this process starts.
func (d Deps) supervisorID() string {
	if d.SupervisorID != "" {
		return d.SupervisorID
	}
	return d.NodeID
}

// Supervisor runs this process's runtime services: one environment supervisor, one lock per
// service (a start and a stop of one service never overlap), and a watcher per running process.
type Supervisor struct {
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

// New builds the runtime-service supervisor of a process.
func New(d Deps) *Supervisor {
	log := d.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	life, end := context.WithCancel(context.Background())
	return &Supervisor{deps: d, sup: &environment.Supervisor{}, life: life, end: end, lock: map[string]*sync.Mutex{},
		remote: map[string]remoteService{}, log: log.With("component", "services")}
}

// Close stops watching: no crash restart happens after it. The processes themselves end with
// this process (the jail dies with its parent); the next sweep of the node settles their rows.
func (m *Supervisor) Close() { m.end() }

// supervisorID names this process on the rows it owns.
func (m *Supervisor) supervisorID() string { return m.deps.supervisorID() }

func (m *Supervisor) locked(id string) func() {
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
func (m *Supervisor) Start(ctx context.Context, id string, restart bool) error {
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
func (m *Supervisor) start(ctx context.Context, svc db.RuntimeService) error {
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
func (m *Supervisor) recordPreview(ctx context.Context, svc db.RuntimeService) {
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
func (m *Supervisor) watch(p *environment.Process, started db.RuntimeService) {
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
func (m *Supervisor) Stop(ctx context.Context, id, reason string) error {
	defer m.locked(id)()
	svc, err := db.RuntimeServiceForProxy(ctx, m.deps.Pool, id)
	if err != nil {
		return fmt.Errorf("stop service: %w", err)
	}
	return m.stop(ctx, svc, reason)
}

func (m *Supervisor) stop(ctx context.Context, svc db.RuntimeService, reason string) error {
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
func (m *Supervisor) StopWorkspace(ctx context.Context, companyID, workspaceID, reason string, onRunFinish bool) error {
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
