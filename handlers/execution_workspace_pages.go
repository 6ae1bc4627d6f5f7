package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"

	"berth/db"
	"berth/views"
	"berth/workspace"
)

// Execution workspace pages: the company's list with its filters, and one workspace's page (ledger,
// runs, leases, work products and the close-readiness panel).

// workspacesPage is GET /companies/{cid}/workspaces: the company's execution workspaces with
// status, project and task filters, newest first.
func (s *Server) workspacesPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	a, err := s.companyAccess(ctx, p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	q, err := parseWorkspaceQuery(r)
	if err != nil {
		return err
	}
	list, next, err := s.listWorkspaces(ctx, a, q)
	if err != nil {
		return err
	}
	projects, err := db.ListProjects(ctx, s.pool, a.Company.ID, "", "", maxPageLimit)
	if err != nil {
		return err
	}
	names := map[string]string{}
	d := views.WorkspacesData{CompanyID: a.Company.ID, Status: q.Status, ProjectID: q.ProjectID, TaskID: q.TaskID,
		Statuses: db.WorkspaceStatuses}
	for _, pr := range projects {
		names[pr.ID] = pr.Name
		d.Projects = append(d.Projects, views.TaskOption{Value: pr.ID, Label: pr.Key + " · " + pr.Name})
	}
	var taskIDs []string
	for _, ws := range list {
		taskIDs = append(taskIDs, ws.SourceTaskID)
	}
	if q.TaskID != "" {
		taskIDs = append(taskIDs, q.TaskID)
	}
	labels, err := db.TaskLabels(ctx, s.pool, a.Company.ID, taskIDs)
	if err != nil {
		return err
	}
	if q.TaskID != "" {
		d.TaskKey = labels[q.TaskID].Key
	}
	for _, ws := range list {
		d.Items = append(d.Items, views.WorkspaceRow{ID: ws.ID, Ref: ws.Ref, Status: ws.Status, Mode: ws.Mode,
			Strategy: ws.Strategy, Branch: ws.Branch, ProjectID: ws.ProjectID, ProjectName: names[ws.ProjectID],
			TaskID: ws.SourceTaskID, TaskKey: labels[ws.SourceTaskID].Key, Generation: ws.Generation,
			CreatedAt: ws.CreatedAt, ClosedAt: ws.ClosedAt})
	}
	if next != "" {
		d.NextURL = workspacesPageURL(a.Company.ID, q, next)
	}
	if htmxTarget(r, "workspaces-view") {
		return s.render(w, r, views.WorkspacesView(d))
	}
	return s.render(w, r, views.WorkspacesPage(s.companyFrame(r, a, "Workspaces", "workspaces"), d))
}

// workspacesPageURL is the list page with the same filters and limit, at cursor.
func workspacesPageURL(companyID string, q workspaceQuery, cursor string) string {
	v := url.Values{}
	for k, val := range map[string]string{"status": q.Status, "project_id": q.ProjectID, "task_id": q.TaskID} {
		if val != "" {
			v.Set(k, val)
		}
	}
	if q.Limit != defaultPageLimit {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	v.Set("cursor", cursor)
	return "/companies/" + companyID + "/workspaces?" + v.Encode()
}

// workspacePageData gathers everything the workspace page shows.
func (s *Server) workspacePageData(ctx context.Context, a access, ws db.ExecutionWorkspace, confirm bool) (views.WorkspacePageData, error) {
	d := views.WorkspacePageData{ID: ws.ID, CompanyID: ws.CompanyID, Ref: ws.Ref, Status: ws.Status, Mode: ws.Mode,
		Strategy: ws.Strategy, Trust: ws.Trust, Branch: ws.Branch, BaseRef: ws.BaseRef, BaseCommit: ws.BaseCommit,
		TreeDigest: ws.BaseTreeDigest, FinalizeState: ws.FinalizeState, CleanupReason: ws.CleanupReason,
		Generation: ws.Generation, CreatedAt: ws.CreatedAt, ClosedAt: ws.ClosedAt, ProjectID: ws.ProjectID,
		TaskID: ws.SourceTaskID, CanManage: a.canManage() && s.jobs != nil,
		Live: ws.Status == db.WorkspaceClosing || ws.Status == db.WorkspacePreparing}
	if pr, err := db.ProjectByID(ctx, s.pool, a.Company.ID, ws.ProjectID); err == nil {
		d.ProjectName = pr.Name
	} else if !errors.Is(err, db.ErrNotFound) {
		return d, err
	}
	var plan workspace.Plan
	if json.Unmarshal(ws.Plan, &plan) == nil {
		d.PlanMode, d.PlanStrategy, d.PlanBranch, d.PlanHostScripts = plan.Mode, plan.Strategy, plan.Branch, plan.HostScriptsAllowed
		envs, err := db.EnvironmentSummaries(ctx, s.pool, a.Company.ID)
		if err != nil {
			return d, err
		}
		d.Trace = planSteps(plan.Trace, func(id string) string {
			for _, e := range envs {
				if e.ID == id {
					return views.EnvironmentLabel(e.Name, e.Driver)
				}
			}
			return ""
		}, "")
	}
	ops, err := db.WorkspaceOperationsPage(ctx, s.pool, a.Company.ID, ws.ID, db.OperationCursor{}, maxPageLimit, 16<<10)
	if err != nil {
		return d, err
	}
	for _, o := range ops {
		d.Operations = append(d.Operations, views.WorkspaceOpRow{ID: o.ID, RunID: o.RunID, LogBytes: o.LogBytes,
			LogTruncated: o.LogTruncated, Excerpt: int64(len(o.Log)) < o.LogBytes,
			OperationRow: views.OperationRow{Phase: o.Phase, Command: o.Command, Status: o.Status, ExitCode: o.ExitCode,
				Error: o.Error, Log: logText(o.Log), StartedAt: o.StartedAt, FinishedAt: o.FinishedAt}})
	}
	runs, err := db.WorkspaceRuns(ctx, s.pool, a.Company.ID, ws.ID, 20)
	if err != nil {
		return d, err
	}
	var taskIDs []string
	for _, r := range runs {
		taskIDs = append(taskIDs, r.TaskID)
	}
	taskIDs = append(taskIDs, ws.SourceTaskID)
	labels, err := db.TaskLabels(ctx, s.pool, a.Company.ID, taskIDs)
	if err != nil {
		return d, err
	}
	d.TaskKey, d.TaskTitle = labels[ws.SourceTaskID].Key, labels[ws.SourceTaskID].Title
	for _, r := range runs {
		d.Runs = append(d.Runs, views.WorkspaceRunRow{ID: r.ID, TaskKey: labels[r.TaskID].Key, Status: r.Status,
			ErrorCode: r.ErrorCode, CreatedAt: r.CreatedAt})
	}
	leases, err := db.WorkspaceLeases(ctx, s.pool, a.Company.ID, ws.ID, false, 20)
	if err != nil {
		return d, err
	}
	for _, l := range leases {
		d.Leases = append(d.Leases, views.WorkspaceLeaseRow{ID: l.ID, Status: l.Status, RunID: l.RunID, Generation: l.Generation,
			CleanupStatus: l.CleanupStatus, AcquiredAt: l.AcquiredAt, ReleasedAt: l.ReleasedAt, FailureReason: l.FailureReason})
	}
	products, err := db.WorkspaceWorkProducts(ctx, s.pool, a.Company.ID, ws.ID, 50)
	if err != nil {
		return d, err
	}
	for _, p := range products {
		row := views.WorkProductRow{Kind: p.Kind, Ref: p.Ref, URL: p.URL, Path: p.Path, RunID: p.RunID, CreatedAt: p.CreatedAt}
		if v, ok := p.Metadata["rescue_ref"].(string); ok {
			row.Detail = "rescue ref " + v
		} else if v, ok := p.Metadata["branch"].(string); ok {
			row.Detail = "on " + v
		}
		d.WorkProducts = append(d.WorkProducts, row)
	}
	if d.Services, err = s.servicesPanelData(ctx, a, ws); err != nil {
		return d, err
	}
	d.Readiness = views.WorkspaceReadinessView{Confirmed: confirm}
	if ws.Status == db.WorkspaceClosed || d.Live {
		return d, nil // the panel shows the close or the rebuild, not readiness
	}
	facts, err := s.evaluateClose(ctx, s.pool, ws, confirm)
	var he *httpError
	switch {
	case errors.As(err, &he):
		d.Readiness.Unavailable = he.Message
	case err != nil:
		return d, err
	default:
		d.Readiness = readinessView(facts.Readiness)
	}
	return d, nil
}

// readinessView phrases readiness for the page.
func readinessView(r readinessJSON) views.WorkspaceReadinessView {
	v := views.WorkspaceReadinessView{State: r.State, DestructiveRequired: r.DestructiveRequired, Shared: r.Shared,
		Confirmed: r.ConfirmDestructive}
	overridable := len(r.BlockingReasons) > 0
	for _, b := range r.BlockingReasons {
		v.Blockers = append(v.Blockers, views.WorkspaceReason{Code: b.Code, Message: b.Message})
		if b.Code != workspace.BlockDirtyWorktree && b.Code != workspace.BlockUnmergedWork {
			overridable = false
		}
	}
	v.Closable = r.State != workspace.ReadinessBlocked || overridable
	for _, x := range r.Warnings {
		v.Warnings = append(v.Warnings, views.WorkspaceReason{Code: x.Code, Message: x.Message})
	}
	for _, t := range r.LinkedTasks {
		v.LinkedTasks = append(v.LinkedTasks, views.WorkspaceLinkedTask{ID: t.ID, Key: t.Key, Status: t.Status, Open: t.Open})
	}
	if g := r.Git; g != nil {
		v.Git = &views.WorkspaceGit{Dirty: g.Dirty, Untracked: g.Untracked, Ahead: g.Ahead, Behind: g.Behind, Merged: g.Merged, Readable: g.Readable,
			SinceBase: g.CommitsSinceBase}
	}
	for _, act := range r.PlannedActions {
		v.Actions = append(v.Actions, views.WorkspaceAction{Kind: act.Kind, Label: act.Label, Command: act.Command})
	}
	return v
}

// workspacePage is GET /workspaces/{id}; ?confirm_destructive=1 previews a destructive close.
func (s *Server) workspacePage(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	r = s.live(r, "workspace", r.PathValue("id")) // the body and services follow it (events_pages.go)
	a, ws, err := s.workspaceFor(ctx, p, r.PathValue("id"))
	if err != nil {
		return err
	}
	if isHTMX(r) && r.URL.Query().Get("fragment") == "services" {
		d, err := s.servicesPanelData(ctx, a, ws)
		if err != nil {
			return err
		}
		return s.render(w, r, views.ServicesPanel(d))
	}
	d, err := s.workspacePageData(ctx, a, ws, boolParam(r.URL.Query().Get("confirm_destructive")))
	if err != nil {
		return err
	}
	if isHTMX(r) && r.URL.Query().Get("fragment") == "body" {
		return s.render(w, r, views.WorkspaceBody(d))
	}
	return s.render(w, r, views.WorkspacePage(s.companyFrame(r, a, "Workspace "+shortRef(ws.Ref), "workspaces"), d))
}

// shortRef is the recognizable start of a workspace ref.
func shortRef(ref string) string {
	if len(ref) > 11 {
		return ref[:11]
	}
	return ref
}
