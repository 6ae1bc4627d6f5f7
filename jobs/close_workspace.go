package jobs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"berth/db"
	"berth/environment"
	"berth/jobs/services"
	"berth/workspace"
)

// Closing and reopening execution workspaces (docs/runs.md "Continuing, closing, reopening";
// the close-readiness contract is in docs/api.md "Execution workspaces"; reopen_workspace.go holds
// the reopen job).
//
// The handler decides: under a row lock it evaluates close-readiness, moves the workspace to
// closing with generation+1 and enqueues close_workspace with the plan it showed (rescue or not,
// the literal cleanup command, whether the root is deleted). The job only carries that plan out,
// each step a ledger operation, fenced by the generation: a job whose generation is no longer the
// workspace's (reopened or closed again since) does nothing. Any failed step leaves the workspace
// cleanup_failed with the reason; a new PATCH {status:"closed"} retries under a new generation.
// Reopen works the same way: closed → preparing (generation+1) → reopen_workspace rebuilds the
// root from the same task branch and records the new ref, or returns the workspace to closed with
// the reason.

// cleanupTimeout bounds a project workspace's cleanup command.
const cleanupTimeout = 15 * time.Minute

// closeAttempts is how often River retries a close whose attempt was interrupted (a crash or a
// shutdown); step failures are not retried, they end cleanup_failed.
const closeAttempts = 5

// Ledger commands of the close steps; the prefixes identify a step already done by an earlier
// attempt of the same job.
const (
	rescueCommandPrefix = "git update-ref refs/berth/rescue/"
	forgetSharedCommand = "berth: archive the shared workspace record (the project directory is left untouched)"
)

// CloseWorkspaceArgs asks to carry out an accepted close. The handler fills it from the readiness
// it evaluated when it accepted the close, so the job does exactly what the planned actions said.
type CloseWorkspaceArgs struct {
	CompanyID   string `json:"company_id"`
	WorkspaceID string `json:"workspace_id"`
	// Generation is the workspace's generation after the close was accepted (the fencing token).
	Generation int64 `json:"generation"`
	// Rescue snapshots the worktree into refs/berth/rescue/<ref>-<unix> before anything is removed
	// (a confirmed destructive close of dirty or unmerged work).
	Rescue bool `json:"rescue"`
	// CleanupCommand is the project's cleanup command to run in the root; "" runs none (no
	// command, host scripts not allowed, or nothing to clean).
	CleanupCommand string `json:"cleanup_command,omitempty"`
	// Remove deletes the managed root (git worktree unregistered first); false for shared
	// workspaces, whose directory belongs to the project.
	Remove bool `json:"remove"`
	// EnvironmentID is where the cleanup command runs (the workspace plan's environment).
	EnvironmentID string `json:"environment_id,omitempty"`
}

// Kind names the job in River.
func (CloseWorkspaceArgs) Kind() string { return "close_workspace" }

// InsertOpts: an interrupted attempt is retried; the steps are idempotent.
func (CloseWorkspaceArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: closeAttempts}
}

// CloseWorkspaceWorker carries out accepted closes.
type CloseWorkspaceWorker struct {
	river.WorkerDefaults[CloseWorkspaceArgs]
	runWorker
}

// Timeout bounds one attempt: the cleanup command plus the rescue and the removal.
func (w *CloseWorkspaceWorker) Timeout(*river.Job[CloseWorkspaceArgs]) time.Duration {
	return cleanupTimeout + 10*time.Minute
}

// Work closes the workspace, or records why it could not.
func (w *CloseWorkspaceWorker) Work(ctx context.Context, job *river.Job[CloseWorkspaceArgs]) error {
	a := job.Args
	ws, err := w.jobWorkspace(ctx, "close_workspace", a.CompanyID, a.WorkspaceID)
	if err != nil {
		return err
	}
	if ws.Generation != a.Generation || ws.Status != db.WorkspaceClosing {
		w.deps.Log.InfoContext(ctx, "close_workspace fenced: the workspace moved on", "workspace_id", ws.ID,
			"job_generation", a.Generation, "generation", ws.Generation, "status", ws.Status)
		return nil
	}
	stepErr := w.close(ctx, job, ws)
	if stepErr != nil && ctx.Err() != nil && job.Attempt < closeAttempts {
		return stepErr // interrupted (shutdown, timeout): retry the whole, idempotent, close
	}
	bg := context.WithoutCancel(ctx)
	return db.InTx(bg, w.deps.Pool, func(tx pgx.Tx) error {
		action, details := "execution_workspace.closed", map[string]any{"generation": ws.Generation}
		var err error
		if stepErr != nil {
			reason := w.failureReason(stepErr)
			action, details["reason"] = "execution_workspace.cleanup_failed", reason
			_, err = db.FailWorkspaceClose(bg, tx, ws.ID, ws.Generation, reason)
		} else {
			_, err = db.FinishWorkspaceClose(bg, tx, ws.ID, ws.Generation)
		}
		if errors.Is(err, db.ErrWorkspaceFenced) {
			return nil
		}
		if err != nil {
			return err
		}
		return systemAudit(bg, tx, ws, action, details)
	})
}

// close runs the planned steps in order: rescue, cleanup command, removal (or, for a shared
// workspace, dropping Berth's record of it). The task branch is never touched.
func (w *CloseWorkspaceWorker) close(ctx context.Context, job *river.Job[CloseWorkspaceArgs], ws db.ExecutionWorkspace) error {
	a := job.Args
	// Services stop first: nothing may serve from a tree that is being removed.
	if w.deps.Services != nil {
		if err := w.deps.Services.StopWorkspace(ctx, ws.CompanyID, ws.ID, services.StopWorkspaceClosed, false); err != nil {
			return fmt.Errorf("stop the workspace's services: %w", err)
		}
	}
	managed := ws.Strategy != string(workspace.StrategyShared)
	// The root is needed only by steps still to do: a retry after an attempt that removed it
	// finds every step before the removal already done.
	var root string
	rootErr := errors.New("shared workspace")
	if managed {
		root, rootErr = w.deps.Workspaces.Root(ws.Ref)
	}
	needRoot := func() error {
		if rootErr != nil {
			return fmt.Errorf("the workspace directory is not one this node manages: %w", rootErr)
		}
		return nil
	}
	if a.Remove && !a.Rescue && rootErr == nil && ws.Strategy == string(workspace.StrategyGitWorktree) {
		if err := w.stillClean(ctx, job, ws, root); err != nil {
			return err
		}
	}
	if a.Rescue {
		if err := w.rescue(ctx, job, ws, root, needRoot); err != nil {
			return err
		}
	}
	if a.CleanupCommand != "" {
		// A retry after an interruption does not run a cleanup command that already succeeded.
		done, err := db.OperationSucceededSince(ctx, w.deps.Pool, ws.ID, "cleanup", a.CleanupCommand, job.CreatedAt)
		if err != nil {
			return err
		}
		if !done {
			if err := needRoot(); err != nil {
				return err
			}
			if err := w.cleanup(ctx, ws, root, a); err != nil {
				return err
			}
		}
	}
	switch {
	case a.Remove:
		return w.remove(ctx, job, ws)
	case !managed:
		return w.operation(ctx, db.NewOperation{CompanyID: ws.CompanyID, ExecutionWorkspaceID: ws.ID, TaskID: ws.SourceTaskID,
			Phase: "teardown", Command: forgetSharedCommand}, func(log *environment.LogBuffer) (*int, error) {
			err := w.deps.Workspaces.Forget(ws.Ref)
			if errors.Is(err, workspace.ErrNotManaged) {
				fmt.Fprintln(log, "no record left on this node: nothing to do")
				return nil, nil
			}
			if err == nil {
				fmt.Fprintln(log, "shared workspace: nothing on disk was deleted; Berth no longer tracks it as open")
			}
			return nil, err
		})
	}
	return nil
}

// stillClean refuses a close accepted as clean whose worktree now holds uncommitted or unmerged
// work (workspace.GitState.WorkAtRisk, the rule close-readiness blocks on): nothing may be lost
// without a rescue. It checks before the cleanup command (which may write in the tree); a retry
// that got past the cleanup command does not check again.
func (w *CloseWorkspaceWorker) stillClean(ctx context.Context, job *river.Job[CloseWorkspaceArgs], ws db.ExecutionWorkspace, root string) error {
	started, err := db.OperationStartedSince(ctx, w.deps.Pool, ws.ID, "cleanup", job.CreatedAt)
	if err != nil || started {
		return err
	}
	gs, err := w.deps.Workspaces.GitState(ctx, ws.Ref, ws.BaseRef)
	if err != nil {
		return err
	}
	if dirty, unmerged := gs.WorkAtRisk(); gs.Readable && (dirty || unmerged) {
		return errors.New("the worktree has uncommitted or unmerged work that was not there when the close was accepted; nothing was deleted. Check close-readiness and close again (confirming a destructive close saves it to a rescue ref first)")
	}
	return nil
}

// rescue snapshots the worktree into a rescue ref, once per accepted close, and records the
// snapshot commit as a work product of the source task.
func (w *CloseWorkspaceWorker) rescue(ctx context.Context, job *river.Job[CloseWorkspaceArgs], ws db.ExecutionWorkspace, root string, needRoot func() error) error {
	done, err := db.OperationSucceededSince(ctx, w.deps.Pool, ws.ID, "finalize", rescueCommandPrefix, job.CreatedAt)
	if err != nil || done {
		return err
	}
	if err := needRoot(); err != nil {
		return fmt.Errorf("saving the work to a rescue ref failed, so nothing was deleted: %w", err)
	}
	var rr workspace.RescueRef
	err = w.operation(ctx, db.NewOperation{CompanyID: ws.CompanyID, ExecutionWorkspaceID: ws.ID, TaskID: ws.SourceTaskID,
		Phase: "finalize", Command: rescueCommandPrefix + ws.Ref + "-<unix-time> <snapshot-commit>"},
		func(log *environment.LogBuffer) (*int, error) {
			var err error
			rr, err = w.deps.Workspaces.Rescue(ctx, ws.Ref, time.Now())
			if err == nil {
				fmt.Fprintf(log, "saved HEAD and every uncommitted or untracked file as %s at %s\n", rr.Commit, rr.Name)
			}
			return nil, err
		})
	if err != nil {
		return fmt.Errorf("saving the work to a rescue ref failed, so nothing was deleted: %w", err)
	}
	return db.AddWorkProduct(ctx, w.deps.Pool, db.WorkProduct{CompanyID: ws.CompanyID, TaskID: ws.SourceTaskID,
		ExecutionWorkspaceID: ws.ID, Kind: "commit", Ref: rr.Commit,
		Metadata: map[string]any{"rescue_ref": rr.Name, "branch": ws.Branch, "reason": "destructive close"}})
}

// cleanup runs the project's cleanup command in the root through the environment's driver.
func (w *CloseWorkspaceWorker) cleanup(ctx context.Context, ws db.ExecutionWorkspace, root string, a CloseWorkspaceArgs) error {
	drv, err := w.driverFor(ctx, db.Run{CompanyID: ws.CompanyID, EnvironmentID: a.EnvironmentID})
	if err != nil {
		return fmt.Errorf("the cleanup command could not run: %w", err)
	}
	err = w.operation(ctx, db.NewOperation{CompanyID: ws.CompanyID, ExecutionWorkspaceID: ws.ID, TaskID: ws.SourceTaskID,
		Phase: "cleanup", Command: a.CleanupCommand}, func(log *environment.LogBuffer) (*int, error) {
		req, err := w.inJail(ctx, ws, a.EnvironmentID, environment.ExecRequest{Command: a.CleanupCommand, Dir: root, Log: log,
			Tag: fmt.Sprintf("close-%s-%d", ws.ID, ws.Generation), Timeout: cleanupTimeout,
			Env: map[string]string{"BERTH_TASK_ID": ws.SourceTaskID, "BERTH_WORKSPACE_ID": ws.ID}})
		if err != nil {
			return nil, err
		}
		res, err := drv.Exec(ctx, req)
		if err != nil && res.Started.IsZero() {
			return nil, err
		}
		code := res.ExitCode
		switch {
		case res.TimedOut:
			return &code, fmt.Errorf("timed out after %s", cleanupTimeout)
		case res.Cancelled:
			return &code, fmt.Errorf("cancelled")
		case code != 0:
			return &code, fmt.Errorf("exit status %d", code)
		case err != nil:
			return &code, err
		}
		return &code, nil
	})
	if err != nil {
		return fmt.Errorf("the cleanup command failed (%w), so nothing was deleted; fix it or the workspace and close again", err)
	}
	return nil
}

// remove unregisters the worktree and deletes the managed root; Berth never deletes a path it
// does not manage.
func (w *CloseWorkspaceWorker) remove(ctx context.Context, job *river.Job[CloseWorkspaceArgs], ws db.ExecutionWorkspace) error {
	// Whether an earlier attempt of this job already started removing the root: only then may a
	// root that is entirely gone count as removed.
	retried, err := db.OperationStartedSince(ctx, w.deps.Pool, ws.ID, "teardown", job.CreatedAt)
	if err != nil {
		return err
	}
	root := workspace.WorkspacesPlaceholder + "/" + ws.Ref
	command := "rm -rf -- " + root
	if ws.Strategy == string(workspace.StrategyGitWorktree) {
		command = "git -C " + root + " worktree remove --force --force " + root + " && " + command
	}
	err = w.operation(ctx, db.NewOperation{CompanyID: ws.CompanyID, ExecutionWorkspaceID: ws.ID, TaskID: ws.SourceTaskID,
		Phase: "teardown", Command: command}, func(log *environment.LogBuffer) (*int, error) {
		err := w.deps.Workspaces.Destroy(ctx, ws.Ref)
		if errors.Is(err, workspace.ErrNotManaged) && retried && rootGone(w.deps.Workspaces, ws.Ref) {
			// Nothing under the ref at all: an interrupted earlier attempt finished the removal
			// (record included) before it could record the close. Nothing is left to delete.
			fmt.Fprintf(log, "%s is already gone\n", ws.Ref)
			return nil, nil
		}
		if err == nil {
			fmt.Fprintf(log, "removed %s", ws.Ref)
			if ws.Branch != "" {
				fmt.Fprintf(log, "; branch %s is kept", ws.Branch)
			}
			fmt.Fprintln(log)
		}
		return nil, err
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, workspace.ErrNotManaged):
		return fmt.Errorf("berth does not manage this workspace's directory on this node (no ownership record, or the directory was replaced), so it deleted nothing; inspect and remove it by hand: %w", err)
	case errors.Is(err, workspace.ErrBusy):
		return fmt.Errorf("the workspace is in use on this node (a run or a file read holds it); close again in a moment: %w", err)
	}
	return fmt.Errorf("removing the workspace directory failed: %w", err)
}

// rootGone reports whether nothing at all exists under ref in the managed base.
func rootGone(m *workspace.Manager, ref string) bool {
	if !workspace.ValidRef(ref) {
		return false
	}
	_, err := os.Lstat(filepath.Join(m.Base(), ref))
	return errors.Is(err, fs.ErrNotExist)
}

// absPathRE matches an absolute path at the start of a word.
var absPathRE = regexp.MustCompile(`(^|[\s'"=(\[:])/[^\s'"()\[\]:]*`)

// failureReason phrases a failed close or reopen for the workspace record: no absolute host path,
// no control characters, at most 500 bytes.
func (w runWorker) failureReason(err error) string {
	s := err.Error()
	if base := w.deps.Workspaces.Base(); base != "" {
		s = strings.ReplaceAll(s, base, workspace.WorkspacesPlaceholder)
	}
	s = absPathRE.ReplaceAllString(s, "$1<path>")
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > 500 {
		s = strings.ToValidUTF8(s[:500], "") + "…"
	}
	return s
}

// jobWorkspace reads the workspace a close or reopen job names; one that is gone cancels the job.
func (w runWorker) jobWorkspace(ctx context.Context, kind, companyID, id string) (db.ExecutionWorkspace, error) {
	ws, err := db.ExecutionWorkspaceByID(ctx, w.deps.Pool, companyID, id)
	if errors.Is(err, db.ErrNotFound) {
		return ws, river.JobCancel(fmt.Errorf("%s: workspace %s is gone", kind, id))
	}
	return ws, err
}

// systemAudit records what a job did to a workspace, in tx.
func systemAudit(ctx context.Context, tx pgx.Tx, ws db.ExecutionWorkspace, action string, details map[string]any) error {
	return db.InsertAudit(ctx, tx, db.AuditEvent{CompanyID: ws.CompanyID, ActorType: db.ActorSystem, ActorLabel: "berth",
		Action: action, TargetType: "execution_workspace", TargetID: ws.ID, Details: details})
}
