package handlers

import (
	"net/http"
	"strings"

	"berth/db"
	"berth/environment"
	"berth/views"
	"berth/workspace"
)

// planInput turns a task's snapshot into the resolver's input.
func planInput(s db.PlanSnapshot) workspace.PlanInput {
	in := workspace.PlanInput{
		ProjectID: s.Task.ProjectID,
		Policy: workspace.ProjectPolicy{
			DefaultMode:       s.Policy.DefaultMode,
			AllowTaskOverride: s.Policy.AllowTaskOverride,
			EnvironmentID:     s.Policy.EnvironmentID,
			Strategy:          s.Policy.Strategy,
			BranchTemplate:    s.Policy.BranchTemplate,
		},
		TaskKey:       s.Task.Key,
		TaskTrust:     s.Task.Trust,
		TaskMode:      s.Task.WorkspaceMode,
		TaskEnvID:     s.Task.EnvironmentID,
		PrimarySource: s.PrimarySource,
		Environments:  make(map[string]workspace.PlanEnvironment, len(s.Environments)),
	}
	for _, e := range s.Environments {
		in.Environments[e.ID] = workspace.PlanEnvironment{ID: e.ID, Name: e.Name, Driver: e.Driver,
			Archived: e.Status != "active", Qualified: e.Qualified, Uncontained: e.Uncontained}
	}
	if s.Binding.Revision > 0 {
		in.BindingMode = s.Binding.Mode
		in.BindingTargetID = s.Binding.ExecutionWorkspaceID
	}
	if w := s.Target; w != nil {
		in.BindingTarget = &workspace.PlanWorkspace{ID: w.ID, ProjectID: w.ProjectID, Mode: w.Mode,
			Trust: w.Trust, Status: w.Status, Reusable: w.Reusable}
	}
	return in
}

// planResponse is GET /api/tasks/{id}/plan (docs/api.md "Effective plan"): empty ids, strategy and
// branch are null.
type planResponse struct {
	Mode               string                `json:"mode"`
	Strategy           *string               `json:"strategy"`
	EnvironmentID      *string               `json:"environment_id"`
	ReuseWorkspaceID   *string               `json:"reuse_workspace_id"`
	Branch             *string               `json:"branch"`
	HostScriptsAllowed bool                  `json:"host_scripts_allowed"`
	Blocked            bool                  `json:"blocked"`
	Blockers           []workspace.Blocker   `json:"blockers"`
	Trace              []workspace.TraceStep `json:"trace"`
	Egress             *planEgress           `json:"egress"`
}

func newPlanResponse(s db.PlanSnapshot, p workspace.Plan) planResponse {
	r := planResponse{Mode: p.Mode, Strategy: optional(p.Strategy), EnvironmentID: optional(p.EnvironmentID),
		ReuseWorkspaceID: optional(p.ReuseWorkspaceID), Branch: optional(p.Branch),
		HostScriptsAllowed: p.HostScriptsAllowed, Blocked: p.Blocked, Blockers: p.Blockers, Trace: p.Trace}
	if e, ok := planEgressOf(s, p); ok {
		r.Egress = &planEgress{Mode: string(e.Mode), Allow: nonNil(e.Allow), Deny: nonNil(e.Deny)}
	}
	return r
}

// planEgressOf is the egress of the plan's environment (the built-in local one when the plan
// names none); false for drivers without an egress policy, or an environment not in the snapshot.
func planEgressOf(s db.PlanSnapshot, p workspace.Plan) (environment.EgressConfig, bool) {
	if p.EnvironmentID == "" {
		return environment.DefaultEgress(environment.DriverLocal, true), true
	}
	for _, e := range s.Environments {
		if e.ID == p.EnvironmentID && (e.Driver == environment.DriverLocal || e.Driver == environment.DriverSandbox) {
			return environment.EgressOf(e.Driver, e.Driver == environment.DriverLocal || e.Network, e.Egress), true
		}
	}
	return environment.EgressConfig{}, false
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// planAPI answers with the task's effective plan and its trace: 200 always, blocked plans too.
func (s *Server) planAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx, id := r.Context(), r.PathValue("id")
	a, err := s.objectAccess(ctx, p, "tasks", id)
	if err != nil {
		return err
	}
	snap, err := db.LoadPlanSnapshot(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, newPlanResponse(snap, workspace.ResolvePlan(planInput(snap))))
	return nil
}

// planFragment is the plan panel alone, for htmx refreshes; a browser without htmx is sent to
// the task page, which shows the same panel.
func (s *Server) planFragment(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx, id := r.Context(), r.PathValue("id")
	a, err := s.objectAccess(ctx, p, "tasks", id)
	if err != nil {
		return err
	}
	if !taskFragmentRequest(r) {
		http.Redirect(w, r, "/tasks/"+id+"#plan", http.StatusSeeOther)
		return nil
	}
	snap, err := db.LoadPlanSnapshot(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	w.Header().Set("Vary", "HX-Request")
	return s.render(w, r, views.PlanPanel(planView(snap, workspace.ResolvePlan(planInput(snap)))))
}

// taskFragmentRequest reports whether htmx asks for a fragment (not a history restore, which needs
// the whole page).
func taskFragmentRequest(r *http.Request) bool {
	return isHTMX(r) && r.Header.Get("HX-History-Restore-Request") != "true"
}

// planView phrases a plan for the task page: environment and workspace by name where known.
func planView(s db.PlanSnapshot, p workspace.Plan) views.PlanView {
	v := views.PlanView{TaskID: s.Task.ID, Mode: p.Mode, Strategy: p.Strategy, Branch: p.Branch,
		HostScripts: p.HostScriptsAllowed, Services: p.ServicesAllowed, Blocked: p.Blocked}
	envName := func(id string) string {
		for _, e := range s.Environments {
			if e.ID == id {
				return views.EnvironmentLabel(e.Name, e.Driver)
			}
		}
		return ""
	}
	if p.EnvironmentID != "" {
		if v.Environment = envName(p.EnvironmentID); v.Environment == "" {
			v.Environment = "an environment that is gone"
		}
	}
	if p.ReuseWorkspaceID != "" {
		v.ReuseWorkspace = p.ReuseWorkspaceID
		if s.Target != nil && s.Target.ID == p.ReuseWorkspaceID {
			v.ReuseWorkspace = bindingWorkspaceLabel(*s.Target)
		}
	}
	for _, b := range p.Blockers {
		v.Blockers = append(v.Blockers, views.PlanBlocker{Code: b.Code, Message: b.Message, Fix: b.Fix})
	}
	v.Trace = planSteps(p.Trace, envName, v.ReuseWorkspace)
	if e, ok := planEgressOf(s, p); ok {
		set := egressSetting(e)
		v.Egress, v.EgressHint = set.Value, set.Hint
	}
	return v
}

// bindingWorkspaceLabel names an execution workspace for people: its ref, mode, branch and status.
func bindingWorkspaceLabel(w db.BindingWorkspace) string {
	parts := []string{w.Ref, w.Mode}
	if w.Branch != "" {
		parts = append(parts, w.Branch)
	}
	return strings.Join(append(parts, w.Status), " · ")
}
