package jobs

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"berth/db"
)

// Placement of new runs (docs/scaling.md "Placement"). A run that needs a new workspace is
// provisioned from the shared default queue by whichever working node fetches it first, and its
// workspace, command and finalize then stay on that node. Fetching is a race, so without more one
// node can end up with a backlog while another idles. So a provision taken from the shared queue
// first asks db.LighterNode, and when another live node has a smaller share of its capacity in
// use, hands the run over: the run is placed on that node and its provision enqueued on that
// node's queue, in one transaction. A provision on a node's own queue (a continuing workspace,
// a handed-over run) is never handed on.

// handOverFresh: a node whose heartbeat is older than this (three beats) is handed no runs.
const handOverFresh = 15 * time.Second

// handOver hands run to a lighter node when there is one, reporting whether it did.
func (w *ProvisionWorker) handOver(ctx context.Context, ins Inserter, job *river.Job[ProvisionArgs], run db.Run) (bool, error) {
	if job.Queue != river.QueueDefault || run.Status != db.RunQueued || w.deps.NodeID == "" {
		return false, nil
	}
	node, err := db.LighterNode(ctx, w.deps.Pool, w.deps.NodeID, handOverFresh)
	if err != nil || node == "" {
		return false, err
	}
	err = db.InTx(ctx, w.deps.Pool, func(tx pgx.Tx) error {
		if err := db.SetRunNode(ctx, tx, run.ID, node); err != nil {
			return err
		}
		_, err := EnqueueOn(ctx, ins, tx, ProvisionArgs{RunID: run.ID}, node)
		return err
	})
	if err != nil {
		return false, err
	}
	w.deps.Log.Info("run handed to a lighter node", "run", run.ID, "node", node)
	return true, nil
}
