package handlers

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"berth/db"
)

// Task field limits, as the tasks table's CHECK constraints state them (in characters).
const (
	maxTaskTitle       = 300
	maxTaskDescription = 100000
	maxTaskCommand     = 10000
	maxTaskQuery       = 200
)

// validateTask checks a task's complete set of values and returns one message per bad field.
func validateTask(f db.TaskFields) map[string]string {
	errs := map[string]string{}
	taskTextProblem(errs, "title", f.Title, maxTaskTitle, true)
	taskTextProblem(errs, "description", f.Description, maxTaskDescription, false)
	taskTextProblem(errs, "command", f.Command, maxTaskCommand, false)
	if _, bad := errs["title"]; !bad {
		if msg := textProblem(f.Title); msg != "" {
			errs["title"] = "The title " + msg + "."
		}
	}
	if _, bad := errs["description"]; !bad {
		if msg := descriptionProblem(f.Description); msg != "" {
			errs["description"] = "The description " + msg + "."
		}
	}
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
