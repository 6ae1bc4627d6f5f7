package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/jobs"
	"berth/workspace"
)

// Deciding an attempt group (DESIGN §13): select points the task branch at the chosen attempt's
// head, moves every other attempt's branch to refs/berth/discarded/{task_key}-a{n} and closes
// their workspaces through the normal fenced close (close_workspace: services stopped, cleanup
// command, rescue ref, worktree removed, ledger and audit); discard does the same to all of them.
// Nothing is merged and the base is never written. Both are fenced by the group's generation:
// the second decision is a 409.

// selectRequest is the body of POST /api/tasks/{id}/attempts/select.
type selectRequest struct {
	WorkspaceID string `json:"workspace_id"`
	Generation  *int64 `json:"generation"`
}

// discardRequest is the body of POST /api/tasks/{id}/attempts/discard.
type discardRequest struct {
	Generation *int64 `json:"generation"`
}

// selectAttemptsAPI is POST /api/tasks/{id}/attempts/select (board members): 200 with the group.
func (s *Server) selectAttemptsAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "tasks", id, "attempts.select", "task")
	if err != nil {
		return err
	}
	var in selectRequest
	if err := decodeJSON(w, r, &in); err != nil {
		return err
	}
	fields := map[string]string{}
	if !db.ValidID(in.WorkspaceID) {
		fields["workspace_id"] = "Give the execution_workspace_id of the attempt to keep."
	}
	if in.Generation == nil {
		fields["generation"] = "Give the group's generation as GET /api/tasks/{id}/attempts returned it."
	}
	if len(fields) > 0 {
		return invalid(fields)
	}
	g, err := s.decideAttempts(r.Context(), r, a, id, *in.Generation, in.WorkspaceID)
	if err != nil {
		return err
	}
	return s.writeAttempts(w, r.Context(), a, g, http.StatusOK)
}

// discardAttemptsAPI is POST /api/tasks/{id}/attempts/discard (board members): 200 with the group.
func (s *Server) discardAttemptsAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "tasks", id, "attempts.discard", "task")
	if err != nil {
		return err
	}
	var in discardRequest
	if err := decodeJSON(w, r, &in); err != nil {
		return err
	}
	if in.Generation == nil {
		return invalid(map[string]string{"generation": "Give the group's generation as GET /api/tasks/{id}/attempts returned it."})
	}
	g, err := s.decideAttempts(r.Context(), r, a, id, *in.Generation, "")
	if err != nil {
		return err
	}
	return s.writeAttempts(w, r.Context(), a, g, http.StatusOK)
}

// errAttemptsDecided is the 409 for a decision on a decided group or with a stale generation.
func errAttemptsDecided(g db.AttemptGroup) error {
	return &httpError{Status: http.StatusConflict, Code: "attempts_decided",
		Message: "These attempts were already decided or changed since you read them (generation " +
			itoa64(g.Generation) + ", " + g.Status + "). Read them again.",
		Extra: map[string]any{"generation": g.Generation, "status": g.Status}}
}

// errTaskBranchCheckedOut refuses a selection while the task branch is checked out somewhere.
var errTaskBranchCheckedOut = &httpError{Status: http.StatusConflict, Code: "task_branch_checked_out",
	Message: "The task branch is checked out in an open workspace: close that workspace first, then select again."}

// decideAttempts selects the attempt in workspace chosen ("" discards them all) under the group's
// row lock, at generation gen.
func (s *Server) decideAttempts(ctx context.Context, r *http.Request, a access, taskID string, gen int64, chosen string) (db.AttemptGroup, error) {
	if s.jobs == nil {
		return db.AttemptGroup{}, errRunsUnavailable
	}
	if s.workspaces == nil {
		return db.AttemptGroup{}, errWorkspacesUnavailable
	}
	task, err := db.TaskByID(ctx, s.pool, a.Company.ID, taskID)
	if err != nil {
		return db.AttemptGroup{}, err
	}
	var g db.AttemptGroup
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		if g, err = db.LockLatestAttemptGroup(ctx, tx, a.Company.ID, taskID); errors.Is(err, db.ErrNotFound) {
			return &httpError{Status: http.StatusNotFound, Code: "no_attempts", Message: "The task has no attempts."}
		} else if err != nil {
			return err
		}
		if g.Status != db.AttemptGroupOpen || g.Generation != gen {
			return errAttemptsDecided(g)
		}
		items, err := db.AttemptItems(ctx, tx, a.Company.ID, g.ID)
		if err != nil {
			return err
		}
		if db.AttemptGroupState(g, items) != "sealed" {
			return &httpError{Status: http.StatusConflict, Code: "attempts_running",
				Message: "Some attempts are still running or finalizing: decide once every attempt is sealed or has failed."}
		}
		var pick *db.AttemptItem
		var discard []db.AttemptItem
		for i, it := range items {
			switch {
			case chosen != "" && it.WorkspaceID == chosen:
				pick = &items[i]
			case it.WorkspaceID != "" && it.WorkspaceStatus != db.WorkspaceClosed && it.WorkspaceStatus != db.WorkspaceClosing:
				discard = append(discard, it)
			}
		}
		if chosen != "" && (pick == nil || !pick.Sealed) {
			return invalid(map[string]string{"workspace_id": "Choose the workspace of a sealed attempt of this group."})
		}
		d := db.Decision{Status: db.AttemptGroupDiscarded}
		if pick != nil {
			d = db.Decision{Status: db.AttemptGroupSelected, SelectedWorkspaceID: pick.WorkspaceID, SelectedN: pick.N}
			if open, err := db.BranchOpen(ctx, tx, a.Company.ID, g.TaskBranch); err != nil {
				return err
			} else if open {
				return errTaskBranchCheckedOut
			}
		}
		sel, err := s.moveAttemptRefs(ctx, tx, a, task, g, pick, discard)
		if err != nil {
			return err
		}
		d.ReplacedRef = sel.Replaced
		if g, err = db.DecideAttemptGroup(ctx, tx, g.ID, gen, d); errors.Is(err, db.ErrAttemptFenced) {
			return errAttemptsDecided(g)
		} else if err != nil {
			return err
		}
		for _, it := range discard {
			if err := s.discardAttempt(ctx, tx, r, a, it, sel.Rescue[it.Branch]); err != nil {
				return err
			}
		}
		details := map[string]any{"group_id": g.ID, "generation": g.Generation, "discarded": len(discard)}
		action := "attempts.discarded"
		if pick != nil {
			action, details["n"], details["workspace_id"], details["head"] = "attempts.selected", pick.N, pick.WorkspaceID, sel.Head
		}
		return s.auditTx(ctx, tx, r, a, action, "task", taskID, details)
	})
	return g, err
}

// moveAttemptRefs does the git side of a decision in the source repository of the group.
func (s *Server) moveAttemptRefs(ctx context.Context, q db.Querier, a access, task db.Task, g db.AttemptGroup,
	pick *db.AttemptItem, discard []db.AttemptItem) (workspace.Selected, error) {
	pw, err := db.PrimaryProjectWorkspace(ctx, q, a.Company.ID, task.ProjectID)
	if err != nil {
		return workspace.Selected{}, err
	}
	gitDir, err := s.workspaces.SourceGitDir(ctx, pw.Source)
	if err != nil {
		return workspace.Selected{}, err
	}
	sel := workspace.Selection{GitDir: gitDir, TaskBranch: g.TaskBranch, Now: time.Now()}
	if pick != nil {
		sel.ChosenBranch = pick.Branch
	}
	for _, it := range discard {
		sel.Discard = append(sel.Discard, workspace.Discard{Ref: it.WorkspaceRef, Branch: it.Branch,
			RescueRef: "refs/berth/discarded/" + task.Key + "-a" + itoa64(int64(it.N))})
	}
	res, err := s.workspaces.SelectAttempt(ctx, sel)
	if errors.Is(err, workspace.ErrBranchInUse) {
		return res, errTaskBranchCheckedOut
	}
	return res, err
}

// discardAttempt records a discarded attempt's rescue ref, re-signs its receipt as discarded and
// accepts the close of its workspace (close_workspace, fenced by the workspace's generation).
func (s *Server) discardAttempt(ctx context.Context, tx pgx.Tx, r *http.Request, a access, it db.AttemptItem, rescue string) error {
	if err := db.SetAttemptRescueRef(ctx, tx, it.RunID, rescue); err != nil {
		return err
	}
	if err := s.resignDiscarded(ctx, tx, a, it.RunID); err != nil {
		return err
	}
	ws, err := db.LockExecutionWorkspace(ctx, tx, a.Company.ID, it.WorkspaceID)
	if err != nil {
		return err
	}
	if ws.Status != db.WorkspaceReady && ws.Status != db.WorkspaceCleanupFailed {
		return nil // closing, closed or failed already
	}
	var plan workspace.Plan
	_ = json.Unmarshal(ws.Plan, &plan)
	args := jobs.CloseWorkspaceArgs{CompanyID: ws.CompanyID, WorkspaceID: ws.ID, EnvironmentID: plan.EnvironmentID,
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
	if _, err := jobs.Enqueue(ctx, s.jobs, tx, args); err != nil {
		return nodeUnavailable(err)
	}
	return s.auditTx(ctx, tx, r, a, "execution_workspace.close_requested", "execution_workspace", ws.ID,
		map[string]any{"generation": ws.Generation, "reason": "attempt discarded", "rescue_ref": rescue,
			"cleanup_command": args.CleanupCommand != "", "remove": true})
}

// resignDiscarded re-signs a discarded attempt's receipt with disposition discarded.
func (s *Server) resignDiscarded(ctx context.Context, tx pgx.Tx, a access, runID string) error {
	doc, err := db.ReceiptOf(ctx, tx, a.Company.ID, runID)
	if errors.Is(err, db.ErrNotFound) || s.secrets == nil {
		return nil
	}
	if err != nil {
		return err
	}
	rc, err := db.ParseReceipt(doc)
	if err != nil {
		return err
	}
	rc.Disposition = db.DispositionDiscarded
	if doc, err = db.SignReceipt(s.secrets.ReceiptKey(), rc); err != nil {
		return err
	}
	return db.SaveReceipt(ctx, tx, a.Company.ID, runID, rc.Disposition, doc)
}

func itoa64(n int64) string { return strconv.FormatInt(n, 10) }
