package db

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Task statuses, trust levels and workspace modes, as the tasks table's CHECK constraints spell them.
var (
	TaskStatuses       = []string{"todo", "in_progress", "in_review", "done", "cancelled"}
	TaskTrustLevels    = []string{"standard", "low"}
	TaskWorkspaceModes = []string{"inherit", "shared", "isolated", "reuse"}
)

// ErrTaskProjectArchived is returned when a task would be created or changed in an archived
// project: archived projects are read-only.
var ErrTaskProjectArchived = errors.New("project is archived")

// ErrTaskEnvironment is returned when a task names an environment that its company does not
// have (or that is archived); another company's environment looks exactly like a missing one.
var ErrTaskEnvironment = errors.New("environment not usable")

// Task is one unit of work in a project, with its project's key, name and status for display.
type Task struct {
	ID            string
	CompanyID     string
	ProjectID     string
	Number        int
	Key           string
	Title         string
	Description   string
	Status        string
	Command       string
	Trust         string
	WorkspaceMode string
	EnvironmentID string // "" when the task names no environment
	CreatedAt     time.Time
	UpdatedAt     time.Time

	ProjectKey    string
	ProjectName   string
	ProjectStatus string
}

// TaskFields are the values a create or an update writes; the caller has validated them.
type TaskFields struct {
	Title         string
	Description   string
	Status        string // ignored by CreateTask: new tasks are todo
	Command       string
	Trust         string
	WorkspaceMode string
	EnvironmentID string
}

// Fields returns the task's writable values.
func (t Task) Fields() TaskFields {
	return TaskFields{Title: t.Title, Description: t.Description, Status: t.Status, Command: t.Command,
		Trust: t.Trust, WorkspaceMode: t.WorkspaceMode, EnvironmentID: t.EnvironmentID}
}

// taskColumns are a task's columns (alias t) and its project's key, name and status (alias p),
// in the order taskScanTargets expects.
const taskColumns = `t.id, t.company_id, t.project_id, t.number, t.key, t.title, t.description,
		t.status, t.command, t.trust, t.workspace_mode, coalesce(t.environment_id::text, ''),
		t.created_at, t.updated_at, p.key, p.name, p.status`

// taskFrom joins tasks to their projects; every query adds its company filter.
const taskFrom = `FROM tasks t JOIN projects p ON p.company_id = t.company_id AND p.id = t.project_id`

// taskSelect reads tasks with their project.
const taskSelect = `SELECT ` + taskColumns + ` ` + taskFrom

// taskScanTargets are the destinations of taskSelect's columns, in order.
func taskScanTargets(t *Task) []any {
	return []any{&t.ID, &t.CompanyID, &t.ProjectID, &t.Number, &t.Key, &t.Title, &t.Description,
		&t.Status, &t.Command, &t.Trust, &t.WorkspaceMode, &t.EnvironmentID,
		&t.CreatedAt, &t.UpdatedAt, &t.ProjectKey, &t.ProjectName, &t.ProjectStatus}
}

func scanTask(row pgx.Row) (Task, error) {
	var t Task
	err := row.Scan(taskScanTargets(&t)...)
	return t, notFound(err)
}

// TaskByID loads one task of a company; a malformed id and another company's task are ErrNotFound.
func TaskByID(ctx context.Context, q Querier, companyID, id string) (Task, error) {
	if !validUUID(id) || !validUUID(companyID) {
		return Task{}, ErrNotFound
	}
	t, err := scanTask(q.QueryRow(ctx, taskSelect+` WHERE t.company_id = $1 AND t.id = $2`, companyID, id))
	if err != nil {
		return Task{}, fmt.Errorf("task %s: %w", id, err)
	}
	return t, nil
}

// LockTask loads a task and locks its row until the transaction ends, so that task updates and
// binding changes of one task are serialized. It also holds a key-share lock on the project, so
// an archive (which locks the project row) cannot slip in between the check and the write.
func LockTask(ctx context.Context, tx pgx.Tx, companyID, id string) (Task, error) {
	if !validUUID(id) || !validUUID(companyID) {
		return Task{}, ErrNotFound
	}
	t, err := scanTask(tx.QueryRow(ctx, taskSelect+` WHERE t.company_id = $1 AND t.id = $2
		FOR UPDATE OF t FOR KEY SHARE OF p`, companyID, id))
	if err != nil {
		return Task{}, fmt.Errorf("lock task %s: %w", id, err)
	}
	return t, nil
}

// CreateTask allocates the project's next task number and inserts the task as KEY-N in one
// statement, so concurrent creates get distinct numbers (the counter row is locked by the
// UPDATE until the transaction ends). A missing project is ErrNotFound, an archived one
// ErrTaskProjectArchived, an unusable environment ErrTaskEnvironment; none of them aborts the
// surrounding transaction.
func CreateTask(ctx context.Context, q Querier, companyID, projectID, userID string, f TaskFields) (Task, error) {
	if !validUUID(projectID) || !validUUID(companyID) {
		return Task{}, ErrNotFound
	}
	if err := CheckTaskEnvironment(ctx, q, companyID, f.EnvironmentID); err != nil {
		return Task{}, fmt.Errorf("create task: %w", err)
	}
	t, err := scanTask(q.QueryRow(ctx, `WITH p AS (
			UPDATE projects SET next_task_number = next_task_number + 1
			WHERE company_id = $1 AND id = $2 AND status = 'active'
			RETURNING company_id, id, key, name, status, next_task_number - 1 AS number
		), t AS (
			INSERT INTO tasks (company_id, project_id, number, key, title, description, command, trust,
				workspace_mode, environment_id, created_by)
			SELECT p.company_id, p.id, p.number, p.key || '-' || p.number, $3, $4, $5, $6, $7, $8::uuid, $9::uuid
			FROM p
			RETURNING *
		)
		SELECT `+taskColumns+` FROM t JOIN p ON p.id = t.project_id`,
		companyID, projectID, f.Title, f.Description, f.Command, f.Trust, f.WorkspaceMode,
		nullable(f.EnvironmentID), nullable(userID)))
	if errors.Is(err, ErrNotFound) {
		return Task{}, fmt.Errorf("create task: %w", projectWriteState(ctx, q, companyID, projectID))
	}
	if err != nil {
		return Task{}, fmt.Errorf("create task: %w", err)
	}
	return t, nil
}

// projectWriteState explains why a project took no task: it is archived, or it is not there.
func projectWriteState(ctx context.Context, q Querier, companyID, projectID string) error {
	var status string
	err := q.QueryRow(ctx, `SELECT status FROM projects WHERE company_id = $1 AND id = $2`,
		companyID, projectID).Scan(&status)
	switch {
	case err != nil:
		return notFound(err)
	case status != "active":
		return ErrTaskProjectArchived
	default:
		return fmt.Errorf("project %s took no task", projectID)
	}
}

// UpdateTask replaces a task's writable fields. The caller holds the row lock (LockTask), has
// checked the project's state and, when the environment changes, CheckTaskEnvironment.
func UpdateTask(ctx context.Context, q Querier, companyID, id string, f TaskFields) (Task, error) {
	t, err := scanTask(q.QueryRow(ctx, `WITH t AS (
			UPDATE tasks SET title = $3, description = $4, status = $5, command = $6, trust = $7,
				workspace_mode = $8, environment_id = $9::uuid, updated_at = now()
			WHERE company_id = $1 AND id = $2
			RETURNING *
		)
		SELECT `+taskColumns+` FROM t JOIN projects p ON p.company_id = t.company_id AND p.id = t.project_id`,
		companyID, id, f.Title, f.Description, f.Status, f.Command, f.Trust, f.WorkspaceMode,
		nullable(f.EnvironmentID)))
	if err != nil {
		return Task{}, fmt.Errorf("update task %s: %w", id, err)
	}
	return t, nil
}

// CheckTaskEnvironment accepts no environment, or an active environment of the company; anything
// else is ErrTaskEnvironment. A task keeps an environment that was archived after it was chosen,
// so callers check only a newly chosen one.
func CheckTaskEnvironment(ctx context.Context, q Querier, companyID, envID string) error {
	if envID == "" {
		return nil
	}
	if !validUUID(envID) {
		return ErrTaskEnvironment
	}
	var ok bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM environments
		WHERE company_id = $1 AND id = $2 AND status = 'active')`, companyID, envID).Scan(&ok)
	if err != nil {
		return fmt.Errorf("task environment: %w", err)
	}
	if !ok {
		return ErrTaskEnvironment
	}
	return nil
}

// TaskFilter narrows a project's task list. Before is the keyset cursor: only tasks with a
// smaller number (0 = from the newest).
type TaskFilter struct {
	Statuses []string
	Trust    string
	Query    string // substring of the title or key, matched case-insensitively and literally
	Before   int
	Limit    int
}

// likeEscaper makes user text match literally inside a LIKE pattern with ESCAPE '\'.
var likeEscaper = strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)

// ListTasks returns a project's tasks newest first (by number), filtered, at most f.Limit.
func ListTasks(ctx context.Context, q Querier, companyID, projectID string, f TaskFilter) ([]Task, error) {
	if !validUUID(projectID) || !validUUID(companyID) {
		return nil, ErrNotFound
	}
	pattern := ""
	if f.Query != "" {
		pattern = "%" + likeEscaper.Replace(f.Query) + "%"
	}
	statuses := f.Statuses
	if statuses == nil {
		statuses = []string{}
	}
	rows, err := q.Query(ctx, taskSelect+` WHERE t.company_id = $1 AND t.project_id = $2
			AND (cardinality($3::text[]) = 0 OR t.status = ANY ($3::text[]))
			AND ($4 = '' OR t.trust = $4)
			AND ($5 = '' OR t.title ILIKE $5 ESCAPE '\' OR t.key ILIKE $5 ESCAPE '\')
			AND ($6 = 0 OR t.number < $6)
		ORDER BY t.number DESC LIMIT $7`,
		companyID, projectID, statuses, f.Trust, pattern, f.Before, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	tasks, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Task, error) {
		var t Task
		err := r.Scan(taskScanTargets(&t)...)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	return tasks, nil
}

// TaskEnvironment is an environment as a task's settings offer it.
type TaskEnvironment struct {
	ID     string
	Name   string
	Driver string
}

// TaskEnvironments lists a company's active environments by name: the choices of a task form.
func TaskEnvironments(ctx context.Context, q Querier, companyID string) ([]TaskEnvironment, error) {
	rows, err := q.Query(ctx, `SELECT id, name, driver FROM environments
		WHERE company_id = $1 AND status = 'active' ORDER BY name, id`, companyID)
	if err != nil {
		return nil, fmt.Errorf("task environments: %w", err)
	}
	envs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TaskEnvironment, error) {
		var e TaskEnvironment
		err := r.Scan(&e.ID, &e.Name, &e.Driver)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("task environments: %w", err)
	}
	return envs, nil
}

// WorkspaceTask is a task linked to a workspace: the task that created it, or one bound to it.
type WorkspaceTask struct {
	ID     string
	Key    string
	Title  string
	Status string
	Source bool // the task whose run created the workspace
	Bound  bool // the task's binding names the workspace
}

// WorkspaceLinkedTasks lists the source task and every task bound to a workspace, by key.
func WorkspaceLinkedTasks(ctx context.Context, q Querier, companyID, workspaceID string) ([]WorkspaceTask, error) {
	if !validUUID(companyID) || !validUUID(workspaceID) {
		return nil, ErrNotFound
	}
	rows, err := q.Query(ctx, `SELECT t.id, t.key, t.title, t.status,
			coalesce(t.id = w.source_task_id, false),
			EXISTS (SELECT 1 FROM task_workspace_bindings b WHERE b.task_id = t.id AND b.execution_workspace_id = w.id)
		FROM execution_workspaces w
		JOIN tasks t ON t.company_id = w.company_id
		WHERE w.company_id = $1 AND w.id = $2
		  AND (t.id = w.source_task_id OR t.id IN (SELECT task_id FROM task_workspace_bindings WHERE execution_workspace_id = w.id))
		ORDER BY t.key, t.id`, companyID, workspaceID)
	if err != nil {
		return nil, fmt.Errorf("workspace tasks: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkspaceTask, error) {
		var t WorkspaceTask
		err := r.Scan(&t.ID, &t.Key, &t.Title, &t.Status, &t.Source, &t.Bound)
		return t, err
	})
}

// TaskLabel is a task's key and title, for lists that name tasks by id.
type TaskLabel struct {
	Key   string
	Title string
}

// TaskLabels returns the key and title of each of a company's tasks among ids (unknown or foreign
// ids are left out).
func TaskLabels(ctx context.Context, q Querier, companyID string, ids []string) (map[string]TaskLabel, error) {
	out := map[string]TaskLabel{}
	var valid []string
	for _, id := range ids {
		if validUUID(id) {
			valid = append(valid, id)
		}
	}
	if len(valid) == 0 || !validUUID(companyID) {
		return out, nil
	}
	rows, err := q.Query(ctx, `SELECT id::text, key, title FROM tasks WHERE company_id = $1 AND id = ANY($2::uuid[])`, companyID, valid)
	if err != nil {
		return nil, fmt.Errorf("task labels: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var l TaskLabel
		if err := rows.Scan(&id, &l.Key, &l.Title); err != nil {
			return nil, fmt.Errorf("task labels: %w", err)
		}
		out[id] = l
	}
	return out, rows.Err()
}
