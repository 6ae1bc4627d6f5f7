package jobs

import (
	"context"
	"errors"
	"time"

	"github.com/riverqueue/river"

	"berth/db"
	"berth/environment"
)

// A run admitted while its task's workspace is closing (the close began after the run was
// admitted, or between its admission and its lease) waits for the close to finish and then gets
// a new workspace, as a run after the close would. It waits in `preparing`, as a snoozed
// provision job (a snooze costs River no attempt), for at most closeWaitLimit.

// errWorkspaceClosing: the run would continue in, or make anew, a workspace whose predecessor
// is still closing.
var errWorkspaceClosing = errors.New("the task's workspace is closing")

const (
	closeWaitEvery = 2 * time.Second
	closeWaitLimit = 10 * time.Minute // a close takes seconds; one stuck that long has failed
)

// waitForClose snoozes the provision of run until its task's workspace has closed, or fails the
// run once it waited closeWaitLimit.
func (w *ProvisionWorker) waitForClose(ctx context.Context, run db.Run) error {
	if time.Since(run.CreatedAt) > closeWaitLimit {
		return w.failRun(ctx, run, db.RunFailed, "workspace_closing",
			"The task's workspace is still closing after 10 minutes; look at its close, then run again.")
	}
	return river.JobSnooze(closeWaitEvery)
}

// capacity is the run's environment's max_parallel_runs (0: unbounded). A run past it waits in
// the queue: its lease is refused as busy and the provision snoozes (snoozeBusy). An environment
// that cannot be read has no bound here; AcquireLease then says what is wrong with it.
func (w *ProvisionWorker) capacity(ctx context.Context, run db.Run) int {
	env, err := db.EnvironmentByID(ctx, w.deps.Pool, run.CompanyID, run.EnvironmentID)
	if err != nil {
		return 0
	}
	cfg, err := environment.Load(env.Driver, env.Config)
	if err != nil {
		return 0
	}
	return cfg.MaxParallelRuns
}
