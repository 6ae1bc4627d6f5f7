package jobs

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/riverqueue/river"

	"berth/db"
	"berth/environment"
	"berth/jobs/services"
	"berth/workspace"
)

// FinalizeArgs asks to settle an ended run: commit its work, record work products, release the
// lease.
type FinalizeArgs struct {
	RunID string `json:"run_id"`
}

// Kind names the job in River.
func (FinalizeArgs) Kind() string { return "finalize" }

// finalizeAttempts is how often finalize is tried (with River's backoff) before the workspace's
// finalize state becomes failed.
const finalizeAttempts = 8

// InsertOpts retries finalize with backoff until it settles.
func (FinalizeArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: finalizeAttempts}
}

// FinalizeWorker settles a run's workspace. Each step is idempotent: a commit that already
// happened leaves nothing to commit, work products are recorded once, a released lease is not
// released again.
type FinalizeWorker struct {
	river.WorkerDefaults[FinalizeArgs]
	runWorker
}

// Work finalizes the run; on its last attempt a failure marks the workspace's finalize failed.
func (w *FinalizeWorker) Work(ctx context.Context, job *river.Job[FinalizeArgs]) error {
	run, err := db.RunForJob(ctx, w.deps.Pool, job.Args.RunID)
	if db.Unavailable(err) {
		return river.JobSnooze(finalizeOutageWait) // an outage costs no attempt (outcome.go)
	}
	if err != nil {
		return err
	}
	if run.Live() {
		return river.JobSnooze(cancelPoll) // the executor is still writing its end
	}
	err = w.finalize(ctx, run)
	if db.Unavailable(err) {
		return river.JobSnooze(finalizeOutageWait)
	}
	// The run says how its work fared, beside its command's status: a command that succeeded
	// whose work could not be brought home is not a plain success (the run page shows why).
	wctx := context.WithoutCancel(ctx)
	switch {
	case err == nil:
		_ = db.SetRunFinalize(wctx, w.deps.Pool, run.ID, "settled", "")
	case job.Attempt >= finalizeAttempts:
		if run.ExecutionWorkspaceID != "" {
			_ = db.SetFinalizeState(wctx, w.deps.Pool, run.ExecutionWorkspaceID, "failed")
		}
		_ = db.SetRunFinalize(wctx, w.deps.Pool, run.ID, "failed", err.Error())
	default:
		_ = db.SetRunFinalize(wctx, w.deps.Pool, run.ID, "pending",
			fmt.Sprintf("attempt %d of %d failed (retried): %v", job.Attempt, finalizeAttempts, err))
	}
	return err
}

func (w *FinalizeWorker) finalize(ctx context.Context, run db.Run) error {
	if run.ExecutionWorkspaceID != "" {
		ws, err := db.ExecutionWorkspaceByID(ctx, w.deps.Pool, run.CompanyID, run.ExecutionWorkspaceID)
		if err != nil {
			return err
		}
		if ws.FinalizeState == "settled" && run.LeaseID == "" {
			return nil
		}
		if err := w.syncRemote(ctx, run, ws); err != nil {
			return err
		}
		if err := w.collect(ctx, run, ws); err != nil {
			return err
		}
	}
	if run.ExecutionWorkspaceID != "" && w.deps.Services != nil {
		// on_run_finish services end with the run (package jobs/services).
		if err := w.deps.Services.StopWorkspace(ctx, run.CompanyID, run.ExecutionWorkspaceID, services.StopRunFinished, true); err != nil {
			return err
		}
	}
	if run.LeaseID != "" {
		if err := w.release(ctx, run); err != nil {
			return err
		}
	}
	// The run's signed receipt; an attempt's workspace is sealed with it (receipts.go).
	if err := w.recordReceipt(ctx, run); err != nil {
		return err
	}
	if run.ExecutionWorkspaceID != "" {
		return db.SetFinalizeState(ctx, w.deps.Pool, run.ExecutionWorkspaceID, "settled")
	}
	return nil
}

// collect commits a worktree's changes on the task branch and records the branch and the commit
// as work products.
func (w *FinalizeWorker) collect(ctx context.Context, run db.Run, ws db.ExecutionWorkspace) error {
	if ws.Strategy == string(workspace.StrategyCopy) {
		return w.collectCopy(ctx, run, ws)
	}
	if ws.Strategy != string(workspace.StrategyGitWorktree) {
		return nil
	}
	task, err := db.TaskByID(ctx, w.deps.Pool, run.CompanyID, run.TaskID)
	if err != nil {
		return err
	}
	var res workspace.CommitResult
	err = w.operation(ctx, db.NewOperation{CompanyID: run.CompanyID, ExecutionWorkspaceID: ws.ID, RunID: run.ID,
		TaskID: run.TaskID, Phase: "finalize", Command: "git add -A && git commit"}, func(log *environment.LogBuffer) (*int, error) {
		// In Berth's git jail, as the run user; the run's own commits and this one come home as
		// a verified pack (workspace.Commit).
		var err error
		res, err = w.deps.Workspaces.Commit(ctx, ws.Ref, workspace.CommitSpec{Branch: ws.Branch, TaskKey: task.Key, RunID: run.ID})
		if err == nil && res.Changed {
			fmt.Fprintf(log, "committed %s on %s\n", res.Commit, ws.Branch)
		} else if err == nil {
			fmt.Fprintln(log, "nothing to commit")
		}
		return nil, err
	})
	if err != nil {
		return err
	}
	products := []db.WorkProduct{{Kind: "branch", Ref: ws.Branch, Metadata: map[string]any{"base_commit": ws.BaseCommit}}}
	if res.Changed {
		products = append(products, db.WorkProduct{Kind: "commit", Ref: res.Commit, Metadata: map[string]any{"branch": ws.Branch}})
	}
	for _, p := range products {
		p.CompanyID, p.TaskID, p.RunID, p.ExecutionWorkspaceID = run.CompanyID, run.TaskID, run.ID, ws.ID
		if err := db.AddWorkProduct(ctx, w.deps.Pool, p); err != nil {
			return err
		}
	}
	return nil
}

// remoteInstance is the instance a lease occupies on a remote driver (an ssh host or a plugin's),
// as execute_run recorded it; ok is false for leases of this host's drivers.
func remoteInstance(lease db.Lease) (environment.Instance, bool) {
	return environment.RemoteInstance(lease.ProviderRef)
}

// releaseRemote stops what is left of the lease's commands on its remote host, removes the
// remote workspace and closes the connection (environment.Driver.Release). Leases of this host's
// drivers have nothing there.
func (w runWorker) releaseRemote(ctx context.Context, lease db.Lease) error {
	inst, ok := remoteInstance(lease)
	if !ok {
		return nil
	}
	drv, err := w.driverFor(ctx, db.Run{CompanyID: lease.CompanyID, EnvironmentID: lease.EnvironmentID})
	if err != nil {
		return err
	}
	if c, ok := drv.(io.Closer); ok {
		defer c.Close()
	}
	return drv.Release(ctx, inst)
}

// syncRemote brings the remote copy of a run's workspace back into the local one (operation
// download) before it is committed or packed, for a run that started on a remote host. A retry
// downloads again: the remote copy stays until the lease's release.
func (w *FinalizeWorker) syncRemote(ctx context.Context, run db.Run, ws db.ExecutionWorkspace) error {
	if run.LeaseID == "" || run.StartedAt == nil {
		return nil // the command never ran: nothing changed there
	}
	lease, err := db.LeaseByID(ctx, w.deps.Pool, run.CompanyID, run.LeaseID)
	if errors.Is(err, db.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	inst, ok := remoteInstance(lease)
	if !ok || lease.CleanupStatus == db.LeaseCleanupSucceeded {
		return nil // a local run, or the remote copy is already gone
	}
	root, err := w.workspaceRoot(ws)
	if err != nil {
		return err
	}
	drv, err := w.driverFor(ctx, run)
	if err != nil {
		return err
	}
	if c, ok := drv.(io.Closer); ok {
		defer c.Close()
	}
	return w.operation(ctx, db.NewOperation{CompanyID: run.CompanyID, ExecutionWorkspaceID: ws.ID, RunID: run.ID,
		TaskID: run.TaskID, Phase: "download", Command: "download workspace"}, func(log *environment.LogBuffer) (*int, error) {
		err := drv.Sync(ctx, environment.SyncRequest{Instance: inst, HostPath: root})
		if err == nil {
			fmt.Fprintf(log, "applied the remote workspace (%s)\n", inst.Ref)
		}
		return nil, err
	})
}

// release gives the run's lease back and cleans up after it: on a remote host that is the
// remote workspace (releaseRemote); the local driver has nothing to clean up.
func (w *FinalizeWorker) release(ctx context.Context, run db.Run) error {
	lease, err := db.LeaseByID(ctx, w.deps.Pool, run.CompanyID, run.LeaseID)
	if errors.Is(err, db.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if lease.Status == db.LeaseActive || lease.Status == db.LeaseAcquiring {
		if lease, err = db.ReleaseLease(ctx, w.deps.Pool, lease, "run "+run.Status); err != nil {
			return err
		}
	}
	if lease.CleanupStatus == "pending" {
		if err := w.releaseRemote(ctx, lease); err != nil {
			return err
		}
		if _, err := db.MarkLeaseCleanup(ctx, w.deps.Pool, lease.ID, lease.Generation, true, ""); err != nil {
			return err
		}
	}
	return nil
}

// collectCopy packs a copy workspace into a capsule in the content-addressed artifact store (so
// it outlives the workspace) and records it as an artifact work product with the changed paths.
func (w *FinalizeWorker) collectCopy(ctx context.Context, run db.Run, ws db.ExecutionWorkspace) error {
	if w.deps.Artifacts == nil {
		return fmt.Errorf("finalize copy: no artifact store on this node")
	}
	var (
		final  workspace.CopyFinal
		digest string
		size   int64
	)
	err := w.operation(ctx, db.NewOperation{CompanyID: run.CompanyID, ExecutionWorkspaceID: ws.ID, RunID: run.ID,
		TaskID: run.TaskID, Phase: "finalize", Command: "pack capsule"}, func(log *environment.LogBuffer) (*int, error) {
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() {
			var err error
			digest, size, err = w.deps.Artifacts.Put(ctx, pr, "")
			pr.CloseWithError(err)
			done <- err
		}()
		var err error
		final, err = w.deps.Workspaces.FinalizeCopy(ctx, ws.Ref, pw)
		pw.CloseWithError(err)
		if perr := <-done; err == nil {
			err = perr
		}
		if err == nil {
			fmt.Fprintf(log, "capsule sha256:%s (%d bytes, tree %s): %d added, %d modified, %d removed\n", digest, size,
				final.Capsule.TreeDigest, len(final.Changes.Added), len(final.Changes.Modified), len(final.Changes.Removed))
		}
		return nil, err
	})
	if err != nil {
		return err
	}
	return db.AddWorkProduct(ctx, w.deps.Pool, db.WorkProduct{CompanyID: run.CompanyID, TaskID: run.TaskID, RunID: run.ID,
		ExecutionWorkspaceID: ws.ID, Kind: "artifact", Ref: "sha256:" + digest, Metadata: map[string]any{
			"size": size, "tree_digest": final.Capsule.TreeDigest, "added": final.Changes.Added,
			"modified": final.Changes.Modified, "removed": final.Changes.Removed}})
}
