package handlers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/workspace"
)

// Limits of a project workspace's name and commands.
const (
	maxWorkspaceCommandLen = 10000
	maxWorkspaceNameLen    = 100
)

// errPrimaryRequired refuses leaving a project with workspaces but no primary one.
var errPrimaryRequired = &httpError{Status: http.StatusConflict, Code: "primary_required",
	Message: "A project with workspaces keeps exactly one primary workspace: make another workspace primary first."}

// projectWorkspaceInput is a new workspace, from the API or the form.
type projectWorkspaceInput struct {
	Name           string
	SourceType     string
	Source         string
	DefaultRef     string
	SetupCommand   string
	CleanupCommand string
	IsPrimary      bool
	Services       []serviceInput
}

// projectWorkspaceChange is an update: only the members that are set change.
type projectWorkspaceChange struct {
	Name           *string
	SourceType     *string
	Source         *string
	DefaultRef     *string
	SetupCommand   *string
	CleanupCommand *string
	IsPrimary      *bool
	Services       *[]serviceInput
}

// projectWorkspaceNameProblem says what is wrong with a workspace name, or "".
func projectWorkspaceNameProblem(name string) string {
	switch {
	case name == "":
		return "is required"
	case utf8.RuneCountInString(name) > maxWorkspaceNameLen:
		return fmt.Sprintf("must be at most %d characters", maxWorkspaceNameLen)
	}
	return textProblem(name)
}

// projectWorkspaceCommandProblem says what is wrong with a setup or cleanup command, or "".
func projectWorkspaceCommandProblem(cmd string) string {
	switch {
	case utf8.RuneCountInString(cmd) > maxWorkspaceCommandLen:
		return fmt.Sprintf("must be at most %d characters", maxWorkspaceCommandLen)
	case strings.ContainsRune(cmd, 0):
		return "must not contain NUL bytes"
	}
	return ""
}

// validateProjectWorkspace checks a workspace's values and, when checkSource is set, its source
// on this host (see workspace.ValidateSource); the result carries the cleaned source and the
// resolved default ref. Every refusal is a 422 with field messages.
func validateProjectWorkspace(ctx context.Context, f db.ProjectWorkspaceFields, services []serviceInput, checkSource bool) (db.ProjectWorkspaceFields, error) {
	f.Name = strings.TrimSpace(f.Name)
	f.Source = strings.TrimSpace(f.Source)
	f.DefaultRef = strings.TrimSpace(f.DefaultRef)
	f.SetupCommand = strings.TrimSpace(f.SetupCommand)
	f.CleanupCommand = strings.TrimSpace(f.CleanupCommand)
	fields := map[string]string{}
	projectAddProblem(fields, "name", projectWorkspaceNameProblem(f.Name))
	projectAddProblem(fields, "setup_command", projectWorkspaceCommandProblem(f.SetupCommand))
	projectAddProblem(fields, "cleanup_command", projectWorkspaceCommandProblem(f.CleanupCommand))
	for _, p := range workspace.CheckSourceSyntax(f.SourceType, f.Source, f.DefaultRef) {
		fields[p.Field] = p.Message
	}
	f.Services = normalizeProjectServices(services, fields)
	if len(fields) > 0 {
		return f, invalid(fields)
	}
	if !checkSource {
		return f, nil
	}
	check, err := workspace.ValidateSource(ctx, f.SourceType, f.Source, f.DefaultRef)
	var prob *workspace.SourceProblem
	switch {
	case errors.As(err, &prob):
		return f, invalid(map[string]string{prob.Field: prob.Message})
	case err != nil:
		return f, err
	}
	f.Source, f.DefaultRef = check.Source, check.DefaultRef
	return f, nil
}

// sourceAllowed keeps tenants out of the host's filesystem: a local source (a path or a file://
// URL) must lie inside one of the source roots (BERTH_SOURCE_ROOTS and those instance
// administrators added on /admin/source-roots), unless an instance administrator, who owns the
// host, sets it. The refusal (422 source_outside_roots) names the directory a board member may
// ask an administrator to allow (source_roots.go).
func (s *Server) sourceAllowed(ctx context.Context, a access, f db.ProjectWorkspaceFields) error {
	if !workspace.SourceIsLocal(f.SourceType, f.Source) || a.Admin {
		return nil
	}
	roots, err := s.effectiveSourceRoots(ctx)
	if err != nil {
		return err
	}
	if workspace.SourceWithin(f.Source, roots) {
		return nil
	}
	return errSourceOutsideRoots(f.Source)
}

// projectWorkspaceParent loads a workspace's project and refuses changes when it is archived.
func projectWorkspaceParent(ctx context.Context, q db.Querier, companyID, projectID string) (db.Project, error) {
	proj, err := db.ProjectByID(ctx, q, companyID, projectID)
	if err != nil {
		return db.Project{}, err
	}
	if proj.Archived() {
		return db.Project{}, errProjectArchived
	}
	return proj, nil
}

// lockProjectWorkspaceParent locks a project for a workspace change and refuses it when archived.
func lockProjectWorkspaceParent(ctx context.Context, tx pgx.Tx, companyID, projectID string) error {
	proj, err := db.LockProject(ctx, tx, companyID, projectID)
	if err != nil {
		return err
	}
	if proj.Archived() {
		return errProjectArchived
	}
	return nil
}

// createProjectWorkspace validates a new workspace (its source included) and inserts it. The
// project's first workspace becomes primary; is_primary on a later one moves the flag to it in
// the same transaction.
func (s *Server) createProjectWorkspace(ctx context.Context, r *http.Request, a access, projectID string, in projectWorkspaceInput) (db.ProjectWorkspace, error) {
	if _, err := projectWorkspaceParent(ctx, s.pool, a.Company.ID, projectID); err != nil {
		return db.ProjectWorkspace{}, err
	}
	f, err := validateProjectWorkspace(ctx, db.ProjectWorkspaceFields{Name: in.Name, SourceType: in.SourceType,
		Source: in.Source, DefaultRef: in.DefaultRef, SetupCommand: in.SetupCommand, CleanupCommand: in.CleanupCommand},
		in.Services, true)
	if err == nil {
		err = s.sourceAllowed(ctx, a, f)
	}
	if err != nil {
		return db.ProjectWorkspace{}, err
	}
	var w db.ProjectWorkspace
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		if err := lockProjectWorkspaceParent(ctx, tx, a.Company.ID, projectID); err != nil {
			return err
		}
		existing, err := db.CountProjectWorkspaces(ctx, tx, a.Company.ID, projectID)
		if err != nil {
			return err
		}
		w, err = db.CreateProjectWorkspace(ctx, tx, a.Company.ID, projectID, f)
		if errors.Is(err, db.ErrConflict) {
			return projectWorkspaceNameTaken(f.Name)
		}
		if err != nil {
			return err
		}
		previous := ""
		if existing == 0 || in.IsPrimary {
			if previous, err = db.SetPrimaryProjectWorkspace(ctx, tx, a.Company.ID, projectID, w.ID); err != nil {
				return err
			}
		}
		if err := s.auditTx(ctx, tx, r, a, "project_workspace.created", "project_workspace", w.ID, map[string]any{
			"project_id": projectID, "name": w.Name, "source_type": w.SourceType, "source": w.Source,
			"is_primary": existing == 0 || in.IsPrimary}); err != nil {
			return err
		}
		if previous != "" {
			if err := s.auditPrimaryChanged(ctx, tx, r, a, projectID, previous, w.ID); err != nil {
				return err
			}
		}
		w, err = db.ProjectWorkspaceByID(ctx, tx, a.Company.ID, w.ID)
		return err
	})
	return w, err
}

// projectWorkspaceNameTaken is the 409 for a name used by another workspace of the project.
func projectWorkspaceNameTaken(name string) error {
	return &httpError{Status: http.StatusConflict, Code: "name_taken",
		Message: fmt.Sprintf("Another workspace of this project is already called %q.", name),
		Fields:  map[string]string{"name": "is already used by another workspace of this project"}}
}

// errProjectWorkspaceChanged refuses an update whose workspace changed while it was being validated.
var errProjectWorkspaceChanged = &httpError{Status: http.StatusConflict, Code: "conflict",
	Message: "The workspace changed while your change was being checked; reload it and try again."}

// updateProjectWorkspace applies a change. The source is checked again on this host only when
// the source type, source or default ref change; moving to a directory source clears the
// default ref unless the change names one. is_primary true moves the primary flag here (both
// rows in one transaction); false on the primary is refused, since a project keeps one.
func (s *Server) updateProjectWorkspace(ctx context.Context, r *http.Request, a access, id string, ch projectWorkspaceChange) (db.ProjectWorkspace, error) {
	cur, err := db.ProjectWorkspaceByID(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return db.ProjectWorkspace{}, err
	}
	if _, err := projectWorkspaceParent(ctx, s.pool, a.Company.ID, cur.ProjectID); err != nil {
		return db.ProjectWorkspace{}, err
	}
	next, services := mergeProjectWorkspace(cur, ch)
	sourceChanged := next.SourceType != cur.SourceType || strings.TrimSpace(next.Source) != cur.Source ||
		strings.TrimSpace(next.DefaultRef) != cur.DefaultRef
	f, err := validateProjectWorkspace(ctx, next, services, sourceChanged)
	if err == nil && sourceChanged {
		err = s.sourceAllowed(ctx, a, f)
	}
	if err != nil {
		return db.ProjectWorkspace{}, err
	}
	var w db.ProjectWorkspace
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		if err := lockProjectWorkspaceParent(ctx, tx, a.Company.ID, cur.ProjectID); err != nil {
			return err
		}
		locked, err := db.ProjectWorkspaceByID(ctx, tx, a.Company.ID, id)
		if err != nil {
			return err
		}
		if !locked.UpdatedAt.Equal(cur.UpdatedAt) {
			return errProjectWorkspaceChanged
		}
		if ch.IsPrimary != nil && !*ch.IsPrimary && locked.IsPrimary {
			return errPrimaryRequired
		}
		if changed := projectWorkspaceChangedFields(locked, f); len(changed) > 0 {
			if _, err := db.UpdateProjectWorkspace(ctx, tx, a.Company.ID, id, f); errors.Is(err, db.ErrConflict) {
				return projectWorkspaceNameTaken(f.Name)
			} else if err != nil {
				return err
			}
			if err := s.auditTx(ctx, tx, r, a, "project_workspace.updated", "project_workspace", id,
				map[string]any{"project_id": locked.ProjectID, "name": f.Name, "changed": changed}); err != nil {
				return err
			}
		}
		if ch.IsPrimary != nil && *ch.IsPrimary && !locked.IsPrimary {
			previous, err := db.SetPrimaryProjectWorkspace(ctx, tx, a.Company.ID, locked.ProjectID, id)
			if err != nil {
				return err
			}
			if err := s.auditPrimaryChanged(ctx, tx, r, a, locked.ProjectID, previous, id); err != nil {
				return err
			}
		}
		w, err = db.ProjectWorkspaceByID(ctx, tx, a.Company.ID, id)
		return err
	})
	return w, err
}

// mergeProjectWorkspace applies the named members of a change to the current values.
func mergeProjectWorkspace(cur db.ProjectWorkspace, ch projectWorkspaceChange) (db.ProjectWorkspaceFields, []serviceInput) {
	f := db.ProjectWorkspaceFields{Name: cur.Name, SourceType: cur.SourceType, Source: cur.Source,
		DefaultRef: cur.DefaultRef, SetupCommand: cur.SetupCommand, CleanupCommand: cur.CleanupCommand}
	set := func(dst *string, v *string) {
		if v != nil {
			*dst = *v
		}
	}
	set(&f.Name, ch.Name)
	set(&f.SourceType, ch.SourceType)
	set(&f.Source, ch.Source)
	set(&f.DefaultRef, ch.DefaultRef)
	set(&f.SetupCommand, ch.SetupCommand)
	set(&f.CleanupCommand, ch.CleanupCommand)
	if f.SourceType == workspace.SourceDirectory && ch.DefaultRef == nil {
		f.DefaultRef = ""
	}
	services := make([]serviceInput, 0, len(cur.Services))
	if ch.Services != nil {
		services = *ch.Services
	} else {
		for _, d := range cur.Services {
			services = append(services, serviceInputOf(d))
		}
	}
	return f, services
}

// projectWorkspaceChangedFields names the fields that differ between a workspace and its next
// values (for the audit trail: names only, never the values, which may hold secrets).
func projectWorkspaceChangedFields(cur db.ProjectWorkspace, f db.ProjectWorkspaceFields) []string {
	var changed []string
	for _, c := range []struct {
		name     string
		old, new string
	}{
		{"name", cur.Name, f.Name}, {"source_type", cur.SourceType, f.SourceType}, {"source", cur.Source, f.Source},
		{"default_ref", cur.DefaultRef, f.DefaultRef}, {"setup_command", cur.SetupCommand, f.SetupCommand},
		{"cleanup_command", cur.CleanupCommand, f.CleanupCommand},
	} {
		if c.old != c.new {
			changed = append(changed, c.name)
		}
	}
	if !sameServices(cur.Services, f.Services) {
		changed = append(changed, "services")
	}
	return changed
}

// auditPrimaryChanged records the primary flag moving from one workspace to another.
func (s *Server) auditPrimaryChanged(ctx context.Context, tx pgx.Tx, r *http.Request, a access, projectID, from, to string) error {
	details := map[string]any{"project_id": projectID, "from": from, "to": to}
	if from == "" {
		details["from"] = nil
	}
	return s.auditTx(ctx, tx, r, a, "project_workspace.primary_changed", "project_workspace", to, details)
}

// deleteProjectWorkspace removes a workspace. The primary one can go only when it is the last:
// otherwise another must be made primary first (409 primary_required).
func (s *Server) deleteProjectWorkspace(ctx context.Context, r *http.Request, a access, id string) (db.ProjectWorkspace, error) {
	cur, err := db.ProjectWorkspaceByID(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return db.ProjectWorkspace{}, err
	}
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		if err := lockProjectWorkspaceParent(ctx, tx, a.Company.ID, cur.ProjectID); err != nil {
			return err
		}
		locked, err := db.ProjectWorkspaceByID(ctx, tx, a.Company.ID, id)
		if err != nil {
			return err
		}
		if locked.IsPrimary {
			n, err := db.CountProjectWorkspaces(ctx, tx, a.Company.ID, locked.ProjectID)
			if err != nil {
				return err
			}
			if n > 1 {
				return errPrimaryRequired
			}
		}
		if err := db.DeleteProjectWorkspace(ctx, tx, a.Company.ID, id); err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "project_workspace.deleted", "project_workspace", id,
			map[string]any{"project_id": locked.ProjectID, "name": locked.Name, "was_primary": locked.IsPrimary})
	})
	return cur, err
}
