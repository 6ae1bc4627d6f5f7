package jobs

// Where jobs run (DESIGN §11, docs/scaling.md): a job that must run on the node holding a
// workspace goes to that node's River queue, node_<id>; everything else, and a new workspace's
// provision, to the shared default queue, which every working node also serves. Enqueue is the
// one door: every InsertTx of Berth goes through it.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"berth/db"
)

// Inserter is the part of a River client Enqueue needs.
type Inserter interface {
	InsertTx(ctx context.Context, tx pgx.Tx, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error)
}

// queueName is what River accepts as a queue name.
var queueName = regexp.MustCompile(`^(?:[a-z0-9])+(?:[_|\-]?[a-z0-9]+)*$`)

// NodeQueue is node id's own River queue: node_<id> when that is a valid River queue name of at
// most 64 bytes, else node_h<first 16 bytes of sha256(id) in hex> (ids with capitals or dots).
// The shared queue for "" (no node).
func NodeQueue(id string) string {
	if id == "" {
		return river.QueueDefault
	}
	if q := "node_" + id; len(q) <= 64 && queueName.MatchString(id) {
		return q
	}
	sum := sha256.Sum256([]byte(id))
	return "node_h" + hex.EncodeToString(sum[:16])
}

// NodeUnavailableError refuses to enqueue work for a workspace whose node is down: the work could
// only wait for it.
type NodeUnavailableError struct{ Node string }

func (e *NodeUnavailableError) Error() string {
	return fmt.Sprintf("the workspace lives on node %s, which is down", e.Node)
}

// Enqueue inserts args in tx on the queue of the node that holds what the job works on (Place).
func Enqueue(ctx context.Context, ins Inserter, tx pgx.Tx, args river.JobArgs) (*rivertype.JobInsertResult, error) {
	node, err := Place(ctx, tx, args)
	if err != nil {
		return nil, err
	}
	return EnqueueOn(ctx, ins, tx, args, node)
}

// EnqueueOn inserts args in tx on node's queue ("": the shared default queue), without asking
// Place: for a job that was placed already (a provision handed to another node, handover.go).
func EnqueueOn(ctx context.Context, ins Inserter, tx pgx.Tx, args river.JobArgs, node string) (*rivertype.JobInsertResult, error) {
	var opts *river.InsertOpts
	if node != "" {
		opts = &river.InsertOpts{Queue: NodeQueue(node)}
	}
	res, err := ins.InsertTx(ctx, tx, args, opts)
	if err != nil {
		return nil, err
	}
	if res.Job.State == rivertype.JobStateAvailable && !res.UniqueSkippedAsDuplicate {
		if err := db.NotifyJobQueue(ctx, tx, res.Job.Queue); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// Place is the node a job must run on ("" = any working node), read in tx:
//   - provision: the node holding the workspace the run continues in (the run is placed there
//     too); a new workspace: any node. A continuing workspace whose node has been taken over is a
//     NodeUnavailableError: nothing could run it (close the workspace, or restart the node).
//   - execute_run, finalize: the run's node (it prepared the workspace there); a finalize of a
//     run that never got a workspace: any node;
//   - runtime services: the service's workspace's node; close, reopen: the workspace's node;
//   - cleanup_lease: the run's node while it lives, any node after its takeover;
//   - capture_image: the node holding the session's scratch layer, when it works jobs;
//   - select_attempts: the node holding the chosen (or first open) attempt's workspace.
func Place(ctx context.Context, q pgx.Tx, args river.JobArgs) (string, error) {
	switch a := args.(type) {
	case ProvisionArgs:
		return placeProvision(ctx, q, a.RunID)
	case ExecuteRunArgs:
		return db.RunNode(ctx, q, a.RunID)
	case FinalizeArgs:
		return db.RunFinalizeNode(ctx, q, a.RunID)
	case RuntimeServiceArgs:
		return db.ServiceNode(ctx, q, a.ServiceID)
	case CloseWorkspaceArgs:
		return db.WorkspaceNode(ctx, q, a.WorkspaceID)
	case ReopenWorkspaceArgs:
		return db.WorkspaceNode(ctx, q, a.WorkspaceID)
	case CleanupLeaseArgs:
		return db.LeaseCleanupNode(ctx, q, a.LeaseID)
	case CaptureImageArgs:
		return db.SetupSessionWorkNode(ctx, q, a.SessionID)
	case SelectAttemptsArgs:
		return db.AttemptGroupNode(ctx, q, a.GroupID)
	}
	return "", nil
}

// placeProvision places a new run on its home node, when it has one.
func placeProvision(ctx context.Context, tx pgx.Tx, runID string) (string, error) {
	run, err := db.RunForJob(ctx, tx, runID)
	if errors.Is(err, db.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	plan, err := planOf(run)
	if err != nil {
		return "", nil // provision ends it with the reason
	}
	if base, err := attemptBase(ctx, tx, run); err != nil || base != "" {
		return "", err // an attempt realizes a new worktree: any node (attempts.go)
	}
	node, err := db.TaskHomeNode(ctx, tx, run.CompanyID, run.TaskID, plan.ReuseWorkspaceID, plan.Mode, plan.Strategy)
	if err != nil || node == "" {
		return "", err
	}
	taken, err := db.NodeTakenOver(ctx, tx, node)
	if err != nil {
		return "", err
	}
	if taken {
		return "", &NodeUnavailableError{Node: node}
	}
	return node, db.SetRunNode(ctx, tx, run.ID, node)
}
