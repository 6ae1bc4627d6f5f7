package jobs

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"berth/db"
	"berth/environment"
	"berth/jobs/services"
)

// Runtime services (docs/previews.md). The API records what a caller wants (desired_state) and
// enqueues runtime_service in the same transaction; this node's supervisor (package
// jobs/services) carries it out and records every step on the row and in the workspace's ledger.
// The orphan sweep reconciles this node's rows with the processes on the host (sweepServices).

// Service control actions.
const (
	ServiceStart   = "start"
	ServiceStop    = "stop"
	ServiceRestart = "restart"
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

// RuntimeServiceWorker carries out one control step through the node's supervisor.
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

// NewServices builds the runtime-service supervisor of a process from its Deps; Workers makes
// one when Deps has none.
func NewServices(d Deps) *services.Supervisor { return services.New(d.serviceDeps()) }

// serviceDeps is what the runtime-service supervisor gets of d.
func (d Deps) serviceDeps() services.Deps {
	var eg services.Egress
	if d.Egress != nil {
		eg = d.Egress
	}
	return services.Deps{Pool: d.Pool, Log: d.Log, NodeID: d.NodeID, SupervisorID: d.Executing.ClientID(),
		Workspaces: d.Workspaces, Data: d.Data, Masks: d.Masks, HomeDir: d.HomeDir, Secrets: d.Secrets, Jail: d.Jail,
		Networks: d.Networks, Egress: eg,
		Driver: func(ctx context.Context, env db.Environment) (environment.Driver, error) {
			return environmentDriver(ctx, d, env)
		}}
}

// sweepServices is the services part of the orphan sweep: services.Reconcile with this
// sweep's start jobs, then, except at startup, a stop job for every running idle_timeout service
// without a proxied request for its timeout.
func (s sweeper) sweepServices(ctx context.Context, startup bool) error {
	d := s.deps.serviceDeps()
	d.Log = s.log
	errs := []error{services.Reconcile(ctx, d, s.deps.Services, func(ctx context.Context, tx pgx.Tx, id string) error {
		return EnqueueService(ctx, s.ins, tx, id, ServiceStart, "")
	})}
	if !startup {
		idle, err := db.IdleRuntimeServices(ctx, s.deps.Pool, s.deps.NodeID)
		errs = append(errs, err)
		for _, svc := range idle {
			errs = append(errs, db.InTx(ctx, s.deps.Pool, func(tx pgx.Tx) error {
				if _, err := db.SetRuntimeServiceDesired(ctx, tx, svc.ID, db.DesiredStopped, ""); err != nil {
					return err
				}
				return EnqueueService(ctx, s.ins, tx, svc.ID, ServiceStop, services.StopIdle)
			}))
		}
	}
	return errors.Join(errs...)
}

// EnqueueService enqueues a control step for a service inside tx.
func EnqueueService(ctx context.Context, ins jobClient, tx pgx.Tx, id, action, reason string) error {
	_, err := Enqueue(ctx, ins, tx, RuntimeServiceArgs{ServiceID: id, Action: action, Reason: reason})
	return err
}
