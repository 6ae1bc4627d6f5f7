package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"berth/db"
	"berth/environment"
)

// Lease expiry and cleanup (docs/runs.md "Leases", docs/jobs.md): a periodic job expires leases whose holder stopped
// heartbeating and enqueues their cleanup in the same transaction; cleanup retries with backoff,
// and after its last attempt the lease stays cleanup failed, for an administrator's "retry
// cleanup" (which enqueues cleanup_lease again).

// ExpireLeasesInterval is how often the leader enqueues expire_leases.
const ExpireLeasesInterval = 30 * time.Second

// expireBatch is how many leases one transaction expires.
const expireBatch = 100

// cleanupAttempts is how often cleanup_lease is tried (River's backoff between: about 1 s, 16 s,
// 81 s, 256 s) before the lease is left cleanup failed.
const cleanupAttempts = 5

// ExpireLeasesArgs asks for one expiry pass.
type ExpireLeasesArgs struct{}

// Kind names the job in River.
func (ExpireLeasesArgs) Kind() string { return "expire_leases" }

// InsertOpts: one pass per interval however many nodes enqueue; a failed pass is not retried.
func (ExpireLeasesArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: 1, UniqueOpts: river.UniqueOpts{ByPeriod: ExpireLeasesInterval}}
}

// ExpireLeasesWorker expires every live lease past its expires_at (database clock).
type ExpireLeasesWorker struct {
	river.WorkerDefaults[ExpireLeasesArgs]
	deps Deps
}

// Work expires leases in batches, each with its cleanup jobs and audit events in one
// transaction, until none is due.
func (w *ExpireLeasesWorker) Work(ctx context.Context, job *river.Job[ExpireLeasesArgs]) error {
	client := river.ClientFromContext[pgx.Tx](ctx)
	total := 0
	for {
		var n int
		err := db.InTx(ctx, w.deps.Pool, func(tx pgx.Tx) error {
			leases, err := db.ExpireLeases(ctx, tx, expireBatch)
			if err != nil {
				return err
			}
			n = len(leases)
			for _, l := range leases {
				if _, err := Enqueue(ctx, client, tx, CleanupLeaseArgs{LeaseID: l.ID, Generation: l.Generation}); err != nil {
					return fmt.Errorf("enqueue cleanup of lease %s: %w", l.ID, err)
				}
				if err := db.InsertAudit(ctx, tx, db.AuditEvent{CompanyID: l.CompanyID, ActorType: db.ActorSystem,
					ActorLabel: "lease expiry", Action: "lease.expired", TargetType: "environment_lease", TargetID: l.ID,
					Details: map[string]any{"run_id": l.RunID, "generation": l.Generation}}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		total += n
		if n < expireBatch {
			break
		}
	}
	if total > 0 {
		w.deps.Log.Info("leases expired", "count", total)
	}
	return nil
}

// CleanupLeaseArgs asks to clean up after an ended lease whose cleanup is pending: stop what the
// lease's run left running, then record the cleanup. Generation is the lease generation the
// cleanup was asked at (from the expiry or the admin action); 0 takes the current one.
type CleanupLeaseArgs struct {
	LeaseID    string `json:"lease_id"`
	Generation int64  `json:"generation,omitempty"`
}

// Kind names the job in River.
func (CleanupLeaseArgs) Kind() string { return "cleanup_lease" }

// InsertOpts retries a failed cleanup with River's backoff, cleanupAttempts times in all.
func (CleanupLeaseArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: cleanupAttempts}
}

// CleanupLeaseWorker cleans up ended leases. It is idempotent: a lease whose cleanup already
// succeeded, or that is gone, is left alone.
type CleanupLeaseWorker struct {
	river.WorkerDefaults[CleanupLeaseArgs]
	deps Deps
}

// Work cleans up once; on the last attempt a failure is recorded on the lease (cleanup failed,
// with the reason), where it stays until an administrator retries.
func (w *CleanupLeaseWorker) Work(ctx context.Context, job *river.Job[CleanupLeaseArgs]) error {
	lease, err := db.LeaseForJob(ctx, w.deps.Pool, job.Args.LeaseID)
	if errors.Is(err, db.ErrNotFound) {
		return nil // deleted: nothing left to clean
	}
	if err != nil {
		return err
	}
	if lease.Live() {
		return river.JobCancel(fmt.Errorf("cleanup lease %s: the lease is still %s", lease.ID, lease.Status))
	}
	if lease.CleanupStatus != db.LeaseCleanupPending && lease.CleanupStatus != db.LeaseCleanupFailed {
		return nil // succeeded already, or nothing was ever asked
	}
	gen := job.Args.Generation
	if gen == 0 {
		gen = lease.Generation
	}
	if cerr := w.cleanup(ctx, lease); cerr != nil {
		if job.Attempt >= job.MaxAttempts {
			if _, err := db.MarkLeaseCleanup(context.WithoutCancel(ctx), w.deps.Pool, lease.ID, gen, false, cerr.Error()); err != nil {
				return errors.Join(cerr, err)
			}
		}
		return cerr
	}
	if _, err := db.MarkLeaseCleanup(ctx, w.deps.Pool, lease.ID, gen, true, ""); err != nil {
		if errors.Is(err, db.ErrFenced) {
			if now, rerr := db.LeaseByID(ctx, w.deps.Pool, lease.CompanyID, lease.ID); rerr == nil &&
				now.CleanupStatus == db.LeaseCleanupSucceeded {
				return nil // finalize (or another cleanup) marked it meanwhile
			}
			return river.JobCancel(err)
		}
		return err
	}
	return nil
}

// cleanup stops what the lease's run left running: on a remote host through the driver's
// Release, on this host every process tagged with the run id. A run that executed on another node
// cannot be reached from here: its executor stops its command when the fenced lease fails its
// next heartbeat, and a dead node's processes die with it or are killed by its startup sweep.
func (w *CleanupLeaseWorker) cleanup(ctx context.Context, lease db.Lease) error {
	// A remote host is reachable from any node: its workspace and what is left of the run's
	// processes there go with the instance's release.
	if err := (runWorker{deps: w.deps}).releaseRemote(ctx, lease); err != nil {
		return fmt.Errorf("cleanup lease %s: release the remote instance: %w", lease.ID, err)
	}
	if lease.RunID == "" {
		return nil
	}
	run, err := db.RunForJob(ctx, w.deps.Pool, lease.RunID)
	if errors.Is(err, db.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cleanup lease %s: %w", lease.ID, err)
	}
	if run.NodeID != w.deps.NodeID && run.NodeID != "" {
		runLog(w.deps.Log, run).Info("lease cleanup: the run executed on another node", "lease_id", lease.ID, "node", run.NodeID)
		return nil
	}
	n, err := environment.KillTagged(ctx, lease.RunID, killGrace)
	if err != nil {
		return fmt.Errorf("stop the processes of run %s: %w", lease.RunID, err)
	}
	if n > 0 {
		runLog(w.deps.Log, run).Warn("lease cleanup stopped processes", "lease_id", lease.ID, "processes", n)
	}
	return nil
}

// leaseKeeper is a lease holder's side of the heartbeat (DESIGN §10): it renews every TTL/3,
// and the lease counts as lost to it once a whole TTL has passed, on this process's monotonic
// clock, since the last renewal the database confirmed. The deadline is measured from when that
// renewal was sent, which is no later than the database clock's now() it was stamped with, so
// the holder gives up no later than the database would let the lease expire. After the loss the
// holder writes nothing more under its generation, and the database refuses it anyway
// (db.ErrFenced once the lease is expired and its generation moved on).
type leaseKeeper struct {
	pool   db.Querier
	id     string
	gen    int64
	ttl    time.Duration
	lastOK time.Time // when the last confirmed renewal was sent (monotonic)
}

// newLeaseKeeper starts keeping a lease just acquired or renewed (its heartbeat counts from now).
func newLeaseKeeper(pool db.Querier, l db.Lease, ttl time.Duration) *leaseKeeper {
	return &leaseKeeper{pool: pool, id: l.ID, gen: l.Generation, ttl: ttl, lastOK: time.Now()}
}

// every is the renewal period.
func (k *leaseKeeper) every() time.Duration { return k.ttl / 3 }

// remaining is how long the lease is still the keeper's without another renewal.
func (k *leaseKeeper) remaining() time.Duration { return k.ttl - time.Since(k.lastOK) }

// renew heartbeats the lease once, never waiting past the local deadline. It returns
// db.ErrFenced when the lease is no longer the keeper's, another error when the database did not
// answer (the deadline still runs).
func (k *leaseKeeper) renew(ctx context.Context) error {
	left := k.remaining()
	if left <= 0 {
		return fmt.Errorf("renew lease %s: %w", k.id, errLeaseLost)
	}
	sent := time.Now()
	ctx, cancel := context.WithTimeout(ctx, min(left, k.every()))
	defer cancel()
	if _, err := db.HeartbeatLease(ctx, k.pool, k.id, k.gen, k.ttl); err != nil {
		return err
	}
	k.lastOK = sent
	return nil
}

// underLease runs fn with a context that ends, with cause errLeaseLost, once the lease is fenced
// or has gone a whole TTL without a confirmed renewal (leaseKeeper), the way execute_run's watch
// stops the run's command. Setup commands run under it, so a provision that lost its database
// or its lease stops its setup command too instead of letting it outlive the lease (DESIGN §10).
// It returns fn's error, wrapped with errLeaseLost when the lease was lost meanwhile.
func (d Deps) underLease(ctx context.Context, run db.Run, lease db.Lease, fn func(context.Context) error) error {
	lctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	keeper := newLeaseKeeper(d.Pool, lease, d.leaseTTL())
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		renew := time.NewTicker(keeper.every())
		defer renew.Stop()
		lost := time.NewTimer(keeper.remaining())
		defer lost.Stop()
		for {
			select {
			case <-lctx.Done():
				return
			case <-lost.C:
				if keeper.remaining() <= 0 {
					runLog(d.Log, run).Warn("lease not renewed for a whole TTL: stopping the setup command", "lease_id", lease.ID)
					stop(errLeaseLost)
					return
				}
				lost.Reset(keeper.remaining())
			case <-renew.C:
				if err := keeper.renew(lctx); errors.Is(err, db.ErrFenced) {
					runLog(d.Log, run).Warn("lease fenced: stopping the setup command", "lease_id", lease.ID)
					stop(errLeaseLost)
					return
				}
				lost.Reset(keeper.remaining())
			}
		}
	}()
	err := fn(lctx)
	cause := context.Cause(lctx)
	stop(errCommandEnded)
	<-watching
	if errors.Is(cause, errLeaseLost) {
		if err == nil {
			return errLeaseLost
		}
		return fmt.Errorf("%w: %w", errLeaseLost, err)
	}
	return err
}
