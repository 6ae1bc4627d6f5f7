package handlers

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"berth/db"
	"berth/views"
	"berth/workspace"
)

// Task pages and forms: a project's task list with the create form, and a task's page (details,
// plan, binding, runs, files) with its edit form.

// taskFieldsFromForm reads the task form; the form always sends every field.
func taskFieldsFromForm(v url.Values) db.TaskFields {
	return db.TaskFields{Title: v.Get("title"), Description: v.Get("description"), Status: v.Get("status"),
		Command: v.Get("command"), Trust: v.Get("trust"), WorkspaceMode: v.Get("workspace_mode"),
		EnvironmentID: v.Get("environment_id")}
}

// taskFormData fills a task form with values and environment choices.
func taskFormData(id, action string, edit bool, f db.TaskFields, envs []views.TaskOption) views.TaskFormData {
	return views.TaskFormData{ID: id, Action: action, Edit: edit, Title: f.Title, Description: f.Description,
		Command: f.Command, Status: f.Status, Trust: f.Trust, WorkspaceMode: f.WorkspaceMode,
		EnvironmentID: f.EnvironmentID, Environments: envs}
}

// taskEnvironmentOptions are the environment choices of a task form; current is an environment the
// task already names, offered even when it is no longer active.
func taskEnvironmentOptions(envs []db.TaskEnvironment, current views.TaskOption) []views.TaskOption {
	opts := make([]views.TaskOption, 0, len(envs)+1)
	seen := false
	for _, e := range envs {
		opts = append(opts, views.TaskOption{Value: e.ID, Label: e.Name + " (" + e.Driver + ")"})
		seen = seen || e.ID == current.Value
	}
	if current.Value != "" && !seen {
		opts = append(opts, current)
	}
	return opts
}

// taskFrame is the page frame of a task's pages.
func (s *Server) taskFrame(r *http.Request, a access, t db.Task) views.Frame {
	return s.projectFrame(r, a, t.ProjectID, t.Key+" · "+t.Title)
}

// taskListData builds a project's task list page: one page of tasks and, when withForm is set,
// for board members of an active project, an empty create form.
func (s *Server) taskListData(ctx context.Context, a access, project db.Project, q taskQuery, withForm bool) (views.TaskListData, error) {
	tasks, next, err := s.listTasks(ctx, a, project.ID, q)
	if err != nil {
		return views.TaskListData{}, err
	}
	d := views.TaskListData{ProjectID: project.ID, ProjectName: project.Name, ProjectKey: project.Key,
		Archived: project.Archived(), CanManage: a.canManage() && !project.Archived(),
		Statuses: q.Statuses, Trust: q.Trust, Query: q.Query,
		Filtered: len(q.Statuses) > 0 || q.Trust != "" || q.Query != ""}
	for _, t := range tasks {
		d.Rows = append(d.Rows, views.TaskRow{ID: t.ID, Key: t.Key, Title: t.Title, Status: t.Status, Trust: t.Trust, Mode: t.WorkspaceMode})
	}
	if next != "" {
		v := q.values()
		if q.Limit != defaultPageLimit {
			v.Set("limit", strconv.Itoa(q.Limit))
		}
		v.Set("cursor", next)
		d.NextURL = "/projects/" + project.ID + "/tasks?" + v.Encode()
	}
	if d.CanManage && withForm {
		envs, err := db.TaskEnvironments(ctx, s.pool, a.Company.ID)
		if err != nil {
			return views.TaskListData{}, err
		}
		d.Form = taskFormData("new-task", "/projects/"+project.ID+"/tasks", false,
			newTaskFields(db.TaskFields{}), taskEnvironmentOptions(envs, views.TaskOption{}))
		d.Form.ProjectID, d.Form.OverridesOff = project.ID, !project.Policy.AllowTaskOverride
	}
	return d, nil
}

// projectForTasks authorizes the caller for a project and loads it.
func (s *Server) projectForTasks(ctx context.Context, p *principal, id string) (access, db.Project, error) {
	a, err := s.objectAccess(ctx, p, "projects", id)
	if err != nil {
		return access{}, db.Project{}, err
	}
	project, err := db.ProjectByID(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return access{}, db.Project{}, err
	}
	return a, project, nil
}

// taskListPage is a project's task list; htmx filter and paging requests get the list alone.
func (s *Server) taskListPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	a, project, err := s.projectForTasks(ctx, p, r.PathValue("id"))
	if err != nil {
		return err
	}
	q, err := parseTaskQuery(r)
	if err != nil {
		return err
	}
	w.Header().Set("Vary", "HX-Request")
	fragment := taskFragmentRequest(r)
	r = s.live(r, "company", a.Company.ID, "topic", "task") // the list follows its company's tasks (docs/live.md)
	d, err := s.taskListData(ctx, a, project, q, !fragment)
	if err != nil {
		return err
	}
	d.SelfURL = r.URL.RequestURI()
	if fragment {
		// The project page's section (loaded into #tasks, re-read with embedded=1), not the list's
		// own page with its filters.
		d.Embedded = r.Header.Get("HX-Target") == "tasks" || r.URL.Query().Get("embedded") == "1"
		if d.Embedded && r.URL.Query().Get("embedded") == "" {
			d.SelfURL = taskListEmbeddedURL(r)
		}
		return s.render(w, r, views.TaskList(d))
	}
	return s.render(w, r, views.TaskListPage(s.projectFrame(r, a, project.ID, "Tasks · "+project.Name), d))
}

// createTaskForm creates a task from the list page's form and goes to its page; a refused form
// is shown again with its values and messages (422).
func (s *Server) createTaskForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	a, project, err := s.projectForTasks(ctx, p, r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := s.requireManage(r, a, "task.create", "project", project.ID); err != nil {
		return err
	}
	form, err := readForm(w, r, maxTextFormBody)
	if err != nil {
		return err
	}
	f := taskFieldsFromForm(form)
	t, err := s.createTask(ctx, r, a, project.ID, f)
	fields, refused := asValidation(err)
	switch {
	case refused:
		d, err := s.taskListData(ctx, a, project, taskQuery{Limit: defaultPageLimit}, true)
		if err != nil {
			return err
		}
		d.Form = taskFormData("new-task", "/projects/"+project.ID+"/tasks", false, f, d.Form.Environments)
		d.Form.ProjectID, d.Form.OverridesOff = project.ID, !project.Policy.AllowTaskOverride
		d.Form.Errors = fields
		return s.renderStatus(w, r, http.StatusUnprocessableEntity,
			views.TaskListPage(s.projectFrame(r, a, project.ID, "Tasks · "+project.Name), d))
	case err != nil:
		return err
	}
	http.Redirect(w, r, "/tasks/"+t.ID, http.StatusSeeOther)
	return nil
}

// taskPageData builds the task page from one plan snapshot: details, plan, binding and (for
// board members of an active project) the edit form.
func (s *Server) taskPageData(ctx context.Context, a access, snap db.PlanSnapshot) (views.TaskPageData, error) {
	t := snap.Task
	active := t.ProjectStatus == db.ProjectActive
	d := views.TaskPageData{Archived: !active, CanManage: a.canManage() && active,
		Plan: planView(snap, workspace.ResolvePlan(planInput(snap)))}
	d.Task = views.TaskDetail{ID: t.ID, Key: t.Key, Title: t.Title, Description: t.Description, Status: t.Status,
		Command: t.Command, Trust: t.Trust, WorkspaceMode: t.WorkspaceMode, ProjectID: t.ProjectID,
		ProjectName: t.ProjectName, CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt}
	current := views.TaskOption{}
	if t.EnvironmentID != "" {
		current = views.TaskOption{Value: t.EnvironmentID, Label: "unavailable environment"}
		for _, e := range snap.Environments {
			if e.ID == t.EnvironmentID {
				current.Label = e.Name + " (" + e.Driver + ", " + e.Status + ")"
			}
		}
		d.Task.Environment = current.Label
	}
	b, err := s.bindingView(ctx, a, snap)
	if err != nil {
		return views.TaskPageData{}, err
	}
	d.Binding = b
	if d.Runs, err = s.taskRunsData(ctx, a, t.ID, snap); err != nil {
		return views.TaskPageData{}, err
	}
	if d.Files, err = s.fileBrowserIntro(ctx, a, t.ID); err != nil {
		return views.TaskPageData{}, err
	}
	if d.CanManage {
		envs, err := db.TaskEnvironments(ctx, s.pool, a.Company.ID)
		if err != nil {
			return views.TaskPageData{}, err
		}
		d.Edit = taskFormData("edit-task", "/tasks/"+t.ID, true, t.Fields(), taskEnvironmentOptions(envs, current))
		d.Edit.ProjectID, d.Edit.OverridesOff = t.ProjectID, !snap.Policy.AllowTaskOverride
	}
	return d, nil
}

// taskPage is one task: details, the effective plan with its trace, the binding, the edit form.
func (s *Server) taskPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx, id := r.Context(), r.PathValue("id")
	r = s.live(r, "task", id) // its runs panel and plan follow the task (events_pages.go)
	a, err := s.objectAccess(ctx, p, "tasks", id)
	if err != nil {
		return err
	}
	snap, err := db.LoadPlanSnapshot(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	if taskFragmentRequest(r) && r.URL.Query().Get("fragment") == "runs" { // re-fetched on a run event
		d, err := s.taskRunsData(ctx, a, id, snap)
		if err != nil {
			return err
		}
		return s.render(w, r, views.TaskRunsPanel(d))
	}
	d, err := s.taskPageData(ctx, a, snap)
	if err != nil {
		return err
	}
	return s.render(w, r, views.TaskPage(s.taskFrame(r, a, snap.Task), d))
}

// updateTaskForm saves the task page's edit form (every field) and returns to the task page; a
// refused form is shown again with its values and messages (422).
func (s *Server) updateTaskForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx, id := r.Context(), r.PathValue("id")
	a, err := s.manageObject(r, p, "tasks", id, "task.update", "task")
	if err != nil {
		return err
	}
	form, err := readForm(w, r, maxTextFormBody)
	if err != nil {
		return err
	}
	f := taskFieldsFromForm(form)
	_, err = s.updateTask(ctx, r, a, id, func(cur *db.TaskFields) { *cur = f })
	fields, refused := asValidation(err)
	switch {
	case refused:
		snap, err := db.LoadPlanSnapshot(ctx, s.pool, a.Company.ID, id)
		if err != nil {
			return err
		}
		d, err := s.taskPageData(ctx, a, snap)
		if err != nil {
			return err
		}
		d.Edit = taskFormData("edit-task", "/tasks/"+id, true, f, d.Edit.Environments)
		d.Edit.ProjectID, d.Edit.OverridesOff = snap.Task.ProjectID, !snap.Policy.AllowTaskOverride
		d.Edit.Errors = fields
		return s.renderStatus(w, r, http.StatusUnprocessableEntity, views.TaskPage(s.taskFrame(r, a, snap.Task), d))
	case err != nil:
		return err
	}
	http.Redirect(w, r, withFlash("/tasks/"+id, "task_saved"), http.StatusSeeOther)
	return nil
}

// taskListEmbeddedURL is the URL the project page's task section re-reads itself from.
func taskListEmbeddedURL(r *http.Request) string {
	v := r.URL.Query()
	v.Set("embedded", "1")
	return r.URL.Path + "?" + v.Encode()
}
