// Package nodes keeps this process's node alive and takes over dead ones (DESIGN §11,
// docs/scaling.md): every Berth process registers its node, heartbeats it, and looks for dead
// nodes to take over. A node silent for DeadAfter is dead; within Takeover of that, some live
// node settles what it held: its live runs end failed/orphaned (finalize waits in the dead node's
// queue for its return), its leases are expired at once and cleaned (by any node: the processes
// died with it), its services are marked stopped and its setup sessions failed. When the node
// starts again it registers a new life, and its startup sweep kills what is left of its own
// processes (jobs.SweepOrphans) and works its queue again.
//
// The package owns the node rows (registration, heartbeat, the taken-over mark) and, in a
// takeover, the dead node's leases, services and setup sessions. Its runs it does not touch
// itself: they end the orphan sweep's way, and the leases' cleanup is a job; both go through the
// Sweep that package jobs provides (jobs.NodeSweep). It imports nothing of jobs.
package nodes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
)

// Timing is the node registry's clock. The defaults are DESIGN §11's.
type Timing struct {
	// Heartbeat is how often a node renews its row (5 s).
	Heartbeat time.Duration
	// DeadAfter: a node silent this long is dead (30 s).
	DeadAfter time.Duration
	// Takeover is how often a node takes over dead nodes its heartbeats saw (10 s), so a dead
	// node's holdings are settled within DeadAfter + Takeover + Heartbeat of its last heartbeat.
	// Seeing them costs nothing more: each heartbeat's statement also says whether some node is
	// silent (db.HeartbeatNode).
	Takeover time.Duration
}

// DefaultTiming is DESIGN §11's: heartbeat every 5 s, dead after 30 s, takeover checked every
// 10 s.
func DefaultTiming() Timing {
	return Timing{Heartbeat: 5 * time.Second, DeadAfter: 30 * time.Second, Takeover: 10 * time.Second}
}

// ReasonDead is the orphan reason of a dead node's runs, in their run.orphaned audit events
// (package jobs words the runs' message for it).
const ReasonDead = "node_dead"

// Sweep is what a takeover needs of the job layer: package jobs provides it (jobs.NodeSweep).
type Sweep interface {
	// Candidates are the live runs the orphan sweep would judge, with their unfinished run jobs.
	Candidates(ctx context.Context) ([]db.OrphanCandidate, error)
	// Orphan ends run c the orphan sweep's way for reason (failed/orphaned, its dead executor's
	// jobs cancelled, finalize enqueued), logging to log, and reports whether it ended it.
	Orphan(ctx context.Context, log *slog.Logger, c db.OrphanCandidate, reason string) (bool, error)
	// CleanLease enqueues, in tx, the cleanup of lease l, just expired.
	CleanLease(ctx context.Context, tx pgx.Tx, l db.Lease) error
}

// Deps are what the keeper and a takeover use.
type Deps struct {
	// Pool reaches the node rows and the dead node's holdings.
	Pool *pgxpool.Pool
	// Log takes the keeper's lines (component=nodes); nil discards.
	Log *slog.Logger
	// NodeID is this process's node, never taken over by itself and named as the taker.
	NodeID string
	// Sweep ends a dead node's runs and cleans its leases; nil only for a keeper that never
	// takes over (a test of its heartbeat).
	Sweep Sweep
	// Recovery takes each heartbeat's answer to db.RecoveryDue for the periodic gate of the
	// same process (jobs.Deps.Recovery); nil: nobody asks.
	Recovery *db.RecoveryMemo
}

// Keeper keeps this process's node row alive and takes over dead nodes.
type Keeper struct {
	deps   Deps
	reg    db.NodeRegistration
	timing Timing
	log    *slog.Logger
	// healthySince is when this node's heartbeats began to succeed without a failure in
	// between (zero while they fail): see mayJudge.
	healthySince time.Time
	// othersDead: the last heartbeat saw a node silent for DeadAfter and not taken over yet.
	othersDead bool
}

// NewKeeper makes the keeper of node reg.ID.
func NewKeeper(d Deps, reg db.NodeRegistration, timing Timing) *Keeper {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	return &Keeper{deps: d, reg: reg, timing: timing, log: d.Log.With("component", "nodes", "node", reg.ID)}
}

// Register records this node's new life. Call it before the River client starts.
func (k *Keeper) Register(ctx context.Context) error {
	if err := db.RegisterNode(ctx, k.deps.Pool, k.reg); err != nil {
		return err
	}
	if k.healthySince.IsZero() {
		k.healthySince = time.Now()
	}
	return nil
}

// Run heartbeats and takes over dead nodes until ctx ends.
func (k *Keeper) Run(ctx context.Context) {
	beat := time.NewTicker(k.timing.Heartbeat)
	defer beat.Stop()
	look := time.NewTicker(k.timing.Takeover)
	defer look.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-beat.C:
			k.heartbeat(ctx)
		case <-look.C:
			if !k.othersDead || !k.mayJudge(time.Now()) {
				continue
			}
			if _, err := TakeOver(ctx, k.deps, k.timing.DeadAfter); err != nil && ctx.Err() == nil {
				k.log.Warn("dead-node takeover", "err", err)
			}
		}
	}
}

// heartbeat renews the row; a node the others took over (it was silent too long: a long
// database outage, a paused machine) registers a new life, and what it still runs finds its
// runs ended and its leases fenced.
func (k *Keeper) heartbeat(ctx context.Context) {
	// The recovery answer counts what expires within two heartbeats as due, so it holds until
	// the next one is late (the gate asks itself after that).
	ahead, began := 2*k.timing.Heartbeat, time.Now()
	hb, err := db.HeartbeatNode(ctx, k.deps.Pool, k.reg.ID, k.timing.DeadAfter, ahead)
	k.othersDead = hb.OthersDead
	if err == nil {
		k.deps.Recovery.Note(hb.Recovery, began.Add(ahead))
	}
	if errors.Is(err, db.ErrNodeTakenOver) || errors.Is(err, db.ErrNotFound) {
		k.log.Warn("this node was declared dead by the others; registering again")
		err = k.Register(ctx)
	}
	switch {
	case err != nil:
		k.healthySince = time.Time{}
		if ctx.Err() == nil {
			k.log.Warn("node heartbeat", "err", err)
		}
	case k.healthySince.IsZero():
		k.healthySince = time.Now()
	}
}

// mayJudge reports whether this node may declare others dead: only once its own heartbeats have
// succeeded for a whole DeadAfter. After a database outage every node's heartbeat is old; the
// first node back must give the others that long to beat again instead of taking over nodes
// whose executors are alive and retrying their writes (package jobs/spool).
func (k *Keeper) mayJudge(now time.Time) bool {
	return !k.healthySince.IsZero() && now.Sub(k.healthySince) >= k.timing.DeadAfter
}

// TakeOver takes over every node silent for deadAfter whose current life is not taken over yet
// (never d.NodeID itself), and returns how many it took over.
func TakeOver(ctx context.Context, d Deps, deadAfter time.Duration) (int, error) {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	dead, err := db.DeadNodes(ctx, d.Pool, deadAfter)
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, id := range dead {
		if id == d.NodeID {
			continue
		}
		took, err := takeOver(ctx, d, id, deadAfter)
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", id, err))
		}
		if took {
			n++
		}
	}
	return n, errors.Join(errs...)
}

// takeOver settles dead node id: first its live runs (each in its own transaction, as the
// orphan sweep ends them), then, in one transaction under its row lock, its leases, services and
// setup sessions and the mark. A failure leaves the node unmarked, and the next look retries;
// every step is idempotent.
func takeOver(ctx context.Context, d Deps, id string, deadAfter time.Duration) (bool, error) {
	log := d.Log.With("component", "nodes", "dead_node", id)
	cands, err := d.Sweep.Candidates(ctx)
	if err != nil {
		return false, err
	}
	orphaned := 0
	var errs []error
	for _, c := range cands {
		if c.NodeID != id {
			continue
		}
		if alive, err := db.NodeAlive(ctx, d.Pool, id, deadAfter); err != nil || alive {
			return false, err // it came back: its own sweep decides
		}
		ended, err := d.Sweep.Orphan(ctx, log, c, ReasonDead)
		if err != nil {
			errs = append(errs, fmt.Errorf("run %s: %w", c.ID, err))
		}
		if ended {
			orphaned++
		}
	}
	if err := errors.Join(errs...); err != nil {
		return false, err
	}
	var leases []db.Lease
	var services, sessions int64
	took := false
	err = db.InTx(ctx, d.Pool, func(tx pgx.Tx) error {
		ok, err := db.LockDeadNode(ctx, tx, id, deadAfter)
		if err != nil || !ok {
			return err
		}
		// Marked first, so the cleanups below are placed on any node (jobs.Place, cleanup_lease).
		if err := db.MarkNodeTakenOver(ctx, tx, id); err != nil {
			return err
		}
		if leases, err = db.ExpireNodeLeases(ctx, tx, id); err != nil {
			return err
		}
		for _, l := range leases {
			if err := d.Sweep.CleanLease(ctx, tx, l); err != nil {
				return fmt.Errorf("enqueue cleanup of lease %s: %w", l.ID, err)
			}
			if err := db.InsertAudit(ctx, tx, db.AuditEvent{CompanyID: l.CompanyID, ActorType: db.ActorSystem,
				ActorLabel: "node takeover", Action: "lease.expired", TargetType: "environment_lease", TargetID: l.ID,
				Details: map[string]any{"run_id": l.RunID, "generation": l.Generation, "reason": ReasonDead,
					"node": id, "taken_over_by": d.NodeID}}); err != nil {
				return err
			}
		}
		if services, err = db.StopNodeServices(ctx, tx, id); err != nil {
			return err
		}
		if sessions, err = db.FailNodeSetupSessions(ctx, tx, id); err != nil {
			return err
		}
		took = true
		return db.InsertAudit(ctx, tx, db.AuditEvent{ActorType: db.ActorSystem, ActorLabel: "node takeover",
			Action: "node.taken_over", TargetType: "node", TargetID: id,
			Details: map[string]any{"taken_over_by": d.NodeID, "runs_orphaned": orphaned, "leases_expired": len(leases),
				"services_stopped": services, "setup_sessions_failed": sessions}})
	})
	if err != nil {
		return false, err
	}
	if took || orphaned > 0 {
		log.Warn("dead node taken over", "runs_orphaned", orphaned, "leases_expired", len(leases),
			"services_stopped", services, "setup_sessions_failed", sessions)
	}
	return took, nil
}
