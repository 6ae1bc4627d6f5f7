package handlers

import (
	"context"
	"net/http"
	"strings"

	"berth/db"
	"berth/views"
	"berth/workspace"
)

// Project pages and forms: a company's projects list with the new-project form, a project's page
// with its edit form, and the archive buttons.

// projectsPage is a company's projects list, with the new-project form for board members.
func (s *Server) projectsPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	a, err := s.companyAccess(r.Context(), p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	d, err := s.projectsPageData(r, a)
	if err != nil {
		return err
	}
	return s.render(w, r, views.ProjectsPage(s.companyFrame(r, a, "Projects", "projects"), d))
}

// projectsPageData reads the projects list page and an empty new-project form.
func (s *Server) projectsPageData(r *http.Request, a access) (views.ProjectsPageData, error) {
	page, err := s.listProjectPage(r, a)
	if err != nil {
		return views.ProjectsPageData{}, err
	}
	envs, err := s.projectEnvOptions(r.Context(), a.Company.ID, "")
	if err != nil {
		return views.ProjectsPageData{}, err
	}
	d := views.ProjectsPageData{CompanyID: a.Company.ID, NextCursor: page.next, Paged: r.URL.Query().Get("cursor") != "",
		CanManage: a.canManage(), HasEnvironments: len(envs) > 0,
		Form: views.ProjectForm{CompanyID: a.Company.ID, Values: projectFormValuesOf(db.Project{
			Policy: projectPolicyInput{DefaultMode: workspace.ModeIsolated}.normalize()}), Environments: envs}}
	if len(envs) == 1 {
		d.Form.Values.EnvironmentID = envs[0].ID // the only choice is the likely one
	}
	for _, it := range page.items {
		d.Projects = append(d.Projects, views.ProjectRow{ID: it.ID, Key: it.Key, Name: it.Name,
			Status: it.Status, Workspaces: it.Workspaces, Tasks: it.Tasks})
	}
	return d, nil
}

// projectEnvOptions lists the environments a policy form offers: the company's active ones,
// plus the one the policy names now if it was archived since.
func (s *Server) projectEnvOptions(ctx context.Context, companyID, current string) ([]views.ProjectEnvOption, error) {
	envs, err := db.PolicyEnvironments(ctx, s.pool, companyID, current != "")
	if err != nil {
		return nil, err
	}
	var out []views.ProjectEnvOption
	for _, e := range envs {
		switch {
		case e.Status == "active":
			out = append(out, views.ProjectEnvOption{ID: e.ID, Name: e.Name, Driver: e.Driver})
		case e.ID == current:
			out = append(out, views.ProjectEnvOption{ID: e.ID, Name: e.Name + ", archived", Driver: e.Driver})
		}
	}
	return out, nil
}

// createProjectForm handles the new-project form: on success the browser goes to the new
// project; refused values re-render the form with their messages (422, or 409 for a taken key).
func (s *Server) createProjectForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	a, err := s.companyAccess(ctx, p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	if err := s.requireManage(r, a, "project.create", "company", a.Company.ID); err != nil {
		return err
	}
	if _, err := readForm(w, r, maxTextFormBody); err != nil {
		return err
	}
	vals := projectFormValuesFrom(r)
	proj, err := s.createProject(ctx, r, a, projectInputFrom(vals))
	if he, ok := formRefusal(err); ok {
		fields, status := formErrors(he), he.Status
		envs, err := s.projectEnvOptions(ctx, a.Company.ID, "")
		if err != nil {
			return err
		}
		form := views.ProjectForm{CompanyID: a.Company.ID, Values: vals, Errors: fields, Environments: envs}
		if isHTMX(r) {
			return s.renderStatus(w, r, status, views.ProjectCreateForm(form))
		}
		d, err := s.projectsPageData(r, a)
		if err != nil {
			return err
		}
		d.Form = form
		return s.renderStatus(w, r, status, views.ProjectsPage(s.companyFrame(r, a, "Projects", "projects"), d))
	}
	if err != nil {
		return err
	}
	redirectAfterForm(w, r, "/projects/"+proj.ID)
	return nil
}

// projectPage shows a project: its policy (editable by board members), its workspaces and its
// tasks (loaded from the tasks page by htmx, with a plain link as the fallback).
func (s *Server) projectPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.objectAccess(ctx, p, "projects", id)
	if err != nil {
		return err
	}
	r = s.live(r, "company", a.Company.ID, "topic", "task") // its task section follows the company's tasks
	proj, err := db.ProjectByID(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	d, err := s.projectPageData(ctx, a, proj)
	if err != nil {
		return err
	}
	return s.render(w, r, views.ProjectPage(s.projectFrame(r, a, proj.ID, proj.Name), d))
}

// projectPageData gathers a project's page: policy view, edit form, workspaces section.
func (s *Server) projectPageData(ctx context.Context, a access, proj db.Project) (views.ProjectPageData, error) {
	envs, err := db.PolicyEnvironments(ctx, s.pool, a.Company.ID, true)
	if err != nil {
		return views.ProjectPageData{}, err
	}
	options, err := s.projectEnvOptions(ctx, a.Company.ID, proj.Policy.EnvironmentID)
	if err != nil {
		return views.ProjectPageData{}, err
	}
	ws, err := s.projectWorkspacesData(ctx, a, proj)
	if err != nil {
		return views.ProjectPageData{}, err
	}
	editable := a.canManage() && !proj.Archived()
	return views.ProjectPageData{
		Project:    projectViewOf(proj, envs),
		CanManage:  a.canManage(),
		Editable:   editable,
		Edit:       views.ProjectForm{CompanyID: proj.CompanyID, ProjectID: proj.ID, Values: projectFormValuesOf(proj), Environments: options},
		Workspaces: ws,
	}, nil
}

// projectViewOf phrases a project for its page, naming its environment and what is wrong with it.
func projectViewOf(p db.Project, envs []db.PolicyEnvironment) views.ProjectView {
	v := views.ProjectView{ID: p.ID, CompanyID: p.CompanyID, Name: p.Name, Key: p.Key, Description: p.Description,
		Status: p.Status, DefaultMode: p.Policy.DefaultMode, AllowTaskOverride: p.Policy.AllowTaskOverride,
		EnvironmentID: p.Policy.EnvironmentID, Strategy: p.Policy.Strategy, BranchTemplate: p.Policy.BranchTemplate}
	if v.EnvironmentID == "" {
		return v
	}
	v.EnvironmentNote = "missing: it was deleted"
	for _, e := range envs {
		if e.ID == v.EnvironmentID {
			v.EnvironmentName, v.EnvironmentNote = e.Name, ""
			if e.Status != "active" {
				v.EnvironmentNote = "archived"
			}
		}
	}
	return v
}

// updateProjectForm handles a project's edit form (name, description, policy).
func (s *Server) updateProjectForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "projects", id, "project.update", "project")
	if err != nil {
		return err
	}
	if _, err := readForm(w, r, maxTextFormBody); err != nil {
		return err
	}
	vals := projectFormValuesFrom(r)
	in := projectInputFrom(vals)
	_, err = s.updateProject(ctx, r, a, id, projectChange{Name: &in.Name, Description: &in.Description, Policy: &in.Policy})
	if he, ok := formRefusal(err); ok {
		fields, status := formErrors(he), he.Status
		proj, err := db.ProjectByID(ctx, s.pool, a.Company.ID, id)
		if err != nil {
			return err
		}
		d, err := s.projectPageData(ctx, a, proj)
		if err != nil {
			return err
		}
		vals.Key = proj.Key
		d.Edit.Values, d.Edit.Errors = vals, fields
		if isHTMX(r) {
			return s.renderStatus(w, r, status, views.ProjectEditForm(d.Edit))
		}
		return s.renderStatus(w, r, status, views.ProjectPage(s.projectFrame(r, a, proj.ID, proj.Name), d))
	}
	if err != nil {
		return err
	}
	redirectAfterForm(w, r, withFlash("/projects/"+id, "project_saved"))
	return nil
}

// projectStatusForm handles the archive and unarchive buttons.
func (s *Server) projectStatusForm(status string) func(http.ResponseWriter, *http.Request, *principal) error {
	action := "project.archive"
	if status == db.ProjectActive {
		action = "project.unarchive"
	}
	return func(w http.ResponseWriter, r *http.Request, p *principal) error {
		ctx := r.Context()
		id := r.PathValue("id")
		a, err := s.objectAccess(ctx, p, "projects", id)
		if err != nil {
			return err
		}
		if err := s.requireManage(r, a, action, "project", id); err != nil {
			return err
		}
		if _, err := s.updateProject(ctx, r, a, id, projectChange{Status: &status}); err != nil {
			return err
		}
		redirectAfterForm(w, r, "/projects/"+id)
		return nil
	}
}

// projectFormText is a textarea's value with browser line endings normalized.
func projectFormText(r *http.Request, name string) string {
	return strings.ReplaceAll(r.PostForm.Get(name), "\r\n", "\n")
}

// projectFormBool reads a checkbox.
func projectFormBool(r *http.Request, name string) bool {
	v := r.PostForm.Get(name)
	return v == "true" || v == "on" || v == "1"
}

// projectFormValuesFrom reads the project form's fields as typed.
func projectFormValuesFrom(r *http.Request) views.ProjectFormValues {
	return views.ProjectFormValues{Name: r.PostForm.Get("name"), Key: r.PostForm.Get("key"),
		Description: projectFormText(r, "description"), DefaultMode: r.PostForm.Get("default_mode"),
		AllowTaskOverride: projectFormBool(r, "allow_task_override"), EnvironmentID: r.PostForm.Get("environment_id"),
		Strategy: r.PostForm.Get("strategy"), BranchTemplate: r.PostForm.Get("branch_template")}
}

// projectFormValuesOf fills a project form from a stored project.
func projectFormValuesOf(p db.Project) views.ProjectFormValues {
	return views.ProjectFormValues{Name: p.Name, Key: p.Key, Description: p.Description,
		DefaultMode: p.Policy.DefaultMode, AllowTaskOverride: p.Policy.AllowTaskOverride,
		EnvironmentID: p.Policy.EnvironmentID, Strategy: p.Policy.Strategy, BranchTemplate: p.Policy.BranchTemplate}
}

// projectInputFrom turns form values into the input the API also builds.
func projectInputFrom(v views.ProjectFormValues) projectInput {
	return projectInput{Name: v.Name, Key: v.Key, Description: v.Description, Policy: projectPolicyInput{
		DefaultMode: v.DefaultMode, AllowTaskOverride: v.AllowTaskOverride, EnvironmentID: v.EnvironmentID,
		Strategy: v.Strategy, BranchTemplate: v.BranchTemplate}}
}
