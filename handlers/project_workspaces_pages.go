package handlers

import (
	"context"
	"net/http"

	"berth/db"
	"berth/views"
	"berth/workspace"
)

// Project workspace pages and forms: the workspaces section of a project's page, a workspace's own
// page, and their add, edit, make-primary and delete forms.

// maxWorkspacesShown bounds the workspaces table on a project's page.
const maxWorkspacesShown = 100

// projectWorkspacesData reads the workspaces section of a project's page, with an empty add form.
func (s *Server) projectWorkspacesData(ctx context.Context, a access, proj db.Project) (views.ProjectWorkspacesData, error) {
	list, err := db.ListProjectWorkspaces(ctx, s.pool, a.Company.ID, proj.ID, "", maxWorkspacesShown+1)
	if err != nil {
		return views.ProjectWorkspacesData{}, err
	}
	d := views.ProjectWorkspacesData{ProjectID: proj.ID, Editable: a.canManage() && !proj.Archived(),
		Form: views.ProjectWorkspaceForm{ProjectID: proj.ID, Values: views.ProjectWorkspaceFormValues{SourceType: workspace.SourceGit}}}
	if len(list) > maxWorkspacesShown {
		list, d.More = list[:maxWorkspacesShown], true
	}
	for _, w := range list {
		d.Rows = append(d.Rows, views.ProjectWorkspaceRow{ID: w.ID, Name: w.Name, SourceType: w.SourceType,
			Source: w.Source, DefaultRef: w.DefaultRef, IsPrimary: w.IsPrimary, Services: len(w.Services)})
	}
	return d, nil
}

// renderProjectWorkspaces answers a workspaces-section form: htmx gets the section alone, a
// plain browser the whole project page.
func (s *Server) renderProjectWorkspaces(w http.ResponseWriter, r *http.Request, a access, proj db.Project, status int, form *views.ProjectWorkspaceForm) error {
	ctx := r.Context()
	d, err := s.projectPageData(ctx, a, proj)
	if err != nil {
		return err
	}
	if form != nil {
		d.Workspaces.Form = *form
	}
	if isHTMX(r) {
		return s.renderStatus(w, r, status, views.ProjectWorkspacesSection(d.Workspaces))
	}
	return s.renderStatus(w, r, status, views.ProjectPage(s.companyFrame(r, a, proj.Name, "projects"), d))
}

// createProjectWorkspaceForm handles the add-workspace form on a project's page: htmx gets the
// refreshed workspaces section, a plain browser goes back to the project.
func (s *Server) createProjectWorkspaceForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "projects", id, "project_workspace.create", "project")
	if err != nil {
		return err
	}
	if _, err := readForm(w, r, maxTextFormBody); err != nil {
		return err
	}
	vals := projectWorkspaceFormValuesFrom(r)
	in := projectWorkspaceInput{Name: vals.Name, SourceType: vals.SourceType, Source: vals.Source,
		DefaultRef: vals.DefaultRef, SetupCommand: vals.SetupCommand, CleanupCommand: vals.CleanupCommand,
		IsPrimary: vals.IsPrimary}
	_, err = s.createProjectWorkspace(ctx, r, a, id, in)
	he, refused := formRefusal(err)
	switch {
	case err != nil && !refused:
		return err
	case !refused && !isHTMX(r):
		http.Redirect(w, r, "/projects/"+id, http.StatusSeeOther)
		return nil
	}
	proj, err := db.ProjectByID(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	if refused {
		return s.renderProjectWorkspaces(w, r, a, proj, he.Status, &views.ProjectWorkspaceForm{ProjectID: id, Values: vals,
			Errors: formErrors(he), SourceRequest: sourceRequestOf(he)})
	}
	return s.renderProjectWorkspaces(w, r, a, proj, http.StatusOK, nil)
}

// primaryProjectWorkspaceForm handles "Make primary" on a project's workspaces table.
func (s *Server) primaryProjectWorkspaceForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "project_workspaces", id, "project_workspace.update", "project_workspace")
	if err != nil {
		return err
	}
	primary := true
	pw, err := s.updateProjectWorkspace(ctx, r, a, id, projectWorkspaceChange{IsPrimary: &primary})
	if err != nil {
		return err
	}
	if !isHTMX(r) {
		http.Redirect(w, r, "/projects/"+pw.ProjectID, http.StatusSeeOther)
		return nil
	}
	proj, err := db.ProjectByID(ctx, s.pool, a.Company.ID, pw.ProjectID)
	if err != nil {
		return err
	}
	return s.renderProjectWorkspaces(w, r, a, proj, http.StatusOK, nil)
}

// projectWorkspacePage shows one workspace with its edit form and delete button for board members.
func (s *Server) projectWorkspacePage(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.objectAccess(ctx, p, "project_workspaces", id)
	if err != nil {
		return err
	}
	d, title, err := s.projectWorkspacePageData(ctx, a, id)
	if err != nil {
		return err
	}
	return s.render(w, r, views.ProjectWorkspacePage(s.companyFrame(r, a, title, "projects"), d))
}

// projectWorkspacePageData gathers a workspace's page and an edit form filled from the row.
func (s *Server) projectWorkspacePageData(ctx context.Context, a access, id string) (views.ProjectWorkspacePageData, string, error) {
	pw, err := db.ProjectWorkspaceByID(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return views.ProjectWorkspacePageData{}, "", err
	}
	proj, err := db.ProjectByID(ctx, s.pool, a.Company.ID, pw.ProjectID)
	if err != nil {
		return views.ProjectWorkspacePageData{}, "", err
	}
	n, err := db.CountProjectWorkspaces(ctx, s.pool, a.Company.ID, pw.ProjectID)
	if err != nil {
		return views.ProjectWorkspacePageData{}, "", err
	}
	v := views.ProjectWorkspaceView{ID: pw.ID, ProjectID: proj.ID, ProjectName: proj.Name, ProjectKey: proj.Key,
		Name: pw.Name, SourceType: pw.SourceType, Source: pw.Source, DefaultRef: pw.DefaultRef,
		SetupCommand: pw.SetupCommand, CleanupCommand: pw.CleanupCommand, IsPrimary: pw.IsPrimary}
	for _, sv := range pw.Services {
		v.Services = append(v.Services, serviceRow(sv))
	}
	editable := a.canManage() && !proj.Archived()
	d := views.ProjectWorkspacePageData{Workspace: v, Archived: proj.Archived(), Editable: editable,
		Deletable: editable && (!pw.IsPrimary || n == 1),
		Form: views.ProjectWorkspaceForm{ProjectID: proj.ID, WorkspaceID: pw.ID, CurrentlyPrimary: pw.IsPrimary,
			Values: views.ProjectWorkspaceFormValues{Name: pw.Name, SourceType: pw.SourceType, Source: pw.Source,
				DefaultRef: pw.DefaultRef, SetupCommand: pw.SetupCommand, CleanupCommand: pw.CleanupCommand,
				Services: serviceFormRows(pw.Services)}}}
	return d, pw.Name, nil
}

// updateProjectWorkspaceForm handles a workspace's edit form. The primary checkbox can only
// make this workspace primary; an unchecked box changes nothing.
func (s *Server) updateProjectWorkspaceForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "project_workspaces", id, "project_workspace.update", "project_workspace")
	if err != nil {
		return err
	}
	if _, err := readForm(w, r, maxTextFormBody); err != nil {
		return err
	}
	vals := projectWorkspaceFormValuesFrom(r)
	ch := projectWorkspaceChange{Name: &vals.Name, SourceType: &vals.SourceType, Source: &vals.Source,
		DefaultRef: &vals.DefaultRef, SetupCommand: &vals.SetupCommand, CleanupCommand: &vals.CleanupCommand}
	if vals.IsPrimary {
		ch.IsPrimary = &vals.IsPrimary
	}
	sf := readServiceForm(r.PostForm)
	vals.Services = sf.Rows
	switch {
	case len(sf.Problems) > 0:
		err = invalid(sf.Problems)
	case sf.Present:
		ch.Services = &sf.Inputs
		fallthrough
	default:
		_, err = s.updateProjectWorkspace(ctx, r, a, id, ch)
	}
	if he, ok := formRefusal(err); ok {
		fields, status := formErrors(he), he.Status
		if len(sf.Problems) == 0 {
			fields = sf.rowErrors(fields) // validation keys services by input, the form by row
		}
		d, title, err := s.projectWorkspacePageData(ctx, a, id)
		if err != nil {
			return err
		}
		if !sf.Present {
			vals.Services = d.Form.Values.Services
		}
		d.Form.Values, d.Form.Errors = vals, fields
		if isHTMX(r) {
			return s.renderStatus(w, r, status, views.ProjectWorkspaceFormView(d.Form))
		}
		return s.renderStatus(w, r, status, views.ProjectWorkspacePage(s.companyFrame(r, a, title, "projects"), d))
	}
	if err != nil {
		return err
	}
	redirectAfterForm(w, r, "/project-workspaces/"+id)
	return nil
}

// deleteProjectWorkspaceForm handles a workspace's delete button; the browser goes back to the
// project.
func (s *Server) deleteProjectWorkspaceForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "project_workspaces", id, "project_workspace.delete", "project_workspace")
	if err != nil {
		return err
	}
	pw, err := s.deleteProjectWorkspace(ctx, r, a, id)
	if err != nil {
		return err
	}
	redirectAfterForm(w, r, "/projects/"+pw.ProjectID)
	return nil
}

// projectWorkspaceFormValuesFrom reads a workspace form's fields as typed.
func projectWorkspaceFormValuesFrom(r *http.Request) views.ProjectWorkspaceFormValues {
	return views.ProjectWorkspaceFormValues{Name: r.PostForm.Get("name"), SourceType: r.PostForm.Get("source_type"),
		Source: r.PostForm.Get("source"), DefaultRef: r.PostForm.Get("default_ref"),
		SetupCommand: projectFormText(r, "setup_command"), CleanupCommand: projectFormText(r, "cleanup_command"),
		IsPrimary: projectFormBool(r, "is_primary")}
}
