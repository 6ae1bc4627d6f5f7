package db

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ServiceDefinition is one runtime service a project workspace declares (a preview or dev
// server), stored with every default filled.
type ServiceDefinition struct {
	Name          string `json:"name"`
	Command       string `json:"command"`
	PortEnv       string `json:"port_env"`
	HealthPath    string `json:"health_path"`
	ReadyTimeoutS int    `json:"ready_timeout_s"`
	StopPolicy    string `json:"stop_policy"`
	Lifecycle     string `json:"lifecycle"`
	// StripPrefix false passes /preview/{id}/… to the service unchanged (nil or true: stripped).
	StripPrefix *bool `json:"strip_prefix,omitempty"`
	// IdleTimeoutM is the idle_timeout policy's minutes without a proxied request (0 = 30).
	IdleTimeoutM int `json:"idle_timeout_m,omitempty"`
}

// ProjectWorkspace is where a project's code lives: a git repository (local path or URL) or a
// plain directory, with its setup and cleanup commands and runtime service definitions.
type ProjectWorkspace struct {
	ID             string
	CompanyID      string
	ProjectID      string
	Name           string
	SourceType     string // git | directory
	Source         string
	DefaultRef     string
	SetupCommand   string
	CleanupCommand string
	IsPrimary      bool
	Services       []ServiceDefinition
	CreatedAt      time.Time
	UpdatedAt      time.Time
}

// ProjectWorkspaceFields are the values a create or an update writes; the caller has validated
// them. The primary flag is written separately (see SetPrimaryProjectWorkspace).
type ProjectWorkspaceFields struct {
	Name           string
	SourceType     string
	Source         string
	DefaultRef     string
	SetupCommand   string
	CleanupCommand string
	Services       []ServiceDefinition
}

const projectWorkspaceColumns = `id, company_id, project_id, name, source_type, source, default_ref,
	setup_command, cleanup_command, is_primary, services, created_at, updated_at`

func scanProjectWorkspace(row pgx.Row) (ProjectWorkspace, error) {
	var (
		w        ProjectWorkspace
		services []byte
	)
	if err := row.Scan(&w.ID, &w.CompanyID, &w.ProjectID, &w.Name, &w.SourceType, &w.Source, &w.DefaultRef,
		&w.SetupCommand, &w.CleanupCommand, &w.IsPrimary, &services, &w.CreatedAt, &w.UpdatedAt); err != nil {
		return ProjectWorkspace{}, notFound(err)
	}
	if err := json.Unmarshal(services, &w.Services); err != nil {
		return ProjectWorkspace{}, fmt.Errorf("services of project workspace %s: %w", w.ID, err)
	}
	if w.Services == nil {
		w.Services = []ServiceDefinition{}
	}
	return w, nil
}

func servicesJSON(s []ServiceDefinition) ([]byte, error) {
	if s == nil {
		s = []ServiceDefinition{}
	}
	return json.Marshal(s)
}

// ProjectWorkspaceByID loads one project workspace of a company; missing, malformed and another
// company's ids are all ErrNotFound.
func ProjectWorkspaceByID(ctx context.Context, q Querier, companyID, id string) (ProjectWorkspace, error) {
	if !validUUID(id) || !validUUID(companyID) {
		return ProjectWorkspace{}, ErrNotFound
	}
	w, err := scanProjectWorkspace(q.QueryRow(ctx, `SELECT `+projectWorkspaceColumns+`
		FROM project_workspaces WHERE company_id = $1 AND id = $2`, companyID, id))
	if err != nil {
		return ProjectWorkspace{}, fmt.Errorf("project workspace %s: %w", id, err)
	}
	return w, nil
}

// PrimaryProjectWorkspace loads a project's primary workspace; a project without workspaces has
// none and gets ErrNotFound.
func PrimaryProjectWorkspace(ctx context.Context, q Querier, companyID, projectID string) (ProjectWorkspace, error) {
	if !validUUID(projectID) || !validUUID(companyID) {
		return ProjectWorkspace{}, ErrNotFound
	}
	w, err := scanProjectWorkspace(q.QueryRow(ctx, `SELECT `+projectWorkspaceColumns+`
		FROM project_workspaces WHERE company_id = $1 AND project_id = $2 AND is_primary`, companyID, projectID))
	if err != nil {
		return ProjectWorkspace{}, fmt.Errorf("primary workspace of project %s: %w", projectID, err)
	}
	return w, nil
}

// ListProjectWorkspaces returns up to limit workspaces of a project ordered by name, starting
// after the name afterName ("" for the first page).
func ListProjectWorkspaces(ctx context.Context, q Querier, companyID, projectID, afterName string, limit int) ([]ProjectWorkspace, error) {
	rows, err := q.Query(ctx, `SELECT `+projectWorkspaceColumns+` FROM project_workspaces
		WHERE company_id = $1 AND project_id = $2 AND name > $3
		ORDER BY name LIMIT $4`, companyID, projectID, afterName, limit)
	if err != nil {
		return nil, fmt.Errorf("list project workspaces: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ProjectWorkspace, error) {
		return scanProjectWorkspace(r)
	})
	if err != nil {
		return nil, fmt.Errorf("list project workspaces: %w", err)
	}
	return list, nil
}

// CountProjectWorkspaces counts a project's workspaces.
func CountProjectWorkspaces(ctx context.Context, q Querier, companyID, projectID string) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT count(*) FROM project_workspaces WHERE company_id = $1 AND project_id = $2`,
		companyID, projectID).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count project workspaces: %w", err)
	}
	return n, nil
}

// projectWorkspaceNameTaken reports whether another workspace of id's project has the name, so a
// rename never trips the unique index inside a transaction.
func projectWorkspaceNameTaken(ctx context.Context, q Querier, companyID, id, name string) (bool, error) {
	var taken bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM project_workspaces me
		JOIN project_workspaces other ON other.project_id = me.project_id
		WHERE me.company_id = $1 AND me.id = $2 AND other.name = $3 AND other.id <> me.id)`,
		companyID, id, name).Scan(&taken)
	if err != nil {
		return false, fmt.Errorf("project workspace name taken: %w", err)
	}
	return taken, nil
}

// CreateProjectWorkspace inserts a workspace (not primary; see SetPrimaryProjectWorkspace). A
// name already used in the project is ErrConflict, without aborting the transaction.
func CreateProjectWorkspace(ctx context.Context, q Querier, companyID, projectID string, f ProjectWorkspaceFields) (ProjectWorkspace, error) {
	services, err := servicesJSON(f.Services)
	if err != nil {
		return ProjectWorkspace{}, fmt.Errorf("create project workspace: %w", err)
	}
	w, err := scanProjectWorkspace(q.QueryRow(ctx, `INSERT INTO project_workspaces
			(company_id, project_id, name, source_type, source, default_ref, setup_command, cleanup_command, services)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (project_id, name) DO NOTHING
		RETURNING `+projectWorkspaceColumns, companyID, projectID, f.Name, f.SourceType, f.Source, f.DefaultRef,
		f.SetupCommand, f.CleanupCommand, services))
	switch {
	case errors.Is(err, ErrNotFound):
		return ProjectWorkspace{}, fmt.Errorf("create project workspace %q: %w", f.Name, ErrConflict)
	case err != nil:
		return ProjectWorkspace{}, fmt.Errorf("create project workspace: %w", err)
	}
	return w, nil
}

// UpdateProjectWorkspace replaces a workspace's fields (not its primary flag). A name used by
// another workspace of the project is ErrConflict, checked before writing.
func UpdateProjectWorkspace(ctx context.Context, q Querier, companyID, id string, f ProjectWorkspaceFields) (ProjectWorkspace, error) {
	if !validUUID(id) || !validUUID(companyID) {
		return ProjectWorkspace{}, ErrNotFound
	}
	taken, err := projectWorkspaceNameTaken(ctx, q, companyID, id, f.Name)
	if err != nil {
		return ProjectWorkspace{}, err
	}
	if taken {
		return ProjectWorkspace{}, fmt.Errorf("update project workspace %q: %w", f.Name, ErrConflict)
	}
	services, err := servicesJSON(f.Services)
	if err != nil {
		return ProjectWorkspace{}, fmt.Errorf("update project workspace: %w", err)
	}
	w, err := scanProjectWorkspace(q.QueryRow(ctx, `UPDATE project_workspaces
		SET name = $3, source_type = $4, source = $5, default_ref = $6, setup_command = $7,
			cleanup_command = $8, services = $9, updated_at = now()
		WHERE company_id = $1 AND id = $2
		RETURNING `+projectWorkspaceColumns, companyID, id, f.Name, f.SourceType, f.Source, f.DefaultRef,
		f.SetupCommand, f.CleanupCommand, services))
	if err != nil {
		return ProjectWorkspace{}, fmt.Errorf("update project workspace %s: %w", id, err)
	}
	return w, nil
}

// SetPrimaryProjectWorkspace makes id its project's primary workspace and returns the id of the
// workspace that was primary before ("" if none, or id itself if nothing changed). The old flag
// is cleared before the new one is set, so the partial unique index never sees two primaries;
// callers run it in the transaction that holds the project's lock.
func SetPrimaryProjectWorkspace(ctx context.Context, q Querier, companyID, projectID, id string) (string, error) {
	var previous string
	err := q.QueryRow(ctx, `SELECT id FROM project_workspaces
		WHERE company_id = $1 AND project_id = $2 AND is_primary`, companyID, projectID).Scan(&previous)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("set primary workspace: %w", err)
	}
	if previous == id {
		return id, nil
	}
	if previous != "" {
		if _, err := q.Exec(ctx, `UPDATE project_workspaces SET is_primary = false, updated_at = now()
			WHERE company_id = $1 AND id = $2`, companyID, previous); err != nil {
			return "", fmt.Errorf("set primary workspace: clear %s: %w", previous, err)
		}
	}
	tag, err := q.Exec(ctx, `UPDATE project_workspaces SET is_primary = true, updated_at = now()
		WHERE company_id = $1 AND project_id = $2 AND id = $3`, companyID, projectID, id)
	if err != nil {
		return "", fmt.Errorf("set primary workspace %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return "", fmt.Errorf("set primary workspace %s: %w", id, ErrNotFound)
	}
	return previous, nil
}

// DeleteProjectWorkspace removes a workspace; execution workspaces made from it keep their rows
// (their reference is set to null by the schema).
func DeleteProjectWorkspace(ctx context.Context, q Querier, companyID, id string) error {
	tag, err := q.Exec(ctx, `DELETE FROM project_workspaces WHERE company_id = $1 AND id = $2`, companyID, id)
	if err != nil {
		return fmt.Errorf("delete project workspace %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("delete project workspace %s: %w", id, ErrNotFound)
	}
	return nil
}
