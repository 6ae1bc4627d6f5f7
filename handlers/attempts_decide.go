package handlers

import (
	"context"
	"errors"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/jobs"
)

// Deciding an attempt group (DESIGN §13, docs/attempts.md): select records the chosen attempt,
// discard records that none is; both are fenced by the group's generation (the second decision is
// a 409) and answer at once, with the group's refs_state pending. The select_attempts job then
// points the task branch at the chosen attempt's head, moves every other attempt's branch to
// refs/berth/discarded/{task_key}-a{n} and closes their workspaces through the normal fenced
// close, under the source's preparation lock (jobs/select_attempts.go). Nothing is merged and the
// base is never written.

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
			strconv.FormatInt(g.Generation, 10) + ", " + g.Status + "). Read them again.",
		Extra: map[string]any{"generation": g.Generation, "status": g.Status}}
}

// errTaskBranchCheckedOut refuses a selection while the task branch is checked out somewhere.
var errTaskBranchCheckedOut = &httpError{Status: http.StatusConflict, Code: "task_branch_checked_out",
	Message: "The task branch is checked out in an open workspace: close that workspace first, then select again."}

// decideAttempts records the selection of the attempt in workspace chosen ("" discards them all)
// under the group's row lock, at generation gen, and enqueues the select_attempts job that moves
// the refs and closes the others (the group reads refs_state pending until it did).
func (s *Server) decideAttempts(ctx context.Context, r *http.Request, a access, taskID string, gen int64, chosen string) (db.AttemptGroup, error) {
	if s.jobs == nil {
		return db.AttemptGroup{}, errRunsUnavailable
	}
	var g db.AttemptGroup
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
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
		d := db.Decision{Status: db.AttemptGroupDiscarded}
		if chosen != "" {
			var pick *db.AttemptItem
			for i, it := range items {
				if it.WorkspaceID == chosen {
					pick = &items[i]
				}
			}
			if pick == nil || !pick.Sealed {
				return invalid(map[string]string{"workspace_id": "Choose the workspace of a sealed attempt of this group."})
			}
			d = db.Decision{Status: db.AttemptGroupSelected, SelectedWorkspaceID: pick.WorkspaceID, SelectedN: pick.N}
			if open, err := db.BranchOpen(ctx, tx, a.Company.ID, g.TaskBranch); err != nil {
				return err
			} else if open {
				return errTaskBranchCheckedOut
			}
		}
		if g, err = db.DecideAttemptGroup(ctx, tx, g.ID, gen, d); errors.Is(err, db.ErrAttemptFenced) {
			return errAttemptsDecided(g)
		} else if err != nil {
			return err
		}
		if _, err := jobs.Enqueue(ctx, s.jobs, tx, jobs.SelectAttemptsArgs{CompanyID: g.CompanyID, GroupID: g.ID, Generation: g.Generation}); err != nil {
			return nodeUnavailable(err)
		}
		details := map[string]any{"group_id": g.ID, "generation": g.Generation}
		action := "attempts.discarded"
		if d.SelectedN > 0 {
			action, details["n"], details["workspace_id"] = "attempts.selected", d.SelectedN, d.SelectedWorkspaceID
		}
		return s.auditTx(ctx, tx, r, a, action, "task", taskID, details)
	})
	return g, err
}
