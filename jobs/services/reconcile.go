package services

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/environment"
)

// sweepGrace is how long a leftover service process gets between SIGTERM and SIGKILL (the orphan
// sweep's grace for a run's processes too).
const sweepGrace = 3 * time.Second

// Reconcile reconciles this node's runtime services with the processes on this host, for the
// orphan sweep (at startup, and on every sweep for services an earlier process of the node
// started):
//   - a live row whose process is still the recorded one (pid, start time and tag all match) and
//     answers is adopted: left running as it is;
//   - any other live row has whatever is left of its processes killed and is settled stopped
//     (supervisor_gone), so no row says running on a dead port;
//   - a live row of a plugin service (provider_ref) that this process does not run has its
//     plugin instance released first (StopService, Release), then settles the same way;
//   - a row that should run and no longer does gets a start job, which enqueueStart puts in tx
//     (one server per service: a start kills anything still tagged with the service first);
//   - processes tagged with a service whose row is not live are killed; processes tagged with an
//     id this database does not know are only logged (another Berth may share the host).
//
// Rows this very process supervises (d's supervisor id) are left to its watchers, as are the
// plugin services own runs; own is this process's Supervisor, nil when it has none.
func Reconcile(ctx context.Context, d Deps, own *Supervisor, enqueueStart func(ctx context.Context, tx pgx.Tx, id string) error) error {
	log := d.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rows, err := db.NodeRuntimeServices(ctx, d.Pool, d.NodeID)
	if err != nil {
		return err
	}
	self := d.supervisorID()
	if own != nil {
		// The id own writes on the rows it starts, which need not be the one d gives (a River
		// client built after the Supervisor has a client id the Supervisor never saw; the sweep
		// then took its own services for an earlier process's and killed them,
		// TestRuntimeServicesAPI's "a second start restarted the service").
		self = own.deps.supervisorID()
	}
	var errs []error
	live := map[string]bool{}
	for _, svc := range rows {
		if self != "" && svc.SupervisorID == self {
			live[svc.ID] = svc.Live()
			continue
		}
		if own != nil {
			if _, ok := own.remoteRunning(svc.ID); ok { // a plugin service this process runs
				live[svc.ID] = true
				continue
			}
		}
		if svc.Live() {
			if svc.Status == db.ServiceRunning && environment.ServiceAlive(svc.ID, svc.PID, svc.ProcessStart) &&
				environment.CheckHealth(ctx, nil, svc.Port, "/") == nil { // a jailed one's network died with its supervisor
				live[svc.ID] = true
				continue
			}
			if svc.ProviderRef != "" { // a plugin's instance: released, so nothing of it is left there
				if err := stopRemoteService(ctx, d, svc); err != nil {
					errs = append(errs, err)
					live[svc.ID] = true
					continue
				}
			}
			if err := environment.StopService(ctx, svc.ID, 0, svc.Port, sweepGrace); err != nil {
				errs = append(errs, err)
				live[svc.ID] = true
				continue
			}
			settled, err := db.MarkRuntimeServiceEnded(ctx, d.Pool, svc.ID, svc.Generation, db.ServiceEnd{Status: db.ServiceStopped,
				StopReason: stopSupervisorGone, LogExcerpt: svc.LogExcerpt, Restarts: svc.Restarts})
			if errors.Is(err, db.ErrServiceState) {
				continue // moved on meanwhile
			}
			if err != nil {
				errs = append(errs, err)
				continue
			}
			svc = settled
			log.InfoContext(ctx, "service settled", "service_id", svc.ID, "reason", stopSupervisorGone)
		}
		if svc.DesiredState == db.DesiredRunning && (svc.Status == db.ServiceStopped ||
			svc.Status == db.ServiceFailed && svc.StopReason == stopCrashed && svc.Restarts <= serviceMaxRestarts) {
			errs = append(errs, db.InTx(ctx, d.Pool, func(tx pgx.Tx) error {
				return enqueueStart(ctx, tx, svc.ID)
			}))
		}
	}

	tagged, err := environment.TaggedServices(ctx)
	errs = append(errs, err)
	for id := range tagged {
		if live[id] {
			continue
		}
		fresh, err := db.RuntimeServiceForProxy(ctx, d.Pool, id)
		if err != nil {
			if errors.Is(err, db.ErrNotFound) {
				log.WarnContext(ctx, "processes tagged with an unknown service", "service_id", id, "pids", tagged[id])
			}
			continue
		}
		// Read again: a service that started after the rows above were read is live now, and its
		// processes are its supervisor's, not leftovers (killing them here was a SIGTERM to a
		// service half a second into its start).
		if fresh.Live() {
			continue
		}
		errs = append(errs, environment.StopService(ctx, id, 0, 0, sweepGrace))
	}
	return errors.Join(errs...)
}
