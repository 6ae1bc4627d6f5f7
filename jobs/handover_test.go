package jobs

import (
	"context"
	"testing"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"berth/db"
	"berth/jobs/internal/jobstest"
)

// TestProvisionHandsOverToALighterNode: a provision taken from the shared queue by a node whose
// capacity is in use hands its run to a node with room: the run is placed there and its provision
// is on that node's queue. Not handed: when the other node would be as full with the run as this
// one is now, when the other node's heartbeat is old, when the provision came from this node's
// own queue, or when the run is no longer queued.
func TestProvisionHandsOverToALighterNode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newSweepWorld(t)
	for _, id := range []string{"n1", "n2"} {
		if err := db.RegisterNode(ctx, w.pool, db.NodeRegistration{ID: id, Kind: db.NodeWorker, Works: true, Capacity: 2}); err != nil {
			t.Fatal(err)
		}
	}
	p := &ProvisionWorker{runWorker: runWorker{deps: Deps{Pool: w.pool, Log: jobstest.Log(), NodeID: "n1"}}}
	job := func(queue, run string) *river.Job[ProvisionArgs] {
		return &river.Job[ProvisionArgs]{JobRow: &rivertype.JobRow{Queue: queue}, Args: ProvisionArgs{RunID: run}}
	}
	handOver := func(queue string) (string, bool) {
		t.Helper()
		run := w.run(db.RunQueued, "", 0)
		handed, err := p.handOver(ctx, w.ins, job(queue, run), w.runRow(run))
		if err != nil {
			t.Fatal(err)
		}
		return run, handed
	}
	provisionsOn := func(queue, run string) int {
		return w.count(`SELECT count(*) FROM river_job WHERE kind = 'provision' AND queue = $1 AND args->>'run_id' = $2`, queue, run)
	}

	// n1 runs 1 of 2, n2 nothing: n2 with this run would be at 1/2, not below n1's 1/2.
	w.run(db.RunRunning, "n1", 0)
	if _, handed := handOver(river.QueueDefault); handed {
		t.Fatal("handed over while the other node would be as full")
	}
	// n1 runs 2 of 2: n2 has room.
	w.run(db.RunRunning, "n1", 0)
	run, handed := handOver(river.QueueDefault)
	if !handed || w.runRow(run).NodeID != "n2" || provisionsOn(NodeQueue("n2"), run) != 1 {
		t.Fatalf("not handed to n2: %v, node %q, provisions on n2's queue %d", handed, w.runRow(run).NodeID, provisionsOn(NodeQueue("n2"), run))
	}
	// The handed-over run counts on n2 (1 of 2) as a run there; a provision from n1's own queue
	// stays; a run no longer queued stays.
	if _, handed := handOver(NodeQueue("n1")); handed {
		t.Fatal("a provision from the node's own queue was handed on")
	}
	preparing := w.run(db.RunPreparing, "n1", 0)
	if handed, err := p.handOver(ctx, w.ins, job(river.QueueDefault, preparing), w.runRow(preparing)); err != nil || handed {
		t.Fatalf("a preparing run (a retry): %v %v", handed, err)
	}
	// n2 silent: no runs for it.
	if _, err := w.pool.Exec(ctx, `UPDATE nodes SET heartbeat_at = now() - interval '1 minute' WHERE id = 'n2'`); err != nil {
		t.Fatal(err)
	}
	if _, handed := handOver(river.QueueDefault); handed {
		t.Fatal("handed to a node whose heartbeat is a minute old")
	}
}
