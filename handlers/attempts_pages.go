package handlers

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"berth/db"
	"berth/views"
	"berth/workspace"
)

// The attempts pages (docs/attempts.md): the task page's attempts panel (loaded into the card
// views.TaskAttemptsSlot leaves), the compare page GET /tasks/{id}/attempts, and its forms.

// maxCompareDiff bounds the diff shown per attempt on the compare page.
const maxCompareDiff = 64 << 10

// attemptsPage is GET /tasks/{id}/attempts (readers): the compare page, or with
// ?fragment=panel the task page's panel, ?fragment=body the page's live part.
func (s *Server) attemptsPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx, id := r.Context(), r.PathValue("id")
	a, err := s.objectAccess(ctx, p, "tasks", id)
	if err != nil {
		return err
	}
	r = s.live(r, "task", id) // the compare page follows the task's runs and its group (docs/live.md)
	task, err := db.TaskByID(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	g, err := db.LatestAttemptGroup(ctx, s.pool, a.Company.ID, id)
	if err != nil && !errors.Is(err, db.ErrNotFound) {
		return err
	}
	var items []db.AttemptItem
	if g.ID != "" {
		if items, err = db.AttemptItems(ctx, s.pool, a.Company.ID, g.ID); err != nil {
			return err
		}
	}
	if r.URL.Query().Get("fragment") == "panel" {
		d, err := s.attemptsPanelData(ctx, a, task, g, items)
		if err != nil {
			return err
		}
		return s.render(w, r, views.AttemptsPanel(d))
	}
	if g.ID == "" {
		return &httpError{Status: http.StatusNotFound, Code: "no_attempts", Message: "The task has no attempts."}
	}
	d, err := s.attemptsPageData(ctx, a, task, g, items)
	if err != nil {
		return err
	}
	if isHTMX(r) && r.URL.Query().Get("fragment") == "body" {
		return s.render(w, r, views.AttemptsBody(d))
	}
	return s.render(w, r, views.AttemptsPage(s.taskFrame(r, a, task), d))
}

// attemptsPanelData says whether attempts can start and sums up the newest group.
func (s *Server) attemptsPanelData(ctx context.Context, a access, task db.Task, g db.AttemptGroup, items []db.AttemptItem) (views.AttemptsPanelData, error) {
	d := views.AttemptsPanelData{TaskID: task.ID, GroupID: g.ID, Count: g.Count, CreatedAt: g.CreatedAt}
	if g.ID != "" {
		d.Status = db.AttemptGroupState(g, items)
		for _, it := range items {
			if it.Sealed {
				d.Sealed++
			}
			if it.WorkspaceID != "" && it.WorkspaceID == g.SelectedWorkspaceID {
				d.WinnerN = it.N
			}
		}
	}
	if !a.canManage() || s.jobs == nil || s.workspaces == nil {
		return d, nil
	}
	snap, err := db.LoadPlanSnapshot(ctx, s.pool, a.Company.ID, task.ID)
	if err != nil {
		return d, err
	}
	plan := workspace.ResolvePlan(planInput(snap))
	_, liveErr := db.LiveTaskRun(ctx, s.pool, a.Company.ID, task.ID)
	switch {
	case task.ProjectStatus != "active":
		d.Why = "The project is archived."
	case plan.Blocked:
		d.Why = "The plan is blocked: fix what the plan panel names first."
	case plan.Mode != string(workspace.ModeIsolated) || plan.Strategy != string(workspace.StrategyGitWorktree):
		d.Why = "Attempts need an isolated git worktree plan."
	case task.Command == "":
		d.Why = "Give the task a command to run attempts."
	case liveErr == nil:
		d.Why = "A run of the task is in progress."
	case !errors.Is(liveErr, db.ErrNotFound):
		return d, liveErr
	case g.Status == db.AttemptGroupOpen:
		d.Why = "Decide the current attempts (select one or discard them) before starting more."
	default:
		d.CanStart = true
	}
	return d, nil
}

// attemptsPageData builds the compare page: per attempt its run, diffstat and diff against the
// base (read from the branch, or the rescue ref once discarded), previews and receipt.
func (s *Server) attemptsPageData(ctx context.Context, a access, task db.Task, g db.AttemptGroup, items []db.AttemptItem) (views.AttemptsPageData, error) {
	d := views.AttemptsPageData{TaskID: task.ID, TaskKey: task.Key, TaskTitle: task.Title, GroupID: g.ID, Generation: g.Generation,
		Status: db.AttemptGroupState(g, items), BaseCommit: g.BaseCommit, TaskBranch: g.TaskBranch, ReplacedRef: g.ReplacedRef,
		RefsState: g.RefsState, RefsError: g.RefsError}
	d.CanDecide = a.canManage() && d.Status == "sealed"
	gitDir := ""
	if s.workspaces != nil {
		if pw, err := db.PrimaryProjectWorkspace(ctx, s.pool, a.Company.ID, task.ProjectID); err == nil {
			gitDir, _ = s.workspaces.SourceGitDir(ctx, pw.Source)
		}
	}
	for _, it := range items {
		row := views.AttemptRow{N: it.N, RunID: it.RunID, WorkspaceID: it.WorkspaceID, Status: it.RunStatus, ExitCode: it.ExitCode,
			ErrorCode: it.ErrorCode, Branch: it.Branch, Sealed: it.Sealed, Digest: it.FinalTreeDigest, RescueRef: it.RescueRef,
			Selected: it.WorkspaceID != "" && it.WorkspaceID == g.SelectedWorkspaceID, Duration: attemptDuration(it)}
		if row.Branch == "" {
			row.Branch = attemptBranch(g.TaskBranch, it.N)
		}
		head := "refs/heads/" + row.Branch
		if it.RescueRef != "" {
			head = it.RescueRef
		}
		if gitDir != "" && it.Sealed {
			if tip, ok, err := s.workspaces.ResolveRef(ctx, gitDir, head); err == nil && ok {
				if st, err := s.workspaces.DiffStatOf(ctx, gitDir, g.BaseCommit, tip); err == nil {
					row.Files, row.Insertions, row.Deletions = st.Files, st.Insertions, st.Deletions
				}
				row.Diff, row.DiffCut, row.DiffHidden, _ = s.workspaces.DiffText(ctx, gitDir, g.BaseCommit, tip, maxCompareDiff)
			}
		}
		if it.WorkspaceID != "" {
			svcs, err := db.WorkspaceRuntimeServices(ctx, s.pool, a.Company.ID, it.WorkspaceID)
			if err != nil {
				return d, err
			}
			for _, sv := range svcs {
				if sv.Status == "running" {
					row.Previews = append(row.Previews, views.AttemptPreview{Name: sv.Name, URL: s.preview.URL(sv)})
				}
			}
		}
		if _, err := db.ReceiptOf(ctx, s.pool, a.Company.ID, it.RunID); err == nil {
			row.HasReceipt = true
		} else if !errors.Is(err, db.ErrNotFound) {
			return d, err
		}
		if row.Selected {
			d.WinnerN = it.N
		}
		d.Items = append(d.Items, row)
	}
	return d, nil
}

// attemptDuration is how long an attempt's command ran (so far), or "—" before it started.
func attemptDuration(it db.AttemptItem) string {
	if it.StartedAt == nil {
		return "—"
	}
	end := time.Now()
	if it.FinishedAt != nil {
		end = *it.FinishedAt
	}
	return end.Sub(*it.StartedAt).Round(100 * time.Millisecond).String()
}

// createAttemptsForm is POST /tasks/{id}/attempts (board members): starts count attempts and
// goes to the compare page.
func (s *Server) createAttemptsForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "tasks", id, "attempts.create", "task")
	if err != nil {
		return err
	}
	form, err := readForm(w, r, maxFormBody)
	if err != nil {
		return err
	}
	count, err := strconv.Atoi(form.Get("count"))
	if err != nil {
		return invalid(map[string]string{"count": "Choose how many attempts to run, from 2 to 8."})
	}
	if _, err := s.createAttempts(r.Context(), r, a, id, attemptRequest{Count: count}); err != nil {
		return err
	}
	http.Redirect(w, r, "/tasks/"+id+"/attempts", http.StatusSeeOther)
	return nil
}

// selectAttemptForm is POST /tasks/{id}/attempts/select (board members).
func (s *Server) selectAttemptForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	return s.decideAttemptsForm(w, r, p, true)
}

// discardAttemptsForm is POST /tasks/{id}/attempts/discard (board members).
func (s *Server) discardAttemptsForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	return s.decideAttemptsForm(w, r, p, false)
}

func (s *Server) decideAttemptsForm(w http.ResponseWriter, r *http.Request, p *principal, choose bool) error {
	id := r.PathValue("id")
	action := "attempts.discard"
	if choose {
		action = "attempts.select"
	}
	a, err := s.manageObject(r, p, "tasks", id, action, "task")
	if err != nil {
		return err
	}
	form, err := readForm(w, r, maxFormBody)
	if err != nil {
		return err
	}
	gen, err := strconv.ParseInt(form.Get("generation"), 10, 64)
	if err != nil {
		return invalid(map[string]string{"generation": "Reload the page and choose again."})
	}
	chosen := ""
	if choose {
		if chosen = form.Get("workspace_id"); !db.ValidID(chosen) {
			return invalid(map[string]string{"workspace_id": "Choose an attempt."})
		}
	}
	if _, err := s.decideAttempts(r.Context(), r, a, id, gen, chosen); err != nil {
		return err
	}
	http.Redirect(w, r, "/tasks/"+id+"/attempts", http.StatusSeeOther)
	return nil
}
