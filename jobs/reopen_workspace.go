package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"berth/db"
	"berth/environment"
	"berth/workspace"
)

// Reopening a closed execution workspace: the handler moves it closed → preparing with
// generation+1 under its row lock and enqueues reopen_workspace, which rebuilds the root or
// returns the workspace to closed with the reason (see close_workspace.go for the close side and
// the helpers both share).

// ReopenWorkspaceArgs asks to rebuild a reopened workspace (status preparing at Generation).
type ReopenWorkspaceArgs struct {
	CompanyID   string `json:"company_id"`
	WorkspaceID string `json:"workspace_id"`
	Generation  int64  `json:"generation"`
}

// Kind names the job in River.
func (ReopenWorkspaceArgs) Kind() string { return "reopen_workspace" }

// InsertOpts: an interrupted attempt is retried.
func (ReopenWorkspaceArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: closeAttempts}
}

// ReopenWorkspaceWorker rebuilds a closed workspace: a git worktree is realized again from the
// same task branch (whose history the close kept), a copy is copied again from the project
// source, a shared workspace points at the project directory again. The root gets a new ref.
type ReopenWorkspaceWorker struct {
	river.WorkerDefaults[ReopenWorkspaceArgs]
	runWorker
}

// Timeout bounds one rebuild.
func (w *ReopenWorkspaceWorker) Timeout(*river.Job[ReopenWorkspaceArgs]) time.Duration {
	return 15 * time.Minute
}

// Work rebuilds the workspace and marks it ready, or returns it to closed with the reason.
func (w *ReopenWorkspaceWorker) Work(ctx context.Context, job *river.Job[ReopenWorkspaceArgs]) error {
	a := job.Args
	ws, err := w.jobWorkspace(ctx, "reopen_workspace", a.CompanyID, a.WorkspaceID)
	if err != nil {
		return err
	}
	if ws.Generation != a.Generation || ws.Status != db.WorkspacePreparing {
		return nil // fenced: closed, reopened or rebuilt since
	}
	res, realizeErr := w.realize(ctx, ws)
	if realizeErr != nil && ctx.Err() != nil && job.Attempt < closeAttempts {
		return realizeErr
	}
	if realizeErr == nil && res.Reused && res.Ref != ws.Ref {
		realizeErr = fmt.Errorf("the task branch %s is checked out in another workspace (%s); close that one first", res.Branch, res.Ref)
	}
	bg := context.WithoutCancel(ctx)
	var fenced bool
	err = db.InTx(bg, w.deps.Pool, func(tx pgx.Tx) error {
		if realizeErr != nil {
			reason := "Reopening failed: " + w.failureReason(realizeErr)
			_, err := db.AbortWorkspaceReopen(bg, tx, ws.ID, ws.Generation, reason)
			if errors.Is(err, db.ErrWorkspaceFenced) {
				return nil
			}
			if err != nil {
				return err
			}
			return systemAudit(bg, tx, ws, "execution_workspace.reopen_failed", map[string]any{"generation": ws.Generation, "reason": reason})
		}
		r := db.Realized{Cwd: res.Cwd, BaseRef: res.BaseRef, BaseCommit: res.BaseCommit, Branch: res.Branch, TreeDigest: res.TreeDigest}
		if res.Strategy == workspace.StrategyGitWorktree && ws.BaseRef != "" {
			r.BaseRef, r.BaseCommit = ws.BaseRef, ws.BaseCommit // realized from the recorded base commit
		}
		_, err := db.MarkWorkspaceReopened(bg, tx, ws.ID, ws.Generation, res.Ref, r)
		if errors.Is(err, db.ErrWorkspaceFenced) {
			fenced = true
			return nil
		}
		if err != nil {
			return err
		}
		return systemAudit(bg, tx, ws, "execution_workspace.reopened", map[string]any{"generation": ws.Generation})
	})
	if err != nil {
		return err
	}
	if fenced && realizeErr == nil && !res.Reused {
		// Someone else moved the workspace on: the new root belongs to nobody.
		if res.Strategy == workspace.StrategyShared {
			_ = w.deps.Workspaces.Forget(res.Ref)
		} else {
			_ = w.deps.Workspaces.Destroy(bg, res.Ref)
		}
	}
	return nil
}

// realize rebuilds the root as a ledger step.
func (w *ReopenWorkspaceWorker) realize(ctx context.Context, ws db.ExecutionWorkspace) (workspace.Result, error) {
	if ws.ProjectWorkspaceID == "" {
		return workspace.Result{}, errors.New("the project workspace it came from was deleted")
	}
	pw, err := db.ProjectWorkspaceByID(ctx, w.deps.Pool, ws.CompanyID, ws.ProjectWorkspaceID)
	if err != nil {
		return workspace.Result{}, fmt.Errorf("the project workspace it came from cannot be read: %w", err)
	}
	var plan workspace.Plan
	if err := json.Unmarshal(ws.Plan, &plan); err != nil {
		return workspace.Result{}, fmt.Errorf("its recorded plan cannot be read: %w", err)
	}
	taskKey := "task"
	if ws.SourceTaskID != "" {
		if t, err := db.TaskByID(ctx, w.deps.Pool, ws.CompanyID, ws.SourceTaskID); err == nil {
			taskKey = t.Key
		}
	}
	var res workspace.Result
	err = w.operation(ctx, db.NewOperation{CompanyID: ws.CompanyID, ExecutionWorkspaceID: ws.ID, TaskID: ws.SourceTaskID,
		Phase: "realize", Command: "reopen " + ws.Strategy}, func(log *environment.LogBuffer) (*int, error) {
		var err error
		switch ws.Strategy {
		case string(workspace.StrategyShared):
			res, err = w.deps.Workspaces.RealizeShared(ctx, pw.Source)
		case string(workspace.StrategyCopy):
			res, err = w.deps.Workspaces.RealizeCopy(ctx, pw.Source)
		case string(workspace.StrategyGitWorktree):
			base := ws.BaseCommit
			if base == "" {
				base = pw.DefaultRef
			}
			branch := ws.Branch
			if branch == "" {
				branch = plan.Branch
			}
			err = db.WithSourceLock(ctx, w.deps.Pool, ws.CompanyID, pw.Source, func(ctx context.Context) error {
				var rerr error
				res, rerr = w.deps.Workspaces.RealizeGitWorktree(ctx, workspace.GitWorktreeSpec{Source: pw.Source,
					DefaultRef: base, TaskKey: taskKey, BranchTemplate: branch})
				return rerr
			})
		default:
			err = fmt.Errorf("unknown strategy %q", ws.Strategy)
		}
		if err == nil {
			fmt.Fprintf(log, "realized %s workspace %s (branch %q, base %s)\n", res.Strategy, res.Ref, res.Branch, res.BaseCommit)
		}
		return nil, err
	})
	return res, err
}
