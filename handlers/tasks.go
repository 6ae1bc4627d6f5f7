package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/views"
	"berth/workspace"
)

// Task field limits, as the tasks table's CHECK constraints state them (in characters).
const (
	maxTaskTitle       = 300
	maxTaskDescription = 100000
	maxTaskCommand     = 10000
	maxTaskQuery       = 200
)

// taskJSON is a task in the JSON API.
type taskJSON struct {
	ID            string    `json:"id"`
	ProjectID     string    `json:"project_id"`
	Key           string    `json:"key"`
	Number        int       `json:"number"`
	Title         string    `json:"title"`
	Description   string    `json:"description"`
	Status        string    `json:"status"`
	Command       string    `json:"command"`
	Trust         string    `json:"trust"`
	WorkspaceMode string    `json:"workspace_mode"`
	EnvironmentID *string   `json:"environment_id"`
	CreatedAt     time.Time `json:"created_at"`
	UpdatedAt     time.Time `json:"updated_at"`
}

func newTaskJSON(t db.Task) taskJSON {
	return taskJSON{ID: t.ID, ProjectID: t.ProjectID, Key: t.Key, Number: t.Number, Title: t.Title,
		Description: t.Description, Status: t.Status, Command: t.Command, Trust: t.Trust,
		WorkspaceMode: t.WorkspaceMode, EnvironmentID: taskNullable(t.EnvironmentID),
		CreatedAt: t.CreatedAt.UTC(), UpdatedAt: t.UpdatedAt.UTC()}
}

// taskNullable is an id for JSON: null when empty.
func taskNullable(id string) *string {
	if id == "" {
		return nil
	}
	return &id
}

// validateTask checks a task's complete set of values and returns one message per bad field.
func validateTask(f db.TaskFields) map[string]string {
	errs := map[string]string{}
	taskTextProblem(errs, "title", f.Title, maxTaskTitle, true)
	taskTextProblem(errs, "description", f.Description, maxTaskDescription, false)
	taskTextProblem(errs, "command", f.Command, maxTaskCommand, false)
	if !slices.Contains(db.TaskStatuses, f.Status) {
		errs["status"] = "Must be one of " + strings.Join(db.TaskStatuses, ", ") + "."
	}
	if !slices.Contains(db.TaskTrustLevels, f.Trust) {
		errs["trust"] = "Must be standard or low."
	}
	if !slices.Contains(db.TaskWorkspaceModes, f.WorkspaceMode) {
		errs["workspace_mode"] = "Must be one of " + strings.Join(db.TaskWorkspaceModes, ", ") + "."
	}
	if f.EnvironmentID != "" && !db.ValidID(f.EnvironmentID) {
		errs["environment_id"] = taskEnvironmentMessage
	}
	return errs
}

const taskEnvironmentMessage = "Choose an active environment of this company, or none."

// taskTextProblem checks one free-text value: valid UTF-8 without NUL, within max characters, and
// present when required.
func taskTextProblem(errs map[string]string, name, v string, max int, required bool) {
	switch {
	case !utf8.ValidString(v) || strings.ContainsRune(v, 0):
		errs[name] = "Contains characters that cannot be stored."
	case required && strings.TrimSpace(v) == "":
		errs[name] = "Required."
	case utf8.RuneCountInString(v) > max:
		errs[name] = "At most " + strconv.Itoa(max) + " characters."
	}
}

// newTaskFields fills a new task's defaults: status todo, standard trust, inherited mode.
func newTaskFields(f db.TaskFields) db.TaskFields {
	f.Title = strings.TrimSpace(f.Title)
	f.Status = "todo"
	if f.Trust == "" {
		f.Trust = "standard"
	}
	if f.WorkspaceMode == "" {
		f.WorkspaceMode = "inherit"
	}
	f.EnvironmentID = strings.ToLower(f.EnvironmentID)
	return f
}

// taskWriteError turns the db refusals of a task write into what the caller sees.
func taskWriteError(err error) error {
	switch {
	case errors.Is(err, db.ErrTaskProjectArchived):
		return errTaskProjectArchived
	case errors.Is(err, db.ErrTaskEnvironment):
		return invalid(map[string]string{"environment_id": taskEnvironmentMessage})
	}
	return err
}

// errTaskProjectArchived refuses changes to the tasks of an archived project.
var errTaskProjectArchived = &httpError{Status: http.StatusConflict, Code: "project_archived",
	Message: "The project is archived; its tasks are read-only."}

// createTask validates and inserts a task as the next KEY-N of the project, with its audit
// event, in one transaction. The caller has checked that a may manage the project.
func (s *Server) createTask(ctx context.Context, r *http.Request, a access, projectID string, f db.TaskFields) (db.Task, error) {
	f = newTaskFields(f)
	if errs := validateTask(f); len(errs) > 0 {
		return db.Task{}, invalid(errs)
	}
	var t db.Task
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		if t, err = db.CreateTask(ctx, tx, a.Company.ID, projectID, a.P.User.ID, f); err != nil {
			return taskWriteError(err)
		}
		return s.auditTx(ctx, tx, r, a, "task.created", "task", t.ID,
			map[string]any{"key": t.Key, "project_id": projectID, "title": t.Title})
	})
	return t, err
}

// updateTask applies change to a task's current values under the task's row lock, validates the
// result and writes it with its audit event. A change that changes nothing writes nothing.
func (s *Server) updateTask(ctx context.Context, r *http.Request, a access, id string, change func(*db.TaskFields)) (db.Task, error) {
	var t db.Task
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		cur, err := db.LockTask(ctx, tx, a.Company.ID, id)
		if err != nil {
			return err
		}
		if cur.ProjectStatus != db.ProjectActive {
			return errTaskProjectArchived
		}
		f := cur.Fields()
		change(&f)
		f.Title = strings.TrimSpace(f.Title)
		f.EnvironmentID = strings.ToLower(f.EnvironmentID)
		if errs := validateTask(f); len(errs) > 0 {
			return invalid(errs)
		}
		diff := taskDiff(cur.Fields(), f)
		if len(diff) == 0 {
			t = cur
			return nil
		}
		if f.EnvironmentID != cur.EnvironmentID {
			if err := db.CheckTaskEnvironment(ctx, tx, a.Company.ID, f.EnvironmentID); err != nil {
				return taskWriteError(err)
			}
		}
		if t, err = db.UpdateTask(ctx, tx, a.Company.ID, id, f); err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "task.updated", "task", id, map[string]any{"key": t.Key, "changes": diff})
	})
	return t, err
}

// taskDiff describes what an update changes, for the audit trail: from/to values for the short
// fields, and only the names of free-text fields (a command may hold something sensitive).
func taskDiff(from, to db.TaskFields) map[string]any {
	d := map[string]any{}
	pair := func(name, a, b string) {
		if a != b {
			d[name] = map[string]string{"from": a, "to": b}
		}
	}
	pair("title", from.Title, to.Title)
	pair("status", from.Status, to.Status)
	pair("trust", from.Trust, to.Trust)
	pair("workspace_mode", from.WorkspaceMode, to.WorkspaceMode)
	pair("environment_id", from.EnvironmentID, to.EnvironmentID)
	if from.Description != to.Description {
		d["description"] = "changed"
	}
	if from.Command != to.Command {
		d["command"] = "changed"
	}
	return d
}

// taskCreateRequest is the body of POST /api/projects/{id}/tasks.
type taskCreateRequest struct {
	Title         string  `json:"title"`
	Description   string  `json:"description"`
	Command       string  `json:"command"`
	Trust         string  `json:"trust"`
	WorkspaceMode string  `json:"workspace_mode"`
	EnvironmentID *string `json:"environment_id"`
}

// createTaskAPI creates a task in a project (board members): 201 with the task.
func (s *Server) createTaskAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx, projectID := r.Context(), r.PathValue("id")
	a, err := s.manageObject(r, p, "projects", projectID, "task.create", "project")
	if err != nil {
		return err
	}
	var in taskCreateRequest
	if err := decodeJSON(w, r, &in); err != nil {
		return err
	}
	f := db.TaskFields{Title: in.Title, Description: in.Description, Command: in.Command, Trust: in.Trust,
		WorkspaceMode: in.WorkspaceMode}
	if in.EnvironmentID != nil {
		f.EnvironmentID = *in.EnvironmentID
	}
	t, err := s.createTask(ctx, r, a, projectID, f)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/api/tasks/"+t.ID)
	writeJSON(w, http.StatusCreated, newTaskJSON(t))
	return nil
}

// taskField is one member of a PATCH body: whether it was named, and whether it was null.
type taskField[T any] struct {
	Set   bool
	Null  bool
	Value T
}

// UnmarshalJSON records that the member was present (encoding/json calls it for null too).
func (f *taskField[T]) UnmarshalJSON(b []byte) error {
	f.Set = true
	if string(b) == "null" {
		f.Null = true
		return nil
	}
	return json.Unmarshal(b, &f.Value)
}

// taskPatchRequest is the body of PATCH /api/tasks/{id}: it replaces the fields it names. The
// identity fields are declared only to refuse them with a clear message.
type taskPatchRequest struct {
	Title         taskField[string] `json:"title"`
	Description   taskField[string] `json:"description"`
	Status        taskField[string] `json:"status"`
	Command       taskField[string] `json:"command"`
	Trust         taskField[string] `json:"trust"`
	WorkspaceMode taskField[string] `json:"workspace_mode"`
	EnvironmentID taskField[string] `json:"environment_id"` // null clears it

	ID        json.RawMessage `json:"id"`
	Key       json.RawMessage `json:"key"`
	Number    json.RawMessage `json:"number"`
	ProjectID json.RawMessage `json:"project_id"`
	CompanyID json.RawMessage `json:"company_id"`
	CreatedAt json.RawMessage `json:"created_at"`
	UpdatedAt json.RawMessage `json:"updated_at"`
}

// check refuses server-owned members (400) and nulls for fields that cannot be empty (422).
func (in taskPatchRequest) check() error {
	for name, v := range map[string]json.RawMessage{"id": in.ID, "key": in.Key, "number": in.Number,
		"project_id": in.ProjectID, "company_id": in.CompanyID, "created_at": in.CreatedAt, "updated_at": in.UpdatedAt} {
		if v != nil {
			return badRequest("immutable_field", "The field "+name+" cannot be changed.")
		}
	}
	errs := map[string]string{}
	for name, null := range map[string]bool{"title": in.Title.Null, "description": in.Description.Null,
		"status": in.Status.Null, "command": in.Command.Null, "trust": in.Trust.Null, "workspace_mode": in.WorkspaceMode.Null} {
		if null {
			errs[name] = "Must not be null."
		}
	}
	if len(errs) > 0 {
		return invalid(errs)
	}
	return nil
}

// apply replaces the named fields of f.
func (in taskPatchRequest) apply(f *db.TaskFields) {
	set := func(p taskField[string], dst *string) {
		if p.Set {
			*dst = p.Value
		}
	}
	set(in.Title, &f.Title)
	set(in.Description, &f.Description)
	set(in.Status, &f.Status)
	set(in.Command, &f.Command)
	set(in.Trust, &f.Trust)
	set(in.WorkspaceMode, &f.WorkspaceMode)
	set(in.EnvironmentID, &f.EnvironmentID)
}

// patchTaskAPI changes the fields a board member names; status moves freely among the five.
func (s *Server) patchTaskAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx, id := r.Context(), r.PathValue("id")
	a, err := s.manageObject(r, p, "tasks", id, "task.update", "task")
	if err != nil {
		return err
	}
	var in taskPatchRequest
	if err := decodeJSON(w, r, &in); err != nil {
		return err
	}
	if err := in.check(); err != nil {
		return err
	}
	t, err := s.updateTask(ctx, r, a, id, in.apply)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, newTaskJSON(t))
	return nil
}

// taskCursor is the keyset position of a task list page: the number of its last task.
type taskCursor struct {
	Number int `json:"n"`
}

// taskQuery is a task list request: the filters, the page size and the position.
type taskQuery struct {
	Statuses []string
	Trust    string
	Query    string
	Limit    int
	Before   int
}

// parseTaskQuery reads `status` (one or a comma list, repeatable), `trust`, `q`, `limit` and
// `cursor`; anything malformed is a 400.
func parseTaskQuery(r *http.Request) (taskQuery, error) {
	v := r.URL.Query()
	var q taskQuery
	for _, raw := range v["status"] {
		for st := range strings.SplitSeq(raw, ",") {
			st = strings.TrimSpace(st)
			switch {
			case st == "":
			case !slices.Contains(db.TaskStatuses, st):
				return taskQuery{}, badRequest("bad_filter", "status must be one or more of "+strings.Join(db.TaskStatuses, ", ")+".")
			case !slices.Contains(q.Statuses, st):
				q.Statuses = append(q.Statuses, st)
			}
		}
	}
	q.Trust = strings.TrimSpace(v.Get("trust"))
	if q.Trust != "" && !slices.Contains(db.TaskTrustLevels, q.Trust) {
		return taskQuery{}, badRequest("bad_filter", "trust must be standard or low.")
	}
	q.Query = strings.TrimSpace(v.Get("q"))
	if !utf8.ValidString(q.Query) || strings.ContainsRune(q.Query, 0) || utf8.RuneCountInString(q.Query) > maxTaskQuery {
		return taskQuery{}, badRequest("bad_filter", "q must be text of at most 200 characters.")
	}
	limit, cursor, err := pageParams(r)
	if err != nil {
		return taskQuery{}, err
	}
	q.Limit = limit
	var c taskCursor
	if err := decodeCursor(cursor, &c); err != nil {
		return taskQuery{}, err
	}
	if cursor != "" && c.Number <= 0 {
		return taskQuery{}, badRequest("bad_cursor", "The cursor is not valid; start again without it.")
	}
	q.Before = c.Number
	return q, nil
}

// values is the query string of q's filters (without the page position).
func (q taskQuery) values() url.Values {
	v := url.Values{}
	if len(q.Statuses) > 0 {
		v.Set("status", strings.Join(q.Statuses, ","))
	}
	if q.Trust != "" {
		v.Set("trust", q.Trust)
	}
	if q.Query != "" {
		v.Set("q", q.Query)
	}
	return v
}

// listTasks returns one page of a project's tasks and the cursor of the next page ("" at the end).
func (s *Server) listTasks(ctx context.Context, a access, projectID string, q taskQuery) ([]db.Task, string, error) {
	tasks, err := db.ListTasks(ctx, s.pool, a.Company.ID, projectID, db.TaskFilter{
		Statuses: q.Statuses, Trust: q.Trust, Query: q.Query, Before: q.Before, Limit: q.Limit + 1})
	if err != nil {
		return nil, "", err
	}
	if len(tasks) <= q.Limit {
		return tasks, "", nil
	}
	tasks = tasks[:q.Limit]
	return tasks, encodeCursor(taskCursor{Number: tasks[len(tasks)-1].Number}), nil
}

// listTasksAPI lists a project's tasks, newest first, filtered and paginated.
func (s *Server) listTasksAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx, projectID := r.Context(), r.PathValue("id")
	a, err := s.objectAccess(ctx, p, "projects", projectID)
	if err != nil {
		return err
	}
	q, err := parseTaskQuery(r)
	if err != nil {
		return err
	}
	tasks, next, err := s.listTasks(ctx, a, projectID, q)
	if err != nil {
		return err
	}
	out := listResponse[taskJSON]{Items: make([]taskJSON, 0, len(tasks)), NextCursor: next}
	for _, t := range tasks {
		out.Items = append(out.Items, newTaskJSON(t))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// taskFormValues reads a urlencoded form of at most 1 MiB.
func taskFormValues(w http.ResponseWriter, r *http.Request) (url.Values, error) {
	r.Body = http.MaxBytesReader(w, r.Body, maxJSONBody)
	if err := r.ParseForm(); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &httpError{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large", Message: "The form is larger than 1 MiB."}
		}
		return nil, badRequest("bad_form", "The form could not be read.")
	}
	return r.PostForm, nil
}

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
	return s.companyFrame(r, a, t.Key+" · "+t.Title, "projects")
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
	d, err := s.taskListData(ctx, a, project, q, !fragment)
	if err != nil {
		return err
	}
	if fragment {
		return s.render(w, r, views.TaskList(d))
	}
	return s.render(w, r, views.TaskListPage(s.companyFrame(r, a, "Tasks · "+project.Name, "projects"), d))
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
	form, err := taskFormValues(w, r)
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
		d.Form.Errors = fields
		return s.renderStatus(w, r, http.StatusUnprocessableEntity,
			views.TaskListPage(s.companyFrame(r, a, "Tasks · "+project.Name, "projects"), d))
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
	}
	return d, nil
}

// taskPage is one task: details, the effective plan with its trace, the binding, the edit form.
func (s *Server) taskPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx, id := r.Context(), r.PathValue("id")
	a, err := s.objectAccess(ctx, p, "tasks", id)
	if err != nil {
		return err
	}
	snap, err := db.LoadPlanSnapshot(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
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
	form, err := taskFormValues(w, r)
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
		d.Edit.Errors = fields
		return s.renderStatus(w, r, http.StatusUnprocessableEntity, views.TaskPage(s.taskFrame(r, a, snap.Task), d))
	case err != nil:
		return err
	}
	http.Redirect(w, r, "/tasks/"+id, http.StatusSeeOther)
	return nil
}
