package jobs

import (
	"context"
	"encoding/json"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"berth/db"
)

// heartbeatEvery is how often a run's executor proves it is alive (the run's heartbeat_at the
// orphan sweep reads); execute_run's watcher also beats with each lease renewal, every TTL/3.
const heartbeatEvery = leaseTTL / 4

// runMiddleware wraps the jobs that execute a run (provision, execute_run): while one works, the
// run is in this process's Executing registry (package jobs/executing) and its heartbeat is kept
// fresh (provision's lease too, which nothing else heartbeats during a long setup command), so no
// sweep takes it for an orphan.
type runMiddleware struct {
	river.MiddlewareDefaults
	deps Deps
}

var _ rivertype.WorkerMiddleware = (*runMiddleware)(nil)

// Work registers the job's run, beats for it, and runs the job.
func (m *runMiddleware) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	provision := job.Kind == (ProvisionArgs{}).Kind()
	if !provision && job.Kind != (ExecuteRunArgs{}).Kind() {
		return doInner(ctx)
	}
	var args struct {
		RunID string `json:"run_id"`
	}
	if err := json.Unmarshal(job.EncodedArgs, &args); err != nil || args.RunID == "" {
		return doInner(ctx)
	}
	done := m.deps.Executing.Add(args.RunID)
	defer done()

	beatCtx, stop := context.WithCancel(ctx)
	beating := make(chan struct{})
	go func() {
		defer close(beating)
		t := time.NewTicker(heartbeatEvery)
		defer t.Stop()
		for {
			m.beat(beatCtx, args.RunID, provision)
			select {
			case <-beatCtx.Done():
				return
			case <-t.C:
			}
		}
	}()
	defer func() { stop(); <-beating }()
	return doInner(ctx)
}

// beat heartbeats a live run and, for provision, the run's live lease at its current generation.
func (m *runMiddleware) beat(ctx context.Context, runID string, lease bool) {
	run, err := db.RunForJob(ctx, m.deps.Pool, runID)
	if err != nil || !run.Live() {
		return
	}
	if err := db.HeartbeatRun(ctx, m.deps.Pool, runID); err != nil {
		return
	}
	if !lease || run.LeaseID == "" {
		return
	}
	l, err := db.LeaseByID(ctx, m.deps.Pool, run.CompanyID, run.LeaseID)
	if err != nil || !l.Live() || l.RunID != run.ID {
		return
	}
	_, _ = db.HeartbeatLease(ctx, m.deps.Pool, l.ID, l.Generation, leaseTTL)
}
