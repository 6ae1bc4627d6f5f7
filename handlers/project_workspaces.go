package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/views"
	"berth/workspace"
)

// Limits and defaults of project workspaces and their runtime service definitions.
const (
	maxWorkspaceServices   = 20
	defaultServicePortEnv  = "PORT"
	defaultServiceHealth   = "/"
	defaultServiceTimeoutS = 30
	maxServiceTimeoutS     = 600
	serviceStopManual      = "manual"
	serviceLifecycleEphem  = "ephemeral"
	maxWorkspaceCommandLen = 10000
	maxWorkspaceNameLen    = 100
	maxServiceHealthLength = 1024
)

var (
	serviceNameRE    = regexp.MustCompile(`^[a-z0-9-]{1,64}$`)
	servicePortEnvRE = regexp.MustCompile(`^[A-Z_][A-Z0-9_]{0,63}$`)
	serviceStops     = []string{"manual", "on_run_finish", "idle_timeout"}
	serviceLifecycle = []string{"shared", "ephemeral"}
	// servicePortEnvReserved are variables a service's port must not replace: the process would
	// lose its PATH or identity, or could impersonate Berth's own run variables.
	servicePortEnvReserved = []string{"PATH", "HOME", "USER", "SHELL", "PWD", "TMPDIR", "LD_PRELOAD", "LD_LIBRARY_PATH"}
)

// errPrimaryRequired refuses leaving a project with workspaces but no primary one.
var errPrimaryRequired = &httpError{Status: http.StatusConflict, Code: "primary_required",
	Message: "A project with workspaces keeps exactly one primary workspace: make another workspace primary first."}

// projectWorkspaceJSON is the API's project workspace object.
type projectWorkspaceJSON struct {
	ID             string                 `json:"id"`
	CompanyID      string                 `json:"company_id"`
	ProjectID      string                 `json:"project_id"`
	Name           string                 `json:"name"`
	SourceType     string                 `json:"source_type"`
	Source         string                 `json:"source"`
	DefaultRef     *string                `json:"default_ref"`
	SetupCommand   *string                `json:"setup_command"`
	CleanupCommand *string                `json:"cleanup_command"`
	IsPrimary      bool                   `json:"is_primary"`
	Services       []db.ServiceDefinition `json:"services"`
	CreatedAt      time.Time              `json:"created_at"`
	UpdatedAt      time.Time              `json:"updated_at"`
}

// projectWorkspaceOut is a workspace as the API shows it.
func projectWorkspaceOut(w db.ProjectWorkspace) projectWorkspaceJSON {
	services := w.Services
	if services == nil {
		services = []db.ServiceDefinition{}
	}
	return projectWorkspaceJSON{ID: w.ID, CompanyID: w.CompanyID, ProjectID: w.ProjectID, Name: w.Name,
		SourceType: w.SourceType, Source: w.Source, DefaultRef: projectNullable(w.DefaultRef),
		SetupCommand: projectNullable(w.SetupCommand), CleanupCommand: projectNullable(w.CleanupCommand),
		IsPrimary: w.IsPrimary, Services: services, CreatedAt: w.CreatedAt.UTC(), UpdatedAt: w.UpdatedAt.UTC()}
}

// serviceInput is a runtime service definition as submitted; empty members take defaults.
type serviceInput struct {
	Name          string `json:"name"`
	Command       string `json:"command"`
	PortEnv       string `json:"port_env"`
	HealthPath    string `json:"health_path"`
	ReadyTimeoutS *int   `json:"ready_timeout_s"`
	StopPolicy    string `json:"stop_policy"`
	Lifecycle     string `json:"lifecycle"`
}

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

// normalizeProjectServices validates service definitions and fills their defaults. Messages are keyed
// services[i].member; problems with the list itself are keyed services.
func normalizeProjectServices(in []serviceInput, fields map[string]string) []db.ServiceDefinition {
	if len(in) > maxWorkspaceServices {
		fields["services"] = fmt.Sprintf("at most %d services per workspace", maxWorkspaceServices)
		return nil
	}
	out := make([]db.ServiceDefinition, 0, len(in))
	seen := map[string]int{}
	for i, sv := range in {
		key := func(member string) string { return fmt.Sprintf("services[%d].%s", i, member) }
		d := db.ServiceDefinition{Name: strings.TrimSpace(sv.Name), Command: strings.TrimSpace(sv.Command),
			PortEnv: sv.PortEnv, HealthPath: sv.HealthPath, ReadyTimeoutS: defaultServiceTimeoutS,
			StopPolicy: sv.StopPolicy, Lifecycle: sv.Lifecycle}
		if d.PortEnv == "" {
			d.PortEnv = defaultServicePortEnv
		}
		if d.HealthPath == "" {
			d.HealthPath = defaultServiceHealth
		}
		if sv.ReadyTimeoutS != nil {
			d.ReadyTimeoutS = *sv.ReadyTimeoutS
		}
		if d.StopPolicy == "" {
			d.StopPolicy = serviceStopManual
		}
		if d.Lifecycle == "" {
			d.Lifecycle = serviceLifecycleEphem
		}
		if j, dup := seen[d.Name]; dup && d.Name != "" {
			fields[key("name")] = fmt.Sprintf("%q is already the name of services[%d]", d.Name, j)
		} else if !serviceNameRE.MatchString(d.Name) {
			fields[key("name")] = "must be 1–64 of a-z, 0-9 and -"
		}
		seen[d.Name] = i
		projectAddProblem(fields, key("command"), serviceCommandProblem(d.Command))
		projectAddProblem(fields, key("port_env"), servicePortEnvProblem(d.PortEnv))
		projectAddProblem(fields, key("health_path"), serviceHealthProblem(d.HealthPath))
		if d.ReadyTimeoutS < 1 || d.ReadyTimeoutS > maxServiceTimeoutS {
			fields[key("ready_timeout_s")] = fmt.Sprintf("must be from 1 to %d seconds", maxServiceTimeoutS)
		}
		if !slices.Contains(serviceStops, d.StopPolicy) {
			fields[key("stop_policy")] = `must be "manual", "on_run_finish" or "idle_timeout"`
		}
		if !slices.Contains(serviceLifecycle, d.Lifecycle) {
			fields[key("lifecycle")] = `must be "shared" or "ephemeral"`
		}
		out = append(out, d)
	}
	return out
}

// serviceCommandProblem says what is wrong with a service command, or "".
func serviceCommandProblem(cmd string) string {
	switch {
	case cmd == "":
		return "is required"
	case utf8.RuneCountInString(cmd) > maxWorkspaceCommandLen:
		return fmt.Sprintf("must be at most %d characters", maxWorkspaceCommandLen)
	case strings.ContainsRune(cmd, 0):
		return "must not contain NUL bytes"
	}
	return ""
}

// servicePortEnvProblem says what is wrong with the variable that carries a service's port, or "".
func servicePortEnvProblem(name string) string {
	switch {
	case !servicePortEnvRE.MatchString(name):
		return "must be an environment variable name: A-Z, 0-9 and _, not starting with a digit (at most 64)"
	case slices.Contains(servicePortEnvReserved, name) || strings.HasPrefix(name, "BERTH_"):
		return fmt.Sprintf("%s is reserved; use a name such as PORT", name)
	}
	return ""
}

// serviceHealthProblem says what is wrong with a service's health path, or "".
func serviceHealthProblem(p string) string {
	switch {
	case !strings.HasPrefix(p, "/"):
		return `must start with "/"`
	case strings.HasPrefix(p, "//"):
		return `must be a path on the service, not start with "//"`
	case len(p) > maxServiceHealthLength:
		return fmt.Sprintf("must be at most %d characters", maxServiceHealthLength)
	case strings.ContainsFunc(p, func(r rune) bool { return r == ' ' || projectControlRune(r) }):
		return "must not contain spaces or control characters"
	}
	return ""
}

// projectWorkspaceNameProblem says what is wrong with a workspace name, or "".
func projectWorkspaceNameProblem(name string) string {
	switch {
	case name == "":
		return "is required"
	case utf8.RuneCountInString(name) > maxWorkspaceNameLen:
		return fmt.Sprintf("must be at most %d characters", maxWorkspaceNameLen)
	case strings.ContainsFunc(name, projectControlRune):
		return "must not contain control characters"
	}
	return ""
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
// URL) must lie inside one of the configured source roots (BERTH_SOURCE_ROOTS), unless an
// instance administrator, who owns the host, sets it.
func (s *Server) sourceAllowed(a access, f db.ProjectWorkspaceFields) error {
	if !workspace.SourceIsLocal(f.SourceType, f.Source) || a.Admin || workspace.SourceWithin(f.Source, s.sourceRoots) {
		return nil
	}
	return invalid(map[string]string{"source": "Local paths outside the allowed source roots can only be set by an " +
		"instance administrator; use a git URL, or ask an administrator to add the path."})
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
		err = s.sourceAllowed(a, f)
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
		err = s.sourceAllowed(a, f)
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
			timeout := d.ReadyTimeoutS
			services = append(services, serviceInput{Name: d.Name, Command: d.Command, PortEnv: d.PortEnv,
				HealthPath: d.HealthPath, ReadyTimeoutS: &timeout, StopPolicy: d.StopPolicy, Lifecycle: d.Lifecycle})
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
	if !slices.Equal(cur.Services, f.Services) {
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

// ---- JSON API ----

// projectWorkspaceCreateBody is POST /api/projects/{id}/workspaces.
type projectWorkspaceCreateBody struct {
	Name           string          `json:"name"`
	SourceType     string          `json:"source_type"`
	Source         string          `json:"source"`
	DefaultRef     *string         `json:"default_ref"`
	SetupCommand   *string         `json:"setup_command"`
	CleanupCommand *string         `json:"cleanup_command"`
	IsPrimary      bool            `json:"is_primary"`
	Services       []serviceInput  `json:"services"`
	CompanyID      json.RawMessage `json:"company_id"`
	ProjectID      json.RawMessage `json:"project_id"`
}

// projectWorkspacePatchBody is PATCH /api/project-workspaces/{id}: named members replace;
// services is replaced as a whole.
type projectWorkspacePatchBody struct {
	Name           fieldPatch[string]         `json:"name"`
	SourceType     fieldPatch[string]         `json:"source_type"`
	Source         fieldPatch[string]         `json:"source"`
	DefaultRef     fieldPatch[string]         `json:"default_ref"`
	SetupCommand   fieldPatch[string]         `json:"setup_command"`
	CleanupCommand fieldPatch[string]         `json:"cleanup_command"`
	IsPrimary      fieldPatch[bool]           `json:"is_primary"`
	Services       fieldPatch[[]serviceInput] `json:"services"`
	CompanyID      json.RawMessage            `json:"company_id"`
	ProjectID      json.RawMessage            `json:"project_id"`
}

// projectDeref is *p, or "" for nil.
func projectDeref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// projectPatched is the pointer form of a fieldPatch: nil when the body did not name it.
func projectPatched[T any](f fieldPatch[T]) *T {
	if !f.Set {
		return nil
	}
	v := f.Value
	return &v
}

// apiListProjectWorkspaces lists a project's workspaces by name: limit, cursor.
func (s *Server) apiListProjectWorkspaces(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.objectAccess(ctx, p, "projects", id)
	if err != nil {
		return err
	}
	limit, cursor, err := pageParams(r)
	if err != nil {
		return err
	}
	var c struct {
		Name string `json:"n"`
	}
	if err := decodeCursor(cursor, &c); err != nil {
		return err
	}
	list, err := db.ListProjectWorkspaces(ctx, s.pool, a.Company.ID, id, c.Name, limit+1)
	if err != nil {
		return err
	}
	out := listResponse[projectWorkspaceJSON]{Items: []projectWorkspaceJSON{}}
	if len(list) > limit {
		list = list[:limit]
		out.NextCursor = encodeCursor(struct {
			Name string `json:"n"`
		}{list[limit-1].Name})
	}
	for _, pw := range list {
		out.Items = append(out.Items, projectWorkspaceOut(pw))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// apiCreateProjectWorkspace adds a workspace to a project: board members only; 201.
func (s *Server) apiCreateProjectWorkspace(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "projects", id, "project_workspace.create", "project")
	if err != nil {
		return err
	}
	var body projectWorkspaceCreateBody
	if err := decodeJSON(w, r, &body); err != nil {
		return err
	}
	switch {
	case body.CompanyID != nil:
		return errProjectServerOwned("company_id")
	case body.ProjectID != nil:
		return errProjectServerOwned("project_id (it is the project in the URL)")
	}
	pw, err := s.createProjectWorkspace(ctx, r, a, id, projectWorkspaceInput{Name: body.Name, SourceType: body.SourceType,
		Source: body.Source, DefaultRef: projectDeref(body.DefaultRef), SetupCommand: projectDeref(body.SetupCommand),
		CleanupCommand: projectDeref(body.CleanupCommand), IsPrimary: body.IsPrimary, Services: body.Services})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, projectWorkspaceOut(pw))
	return nil
}

// apiPatchProjectWorkspace changes a workspace: board members only; 200.
func (s *Server) apiPatchProjectWorkspace(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "project_workspaces", id, "project_workspace.update", "project_workspace")
	if err != nil {
		return err
	}
	var body projectWorkspacePatchBody
	if err := decodeJSON(w, r, &body); err != nil {
		return err
	}
	switch {
	case body.CompanyID != nil:
		return errProjectServerOwned("company_id")
	case body.ProjectID != nil:
		return errProjectServerOwned("project_id (a workspace cannot move to another project)")
	}
	pw, err := s.updateProjectWorkspace(ctx, r, a, id, projectWorkspaceChange{
		Name: projectPatched(body.Name), SourceType: projectPatched(body.SourceType), Source: projectPatched(body.Source),
		DefaultRef: projectPatched(body.DefaultRef), SetupCommand: projectPatched(body.SetupCommand),
		CleanupCommand: projectPatched(body.CleanupCommand), IsPrimary: projectPatched(body.IsPrimary), Services: projectPatched(body.Services)})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, projectWorkspaceOut(pw))
	return nil
}

// apiDeleteProjectWorkspace removes a workspace: board members only; 204.
func (s *Server) apiDeleteProjectWorkspace(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "project_workspaces", id, "project_workspace.delete", "project_workspace")
	if err != nil {
		return err
	}
	if _, err := s.deleteProjectWorkspace(ctx, r, a, id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// ---- Pages and forms ----

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
	if err := readProjectForm(w, r); err != nil {
		return err
	}
	vals := projectWorkspaceFormValuesFrom(r)
	in := projectWorkspaceInput{Name: vals.Name, SourceType: vals.SourceType, Source: vals.Source,
		DefaultRef: vals.DefaultRef, SetupCommand: vals.SetupCommand, CleanupCommand: vals.CleanupCommand,
		IsPrimary: vals.IsPrimary}
	_, err = s.createProjectWorkspace(ctx, r, a, id, in)
	fields, status, refused := projectFormRefusal(err)
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
		return s.renderProjectWorkspaces(w, r, a, proj, status, &views.ProjectWorkspaceForm{ProjectID: id, Values: vals, Errors: fields})
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
		v.Services = append(v.Services, views.ProjectServiceRow(sv))
	}
	editable := a.canManage() && !proj.Archived()
	d := views.ProjectWorkspacePageData{Workspace: v, Archived: proj.Archived(), Editable: editable,
		Deletable: editable && (!pw.IsPrimary || n == 1),
		Form: views.ProjectWorkspaceForm{ProjectID: proj.ID, WorkspaceID: pw.ID, CurrentlyPrimary: pw.IsPrimary,
			Values: views.ProjectWorkspaceFormValues{Name: pw.Name, SourceType: pw.SourceType, Source: pw.Source,
				DefaultRef: pw.DefaultRef, SetupCommand: pw.SetupCommand, CleanupCommand: pw.CleanupCommand,
				Services: projectServicesText(pw.Services)}}}
	return d, pw.Name, nil
}

// projectServicesText is the JSON a workspace's edit form shows for its services ("" for none).
func projectServicesText(list []db.ServiceDefinition) string {
	if len(list) == 0 {
		return ""
	}
	b, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return ""
	}
	return string(b)
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
	if err := readProjectForm(w, r); err != nil {
		return err
	}
	vals := projectWorkspaceFormValuesFrom(r)
	ch := projectWorkspaceChange{Name: &vals.Name, SourceType: &vals.SourceType, Source: &vals.Source,
		DefaultRef: &vals.DefaultRef, SetupCommand: &vals.SetupCommand, CleanupCommand: &vals.CleanupCommand}
	if vals.IsPrimary {
		ch.IsPrimary = &vals.IsPrimary
	}
	services, err := parseProjectServicesText(vals.Services)
	if err == nil {
		ch.Services = &services
		_, err = s.updateProjectWorkspace(ctx, r, a, id, ch)
	}
	if fields, status, ok := projectFormRefusal(err); ok {
		d, title, err := s.projectWorkspacePageData(ctx, a, id)
		if err != nil {
			return err
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
	projectSeeOther(w, r, "/project-workspaces/"+id)
	return nil
}

// parseProjectServicesText reads the services textarea: empty means none; otherwise a JSON array of
// service definitions with only known members (a 422 on services otherwise).
func parseProjectServicesText(text string) ([]serviceInput, error) {
	if strings.TrimSpace(text) == "" {
		return []serviceInput{}, nil
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(text)))
	dec.DisallowUnknownFields()
	var list []serviceInput
	if err := dec.Decode(&list); err != nil || dec.More() {
		msg := "must be a JSON array of service objects"
		if err != nil {
			msg += ": " + err.Error()
		}
		return nil, invalid(map[string]string{"services": msg})
	}
	if list == nil {
		list = []serviceInput{}
	}
	return list, nil
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
	projectSeeOther(w, r, "/projects/"+pw.ProjectID)
	return nil
}

// projectWorkspaceFormValuesFrom reads a workspace form's fields as typed.
func projectWorkspaceFormValuesFrom(r *http.Request) views.ProjectWorkspaceFormValues {
	return views.ProjectWorkspaceFormValues{Name: r.PostForm.Get("name"), SourceType: r.PostForm.Get("source_type"),
		Source: r.PostForm.Get("source"), DefaultRef: r.PostForm.Get("default_ref"),
		SetupCommand: projectFormText(r, "setup_command"), CleanupCommand: projectFormText(r, "cleanup_command"),
		IsPrimary: projectFormBool(r, "is_primary"), Services: projectFormText(r, "services")}
}
