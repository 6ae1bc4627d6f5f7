package handlers

import (
	"encoding/json"
	"net/http"
	"time"

	"berth/db"
)

// Tasks in the JSON API: the task object, the create and PATCH bodies, and the handlers.

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
		WorkspaceMode: t.WorkspaceMode, EnvironmentID: optional(t.EnvironmentID),
		CreatedAt: t.CreatedAt.UTC(), UpdatedAt: t.UpdatedAt.UTC()}
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
