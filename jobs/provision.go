package jobs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"berth/db"
	"berth/environment"
	"berth/workspace"
)

// setupTimeout bounds a project workspace's setup command.
const setupTimeout = 15 * time.Minute

// ProvisionArgs asks to prepare a run's workspace: realize it, lease the environment for it, run
// the setup command.
type ProvisionArgs struct {
	RunID string `json:"run_id"`
}

// Kind names the job in River.
func (ProvisionArgs) Kind() string { return "provision" }

// ProvisionWorker prepares a queued run. It is idempotent: a run past preparing is left alone, a
// realized worktree is reused (the manager finds the task's clean worktree), a lease held for the
// run is adopted.
type ProvisionWorker struct {
	river.WorkerDefaults[ProvisionArgs]
	runWorker
}

// Timeout bounds one attempt: realization plus the setup command.
func (w *ProvisionWorker) Timeout(*river.Job[ProvisionArgs]) time.Duration {
	return setupTimeout + 15*time.Minute
}

// Work prepares the run and enqueues execute_run, or ends the run as failed with why.
func (w *ProvisionWorker) Work(ctx context.Context, job *river.Job[ProvisionArgs]) error {
	run, err := db.RunForJob(ctx, w.deps.Pool, job.Args.RunID)
	if errors.Is(err, db.ErrNotFound) {
		return river.JobCancel(fmt.Errorf("provision: run %s is gone", job.Args.RunID))
	}
	if err != nil {
		return err
	}
	if run.Status != db.RunQueued && run.Status != db.RunPreparing {
		return nil // a retry after the run moved on
	}
	if run.CancelRequested {
		return w.failRun(ctx, run, db.RunCancelled, "cancelled", "The run was cancelled before it started.")
	}
	if handed, err := w.handOver(ctx, river.ClientFromContext[pgx.Tx](ctx), job, run); err != nil {
		w.deps.Log.Warn("provision: could not hand the run to a lighter node; provisioning here", "run", run.ID, "err", err)
	} else if handed {
		return nil
	}
	if run, err = db.TransitionRun(ctx, w.deps.Pool, run.ID, []string{db.RunQueued, db.RunPreparing}, db.RunPreparing,
		db.RunUpdate{NodeID: &w.deps.NodeID}); err != nil {
		return err
	}
	plan, err := planOf(run)
	if err != nil {
		return w.failRun(ctx, run, db.RunFailed, codeExecutorFailure, err.Error())
	}
	task, err := db.TaskByID(ctx, w.deps.Pool, run.CompanyID, run.TaskID)
	if err != nil {
		return w.failRun(ctx, run, db.RunFailed, codeExecutorFailure, "The task is gone.")
	}
	pw, err := db.PrimaryProjectWorkspace(ctx, w.deps.Pool, run.CompanyID, task.ProjectID)
	if err != nil {
		return w.failRun(ctx, run, db.RunFailed, "configuration_incomplete", "The project has no primary workspace.")
	}

	ws, err := w.realize(ctx, run, task, pw, plan)
	if errors.Is(err, errWorkspaceClosing) {
		return w.waitForClose(ctx, run)
	}
	if err != nil {
		return w.failRun(ctx, run, db.RunFailed, realizeErrorCode(err), "Preparing the workspace failed: "+err.Error())
	}
	if run, err = db.TransitionRun(ctx, w.deps.Pool, run.ID, []string{db.RunPreparing}, db.RunPreparing,
		db.RunUpdate{ExecutionWorkspaceID: &ws.ID}); err != nil {
		return err
	}
	lease, err := db.AcquireLeaseWithin(ctx, w.deps.Pool, db.LeaseRequest{CompanyID: run.CompanyID, EnvironmentID: run.EnvironmentID,
		ExecutionWorkspaceID: ws.ID, TaskID: run.TaskID, RunID: run.ID, TTL: leaseTTL}, w.capacity(ctx, run))
	if errors.Is(err, db.ErrLeaseUnavailable) && plan.ReuseWorkspaceID == "" {
		// The workspace this run continues in began to close after the run chose it: choose
		// again once the close is done (a new workspace), rather than fail the run.
		if now, e := db.ExecutionWorkspaceByID(ctx, w.deps.Pool, run.CompanyID, ws.ID); e == nil &&
			(now.Status == db.WorkspaceClosing || now.Status == db.WorkspaceClosed) {
			if err := db.ForgetRunWorkspace(ctx, w.deps.Pool, run.ID, ws.ID); err != nil {
				return err
			}
			return w.waitForClose(ctx, run)
		}
	}
	if errors.Is(err, db.ErrLeaseUnavailable) || errors.Is(err, db.ErrNotFound) {
		return w.failRun(ctx, run, db.RunFailed, codeEnvironment, "The environment is archived or the workspace is closing.")
	}
	if err != nil {
		return snoozeBusy(err)
	}
	if run, err = db.TransitionRun(ctx, w.deps.Pool, run.ID, []string{db.RunPreparing}, db.RunPreparing,
		db.RunUpdate{LeaseID: &lease.ID}); err != nil {
		return err
	}

	if pw.SetupCommand != "" && !db.RunStepSucceeded(ctx, w.deps.Pool, run.ID, "setup") {
		if err := w.setup(ctx, run, ws, pw, plan); errors.Is(err, errLeaseLost) {
			return w.failRunPersistently(ctx, run, codeLeaseLost, "The run lost its lease during the setup command, which was stopped.")
		} else if err != nil {
			return w.failRun(ctx, run, db.RunFailed, codeSetupFailed, "The setup command failed: "+err.Error())
		}
	}
	return db.InTx(ctx, w.deps.Pool, func(tx pgx.Tx) error {
		if _, err := db.TransitionRun(ctx, tx, run.ID, []string{db.RunPreparing}, db.RunPreparing, db.RunUpdate{}); err != nil {
			return err
		}
		_, err := Enqueue(ctx, river.ClientFromContext[pgx.Tx](ctx), tx, ExecuteRunArgs{RunID: run.ID})
		return err
	})
}

// realize finds or makes the run's execution workspace and records it ready.
func (w *ProvisionWorker) realize(ctx context.Context, run db.Run, task db.Task, pw db.ProjectWorkspace, plan workspace.Plan) (db.ExecutionWorkspace, error) {
	if run.ExecutionWorkspaceID != "" { // a retry: the first attempt recorded it
		return db.ExecutionWorkspaceByID(ctx, w.deps.Pool, run.CompanyID, run.ExecutionWorkspaceID)
	}
	// An attempt forks a worktree of its own from its group's base commit (attempts.go).
	attempt, err := attemptBase(ctx, w.deps.Pool, run)
	if err != nil {
		return db.ExecutionWorkspace{}, err
	}
	if attempt != "" {
		pw.DefaultRef = attempt
	}
	if plan.ReuseWorkspaceID != "" && attempt == "" {
		return db.ExecutionWorkspaceByID(ctx, w.deps.Pool, run.CompanyID, plan.ReuseWorkspaceID)
	}
	if plan.Strategy != "" && attempt == "" {
		// The task's earlier runs left a workspace of the same kind open: continue there.
		ws, err := db.TaskOpenWorkspace(ctx, w.deps.Pool, run.CompanyID, task.ID, plan.Mode, plan.Strategy)
		if err == nil {
			return ws, nil
		}
		if !errors.Is(err, db.ErrNotFound) {
			return db.ExecutionWorkspace{}, err
		}
		// One is closing: its directory and the task branch are still in use until it is closed.
		if closing, err := db.TaskClosingWorkspace(ctx, w.deps.Pool, run.CompanyID, task.ID, plan.Mode, plan.Strategy); err != nil {
			return db.ExecutionWorkspace{}, err
		} else if closing {
			return db.ExecutionWorkspace{}, errWorkspaceClosing
		}
	}
	var res workspace.Result
	err = w.operation(ctx, db.NewOperation{CompanyID: run.CompanyID, RunID: run.ID, TaskID: run.TaskID,
		Phase: "realize", Command: "realize " + plan.Strategy}, func(log *environment.LogBuffer) (*int, error) {
		var err error
		switch plan.Strategy {
		case string(workspace.StrategyShared):
			res, err = w.deps.Workspaces.RealizeShared(ctx, pw.Source)
		case string(workspace.StrategyCopy):
			res, err = w.deps.Workspaces.RealizeCopy(ctx, pw.Source)
		default:
			err = db.WithSourceLock(ctx, w.deps.Pool, run.CompanyID, pw.Source, func(ctx context.Context) error {
				var rerr error
				res, rerr = w.deps.Workspaces.RealizeGitWorktree(ctx, workspace.GitWorktreeSpec{Source: pw.Source,
					DefaultRef: pw.DefaultRef, TaskKey: task.Key, BranchTemplate: plan.Branch}) // the branch the plan showed, taken literally
				return rerr
			})
		}
		if err == nil {
			fmt.Fprintf(log, "realized %s workspace %s (branch %q, base %s)\n", res.Strategy, res.Ref, res.Branch, res.BaseCommit)
		}
		return nil, err
	})
	if err != nil {
		return db.ExecutionWorkspace{}, err
	}
	var ws db.ExecutionWorkspace
	err = db.InTx(ctx, w.deps.Pool, func(tx pgx.Tx) error {
		// A reused worktree (the task's clean, unstarted one) already has its row: adopt it.
		if existing, err := db.ExecutionWorkspaceByRef(ctx, tx, run.CompanyID, res.Ref); err == nil {
			if existing.Status != "ready" {
				return fmt.Errorf("workspace %s is %s", existing.Ref, existing.Status)
			}
			ws = existing
			return db.AttachRunOperations(ctx, tx, run.ID, ws.ID)
		} else if !errors.Is(err, db.ErrNotFound) {
			return err
		}
		var err error
		ws, err = db.CreateExecutionWorkspace(ctx, tx, db.NewExecutionWorkspace{CompanyID: run.CompanyID, ProjectID: task.ProjectID,
			ProjectWorkspaceID: pw.ID, SourceTaskID: task.ID, Mode: plan.Mode, Strategy: string(res.Strategy), Trust: task.Trust,
			Ref: res.Ref, Plan: run.Plan, NodeID: w.deps.NodeID})
		if err != nil {
			return err
		}
		ws, err = db.MarkExecutionWorkspaceReady(ctx, tx, ws.ID, ws.Generation, db.Realized{Cwd: res.Cwd, BaseRef: res.BaseRef,
			BaseCommit: res.BaseCommit, Branch: res.Branch, TreeDigest: res.TreeDigest})
		if err != nil {
			return err
		}
		return db.AttachRunOperations(ctx, tx, run.ID, ws.ID)
	})
	return ws, err
}

// setup runs the project workspace's setup command in the workspace, as a ledger step. On a
// remote driver (ssh) it runs on the remote, after execute_run has uploaded the workspace
// (remoteSetup), so here it is left for then.
func (w *ProvisionWorker) setup(ctx context.Context, run db.Run, ws db.ExecutionWorkspace, pw db.ProjectWorkspace, plan workspace.Plan) error {
	drv, err := w.driverFor(ctx, run)
	if err != nil {
		return err
	}
	if c, ok := drv.(io.Closer); ok {
		defer c.Close()
	}
	if environment.Remote(drv) {
		return nil
	}
	root, err := w.workspaceRoot(ws)
	if err != nil {
		return err
	}
	return w.setupStep(ctx, run, ws, pw, plan, drv, root)
}

// remoteSetup runs the setup command of a run on a remote driver in the uploaded workspace at
// dir, unless there is none or it already succeeded for this run.
func (w runWorker) remoteSetup(ctx context.Context, run db.Run, ws db.ExecutionWorkspace, drv environment.Driver, dir string) error {
	pw, err := db.ProjectWorkspaceByID(ctx, w.deps.Pool, run.CompanyID, ws.ProjectWorkspaceID)
	if err != nil {
		return err
	}
	if pw.SetupCommand == "" || db.RunStepSucceeded(ctx, w.deps.Pool, run.ID, "setup") {
		return nil
	}
	plan, err := planOf(run)
	if err != nil {
		return err
	}
	return w.setupStep(ctx, run, ws, pw, plan, drv, dir)
}

// setupStep is the setup ledger step: skipped when the plan forbids host scripts, else the
// command through drv in dir (the jail on this host; the remote directory on ssh).
func (w runWorker) setupStep(ctx context.Context, run db.Run, ws db.ExecutionWorkspace, pw db.ProjectWorkspace, plan workspace.Plan,
	drv environment.Driver, dir string) error {
	op := db.NewOperation{CompanyID: run.CompanyID, ExecutionWorkspaceID: ws.ID, RunID: run.ID,
		TaskID: run.TaskID, Phase: "setup", Command: pw.SetupCommand}
	if !plan.HostScriptsAllowed {
		return w.operation(ctx, op, func(log *environment.LogBuffer) (*int, error) {
			fmt.Fprintln(log, "skipped: the plan does not allow host setup scripts")
			return nil, errStepSkipped
		})
	}
	return w.operation(ctx, op, func(log *environment.LogBuffer) (*int, error) {
		req := environment.ExecRequest{Command: pw.SetupCommand, Dir: dir, Log: log, Tag: run.ID, Timeout: setupTimeout,
			Env: map[string]string{"BERTH_TASK_ID": run.TaskID, "BERTH_WORKSPACE_ID": ws.ID}}
		if !environment.Remote(drv) {
			var err error
			if req, err = w.inJail(ctx, ws, run.EnvironmentID, req); err != nil {
				return nil, err
			}
		}
		// The setup command holds the run's lease like the run's command does: lost (fenced, or no
		// renewal for a whole TTL), the command is stopped (leases.go underLease).
		var res environment.ExecResult
		exec := func(ctx context.Context) error {
			var err error
			res, err = drv.Exec(ctx, req)
			return err
		}
		var err error
		if lease, lerr := db.LeaseByID(ctx, w.deps.Pool, run.CompanyID, run.LeaseID); lerr == nil && lease.Live() && lease.RunID == run.ID {
			err = w.deps.underLease(ctx, run, lease, exec)
		} else {
			err = exec(ctx)
		}
		if errors.Is(err, errLeaseLost) {
			code := res.ExitCode
			return &code, errLeaseLost
		}
		if err != nil && res.Started.IsZero() {
			return nil, err
		}
		code := res.ExitCode
		switch {
		case res.TimedOut:
			return &code, fmt.Errorf("timed out")
		case res.Cancelled:
			return &code, fmt.Errorf("cancelled")
		case code != 0:
			return &code, fmt.Errorf("exit status %d", code)
		}
		return &code, nil
	})
}

// realizeErrorCode is the error_code of a run whose workspace could not be realized: the copy
// quota has its own code (nothing was copied; a smaller source or a larger quota fixes it).
func realizeErrorCode(err error) string {
	if errors.Is(err, workspace.ErrSourceTooLarge) {
		return codeSourceTooLarge
	}
	return codeRealizeFailed
}

// failRunPersistently is failRun for a run whose lease was lost, most likely with its database:
// the verdict is retried until the database answers (or the job's context ends), so that a retry
// of provision never runs the setup command a second time.
func (w *ProvisionWorker) failRunPersistently(ctx context.Context, run db.Run, code, msg string) error {
	for {
		err := w.failRun(ctx, run, db.RunFailed, code, msg)
		if err == nil || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Second):
		}
	}
}
