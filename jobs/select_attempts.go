package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"berth/db"
	"berth/workspace"
	"berth/workspace/receipt"
)

// select_attempts carries out a decision on an attempt group (DESIGN §13, docs/attempts.md). The
// request recorded it (status, generation, the chosen attempt; refs pending); this job, under the
// source's preparation lock that attempt creation and provisioning take too, points the task
// branch at the chosen attempt's head, moves every other open attempt's branch to
// refs/berth/discarded/{task_key}-a{n}, and then, in one transaction: records each rescue ref,
// re-signs the discarded receipts, accepts the close of the discarded workspaces (close_workspace,
// fenced) and marks the refs done. Every step is idempotent, so a retry after a crash finishes
// the same decision. When the task branch turned out checked out after all (a workspace opened it
// after the request looked), nothing has moved and the decision is taken back: the group is open
// again, at a new generation, with the reason.

// SelectAttemptsArgs names the decision: group GroupID of CompanyID at Generation (the one the
// decision gave it).
type SelectAttemptsArgs struct {
	CompanyID  string `json:"company_id"`
	GroupID    string `json:"group_id"`
	Generation int64  `json:"generation"`
}

// Kind names the job in River.
func (SelectAttemptsArgs) Kind() string { return "select_attempts" }

// InsertOpts: a few retries (git or the database failing for a moment); then the group reads
// failed with the reason (exhausted.go).
func (SelectAttemptsArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{MaxAttempts: 5} }

// SelectAttemptsWorker runs select_attempts.
type SelectAttemptsWorker struct {
	river.WorkerDefaults[SelectAttemptsArgs]
	runWorker
}

// Work moves the refs of the decision, or finds them moved.
func (w *SelectAttemptsWorker) Work(ctx context.Context, job *river.Job[SelectAttemptsArgs]) error {
	a := job.Args
	if w.deps.Workspaces == nil {
		return errors.New("select attempts: this process has no workspace manager")
	}
	g, err := db.AttemptGroupByID(ctx, w.deps.Pool, a.CompanyID, a.GroupID)
	if errors.Is(err, db.ErrNotFound) {
		return nil // the task is gone
	}
	if err != nil {
		return err
	}
	if g.Generation != a.Generation || g.RefsState == db.RefsDone {
		return nil // done, or taken back
	}
	task, err := db.TaskByID(ctx, w.deps.Pool, a.CompanyID, g.TaskID)
	if err != nil {
		return err
	}
	items, err := db.AttemptItems(ctx, w.deps.Pool, a.CompanyID, g.ID)
	if err != nil {
		return err
	}
	pick, discard := decisionItems(g, items)
	pw, err := db.PrimaryProjectWorkspace(ctx, w.deps.Pool, a.CompanyID, task.ProjectID)
	if err != nil {
		return err
	}
	var sel workspace.Selected
	err = db.WithSourceLock(ctx, w.deps.Pool, a.CompanyID, pw.Source, func(ctx context.Context) error {
		gitDir, err := w.deps.Workspaces.SourceGitDir(ctx, pw.Source)
		if err != nil {
			return err
		}
		s := workspace.Selection{GitDir: gitDir, TaskBranch: g.TaskBranch, Now: time.Now()}
		if pick != nil {
			s.ChosenBranch = pick.Branch
		}
		for _, it := range discard {
			s.Discard = append(s.Discard, workspace.Discard{Ref: it.WorkspaceRef, Branch: it.Branch,
				RescueRef: "refs/berth/discarded/" + task.Key + "-a" + strconv.Itoa(it.N)})
		}
		sel, err = w.deps.Workspaces.SelectAttempt(ctx, s)
		return err
	})
	if errors.Is(err, workspace.ErrBranchInUse) {
		return w.takeBack(ctx, g, "The task branch "+g.TaskBranch+" is checked out in an open workspace: close that workspace first, then select again.")
	}
	if err != nil {
		return err
	}
	return db.InTx(ctx, w.deps.Pool, func(tx pgx.Tx) error {
		if g, err = db.LockAttemptGroup(ctx, tx, a.CompanyID, a.GroupID); err != nil {
			return err
		}
		if g.Generation != a.Generation || g.RefsState == db.RefsDone {
			return nil
		}
		for _, it := range discard {
			if err := w.discardAttempt(ctx, tx, g.CompanyID, it, sel.Rescue[it.Branch]); err != nil {
				return err
			}
		}
		if g, err = db.FinishAttemptRefs(ctx, tx, g.ID, g.Generation, sel.Head, sel.Replaced); err != nil {
			return err
		}
		details := map[string]any{"group_id": g.ID, "generation": g.Generation, "discarded": len(discard)}
		if pick != nil {
			details["n"], details["workspace_id"], details["head"] = pick.N, pick.WorkspaceID, sel.Head
		}
		if sel.Replaced != "" {
			details["replaced_ref"] = sel.Replaced
		}
		return db.InsertAudit(ctx, tx, db.AuditEvent{CompanyID: g.CompanyID, ActorType: db.ActorSystem, ActorLabel: "berth",
			Action: "attempts.refs_moved", TargetType: "task", TargetID: g.TaskID, Details: details})
	})
}

// decisionItems is the chosen attempt (nil for a discard) and the attempts whose workspaces the
// decision discards: every other one that is not closing or closed.
func decisionItems(g db.AttemptGroup, items []db.AttemptItem) (pick *db.AttemptItem, discard []db.AttemptItem) {
	for i, it := range items {
		switch {
		case g.Status == db.AttemptGroupSelected && it.WorkspaceID == g.SelectedWorkspaceID:
			pick = &items[i]
		case it.WorkspaceID != "" && it.WorkspaceStatus != db.WorkspaceClosed && it.WorkspaceStatus != db.WorkspaceClosing:
			discard = append(discard, it)
		}
	}
	return pick, discard
}

// takeBack reopens the group whose refs could not move, and audits why.
func (w *SelectAttemptsWorker) takeBack(ctx context.Context, g db.AttemptGroup, reason string) error {
	return db.InTx(ctx, w.deps.Pool, func(tx pgx.Tx) error {
		reopened, err := db.ReopenAttemptGroup(ctx, tx, g.ID, g.Generation, reason)
		if errors.Is(err, db.ErrConflict) { // another group opened meanwhile: this one stays decided, refs unmoved
			reopened, err = db.FailAttemptRefs(ctx, tx, g.ID, g.Generation, reason)
		}
		if errors.Is(err, db.ErrAttemptFenced) {
			return nil
		}
		if err != nil {
			return err
		}
		return db.InsertAudit(ctx, tx, db.AuditEvent{CompanyID: g.CompanyID, ActorType: db.ActorSystem, ActorLabel: "berth",
			Action: "attempts.decision_taken_back", TargetType: "task", TargetID: g.TaskID,
			Details: map[string]any{"group_id": g.ID, "generation": reopened.Generation, "reason": reason}})
	})
}

// discardAttempt records a discarded attempt's rescue ref, re-signs its receipt as discarded and
// accepts the close of its workspace (close_workspace, fenced by the workspace's generation).
func (w *SelectAttemptsWorker) discardAttempt(ctx context.Context, tx pgx.Tx, companyID string, it db.AttemptItem, rescue string) error {
	if err := db.SetAttemptRescueRef(ctx, tx, it.RunID, rescue); err != nil {
		return err
	}
	ws, err := db.LockExecutionWorkspace(ctx, tx, companyID, it.WorkspaceID)
	if err != nil {
		return err
	}
	if err := w.resignDiscarded(ctx, tx, companyID, it.RunID); err != nil {
		return err
	}
	if ws.Status != db.WorkspaceReady && ws.Status != db.WorkspaceCleanupFailed {
		return nil // closing, closed or failed already
	}
	var plan workspace.Plan
	_ = json.Unmarshal(ws.Plan, &plan)
	args := CloseWorkspaceArgs{CompanyID: ws.CompanyID, WorkspaceID: ws.ID, EnvironmentID: plan.EnvironmentID,
		Rescue: true, Remove: true}
	if plan.HostScriptsAllowed && ws.ProjectWorkspaceID != "" {
		if pw, err := db.ProjectWorkspaceByID(ctx, tx, ws.CompanyID, ws.ProjectWorkspaceID); err == nil {
			args.CleanupCommand = pw.CleanupCommand
		}
	}
	if ws, err = db.BeginWorkspaceClose(ctx, tx, ws.ID, ws.Generation); err != nil {
		return err
	}
	args.Generation = ws.Generation
	if _, err := Enqueue(ctx, river.ClientFromContext[pgx.Tx](ctx), tx, args); err != nil {
		return fmt.Errorf("close discarded attempt %d: %w", it.N, err)
	}
	return systemAudit(ctx, tx, ws, "execution_workspace.close_requested", map[string]any{"generation": ws.Generation,
		"reason": "attempt discarded", "rescue_ref": rescue, "cleanup_command": args.CleanupCommand != "", "remove": true})
}

// resignDiscarded re-signs a discarded attempt's receipt with disposition discarded.
func (w *SelectAttemptsWorker) resignDiscarded(ctx context.Context, tx pgx.Tx, companyID, runID string) error {
	doc, err := db.ReceiptOf(ctx, tx, companyID, runID)
	if errors.Is(err, db.ErrNotFound) || len(w.deps.ReceiptKey) == 0 {
		return nil
	}
	if err != nil {
		return err
	}
	rc, err := receipt.Parse(doc)
	if err != nil {
		return err
	}
	if rc.Disposition == receipt.DispositionDiscarded {
		return nil
	}
	rc.Disposition = receipt.DispositionDiscarded
	if doc, err = receipt.Sign(w.deps.ReceiptKey, rc); err != nil {
		return err
	}
	return db.SaveReceipt(ctx, tx, companyID, runID, rc.Disposition, doc)
}
