package jobs

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/jobs/nodes"
)

// NodeSweep is the job layer's side of a dead-node takeover (package jobs/nodes): the orphan
// sweep's candidates and its way of ending a run, and the expired leases' cleanup_lease, enqueued
// through ins (an insert-only client does on a web node).
func NodeSweep(d Deps, ins jobClient) nodes.Sweep {
	return nodeSweep{deps: d, ins: ins}
}

type nodeSweep struct {
	deps Deps
	ins  jobClient
}

// Candidates are the orphan sweep's: every live run with its unfinished run jobs.
func (n nodeSweep) Candidates(ctx context.Context) ([]db.OrphanCandidate, error) {
	return loadCandidates(ctx, n.deps.Pool)
}

// Orphan ends c as the orphan sweep does (sweeper.orphan), its lines on log.
func (n nodeSweep) Orphan(ctx context.Context, log *slog.Logger, c db.OrphanCandidate, reason string) (bool, error) {
	s := sweeper{deps: n.deps, log: log, ins: n.ins}
	return s.orphan(ctx, c, reason)
}

// CleanLease enqueues cleanup_lease of l at its current generation.
func (n nodeSweep) CleanLease(ctx context.Context, tx pgx.Tx, l db.Lease) error {
	_, err := Enqueue(ctx, n.ins, tx, CleanupLeaseArgs{LeaseID: l.ID, Generation: l.Generation})
	return err
}
