package db

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Project statuses.
const (
	ProjectActive   = "active"
	ProjectArchived = "archived"
)

// ExecutionPolicy is a project's execution policy as stored in projects.execution_policy, with
// every default filled. Its fields match workspace.ProjectPolicy one for one, so callers convert
// with workspace.ProjectPolicy(p.Policy). EnvironmentID is "" when no environment is set (stored
// as JSON null).
type ExecutionPolicy struct {
	DefaultMode       string
	AllowTaskOverride bool
	EnvironmentID     string
	Strategy          string
	BranchTemplate    string
}

// storedPolicy is the JSON form of ExecutionPolicy in the database.
type storedPolicy struct {
	DefaultMode       string  `json:"default_mode"`
	AllowTaskOverride bool    `json:"allow_task_override"`
	EnvironmentID     *string `json:"environment_id"`
	Strategy          string  `json:"strategy"`
	BranchTemplate    string  `json:"branch_template"`
}

func (p ExecutionPolicy) stored() ([]byte, error) {
	s := storedPolicy{DefaultMode: p.DefaultMode, AllowTaskOverride: p.AllowTaskOverride,
		Strategy: p.Strategy, BranchTemplate: p.BranchTemplate}
	if p.EnvironmentID != "" {
		s.EnvironmentID = &p.EnvironmentID
	}
	return json.Marshal(s)
}

func loadPolicy(b []byte) (ExecutionPolicy, error) {
	var s storedPolicy
	if err := json.Unmarshal(b, &s); err != nil {
		return ExecutionPolicy{}, fmt.Errorf("execution policy: %w", err)
	}
	p := ExecutionPolicy{DefaultMode: s.DefaultMode, AllowTaskOverride: s.AllowTaskOverride,
		Strategy: s.Strategy, BranchTemplate: s.BranchTemplate}
	if s.EnvironmentID != nil {
		p.EnvironmentID = *s.EnvironmentID
	}
	return p, nil
}

// Project groups a company's tasks under one key and one execution policy.
type Project struct {
	ID          string
	CompanyID   string
	Name        string
	Key         string
	Description string
	Status      string
	Policy      ExecutionPolicy
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// Archived reports whether the project is read-only.
func (p Project) Archived() bool { return p.Status == ProjectArchived }

// ProjectFields are the values a create or an update writes; the caller has validated them.
type ProjectFields struct {
	Name        string
	Key         string // used by CreateProject only: keys never change
	Description string
	Status      string // used by UpdateProject only; new projects are active
	Policy      ExecutionPolicy
}

const projectColumns = `id, company_id, name, key, description, status, execution_policy, created_at, updated_at`

func scanProject(row pgx.Row) (Project, error) {
	var (
		p      Project
		policy []byte
	)
	if err := row.Scan(&p.ID, &p.CompanyID, &p.Name, &p.Key, &p.Description, &p.Status, &policy,
		&p.CreatedAt, &p.UpdatedAt); err != nil {
		return Project{}, notFound(err)
	}
	pol, err := loadPolicy(policy)
	if err != nil {
		return Project{}, err
	}
	p.Policy = pol
	return p, nil
}

// ProjectByID loads one project of a company; a missing id, a malformed id and another
// company's project are all ErrNotFound.
func ProjectByID(ctx context.Context, q Querier, companyID, id string) (Project, error) {
	if !validUUID(id) || !validUUID(companyID) {
		return Project{}, ErrNotFound
	}
	p, err := scanProject(q.QueryRow(ctx, `SELECT `+projectColumns+` FROM projects
		WHERE company_id = $1 AND id = $2`, companyID, id))
	if err != nil {
		return Project{}, fmt.Errorf("project %s: %w", id, err)
	}
	return p, nil
}

// LockProject loads a project and locks its row until the transaction ends. Every write to a
// project or its workspaces takes this lock first, so archive checks and primary flips are
// serialized per project.
func LockProject(ctx context.Context, tx pgx.Tx, companyID, id string) (Project, error) {
	if !validUUID(id) || !validUUID(companyID) {
		return Project{}, ErrNotFound
	}
	p, err := scanProject(tx.QueryRow(ctx, `SELECT `+projectColumns+` FROM projects
		WHERE company_id = $1 AND id = $2 FOR UPDATE`, companyID, id))
	if err != nil {
		return Project{}, fmt.Errorf("lock project %s: %w", id, err)
	}
	return p, nil
}

// CreateProject inserts an active project; a key already used in the company is ErrConflict
// (without aborting the surrounding transaction).
func CreateProject(ctx context.Context, q Querier, companyID string, f ProjectFields) (Project, error) {
	policy, err := f.Policy.stored()
	if err != nil {
		return Project{}, fmt.Errorf("create project: %w", err)
	}
	p, err := scanProject(q.QueryRow(ctx, `INSERT INTO projects (company_id, name, key, description, execution_policy)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (company_id, key) DO NOTHING
		RETURNING `+projectColumns, companyID, f.Name, f.Key, f.Description, policy))
	switch {
	case errors.Is(err, ErrNotFound):
		return Project{}, fmt.Errorf("create project %s: %w", f.Key, ErrConflict)
	case err != nil:
		return Project{}, fmt.Errorf("create project: %w", err)
	}
	return p, nil
}

// UpdateProject replaces a project's name, description, status and policy (never its key).
func UpdateProject(ctx context.Context, q Querier, companyID, id string, f ProjectFields) (Project, error) {
	policy, err := f.Policy.stored()
	if err != nil {
		return Project{}, fmt.Errorf("update project: %w", err)
	}
	p, err := scanProject(q.QueryRow(ctx, `UPDATE projects
		SET name = $3, description = $4, status = $5, execution_policy = $6, updated_at = now()
		WHERE company_id = $1 AND id = $2
		RETURNING `+projectColumns, companyID, id, f.Name, f.Description, f.Status, policy))
	if err != nil {
		return Project{}, fmt.Errorf("update project %s: %w", id, err)
	}
	return p, nil
}

// ProjectSummary is a project with the counts its list row shows.
type ProjectSummary struct {
	Project
	Workspaces int
	Tasks      int
}

// ListProjects returns up to limit projects of a company ordered by key, starting after the key
// afterKey ("" for the first page); status "" lists every status.
func ListProjects(ctx context.Context, q Querier, companyID, status, afterKey string, limit int) ([]ProjectSummary, error) {
	rows, err := q.Query(ctx, `SELECT p.id, p.company_id, p.name, p.key, p.description, p.status,
			p.execution_policy, p.created_at, p.updated_at,
			(SELECT count(*) FROM project_workspaces w WHERE w.company_id = p.company_id AND w.project_id = p.id),
			(SELECT count(*) FROM tasks t WHERE t.company_id = p.company_id AND t.project_id = p.id)
		FROM projects p
		WHERE p.company_id = $1 AND ($2 = '' OR p.status = $2) AND p.key > $3
		ORDER BY p.key LIMIT $4`, companyID, status, afterKey, limit)
	if err != nil {
		return nil, fmt.Errorf("list projects: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ProjectSummary, error) {
		var (
			s      ProjectSummary
			policy []byte
		)
		if err := r.Scan(&s.ID, &s.CompanyID, &s.Name, &s.Key, &s.Description, &s.Status, &policy,
			&s.CreatedAt, &s.UpdatedAt, &s.Workspaces, &s.Tasks); err != nil {
			return s, err
		}
		pol, err := loadPolicy(policy)
		s.Policy = pol
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("list projects: %w", err)
	}
	return list, nil
}

// PolicyEnvironment is an environment as a project's execution policy sees it.
type PolicyEnvironment struct {
	ID     string
	Name   string
	Driver string
	Status string
}

// PolicyEnvironmentByID loads an environment of the company for a policy check; a malformed id
// and another company's environment are ErrNotFound, so callers cannot learn that it exists.
func PolicyEnvironmentByID(ctx context.Context, q Querier, companyID, id string) (PolicyEnvironment, error) {
	if !validUUID(id) {
		return PolicyEnvironment{}, ErrNotFound
	}
	var e PolicyEnvironment
	err := q.QueryRow(ctx, `SELECT id, name, driver, status FROM environments
		WHERE company_id = $1 AND id = $2`, companyID, id).Scan(&e.ID, &e.Name, &e.Driver, &e.Status)
	if err != nil {
		return PolicyEnvironment{}, fmt.Errorf("policy environment %s: %w", id, notFound(err))
	}
	return e, nil
}

// PolicyEnvironments lists a company's environments by name, active ones only unless
// includeArchived is set: the choices a project's policy offers.
func PolicyEnvironments(ctx context.Context, q Querier, companyID string, includeArchived bool) ([]PolicyEnvironment, error) {
	rows, err := q.Query(ctx, `SELECT id, name, driver, status FROM environments
		WHERE company_id = $1 AND ($2 OR status = 'active') ORDER BY name, id`, companyID, includeArchived)
	if err != nil {
		return nil, fmt.Errorf("policy environments: %w", err)
	}
	envs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PolicyEnvironment, error) {
		var e PolicyEnvironment
		err := r.Scan(&e.ID, &e.Name, &e.Driver, &e.Status)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("policy environments: %w", err)
	}
	return envs, nil
}
