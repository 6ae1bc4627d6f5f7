package jobs

import (
	"context"
	"errors"
	"time"

	"github.com/riverqueue/river"

	"berth/db"
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
