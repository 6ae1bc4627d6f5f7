package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/views"
	"berth/workspace"
)

// projectJSON is the API's project object.
type projectJSON struct {
	ID              string            `json:"id"`
	CompanyID       string            `json:"company_id"`
	Name            string            `json:"name"`
	Key             string            `json:"key"`
	Description     *string           `json:"description"`
	Status          string            `json:"status"`
	ExecutionPolicy projectPolicyJSON `json:"execution_policy"`
	CreatedAt       time.Time         `json:"created_at"`
	UpdatedAt       time.Time         `json:"updated_at"`
}

// projectPolicyJSON is a project's execution policy in requests and responses.
type projectPolicyJSON struct {
	DefaultMode       string  `json:"default_mode"`
	AllowTaskOverride bool    `json:"allow_task_override"`
	EnvironmentID     *string `json:"environment_id"`
	Strategy          string  `json:"strategy"`
	BranchTemplate    string  `json:"branch_template"`
}

// projectOut is a project as the API shows it.
func projectOut(p db.Project) projectJSON {
	return projectJSON{ID: p.ID, CompanyID: p.CompanyID, Name: p.Name, Key: p.Key,
		Description: projectNullable(p.Description), Status: p.Status, ExecutionPolicy: projectPolicyOut(p.Policy),
		CreatedAt: p.CreatedAt.UTC(), UpdatedAt: p.UpdatedAt.UTC()}
}

// projectPolicyOut is a stored policy as the API shows it (no environment as null).
func projectPolicyOut(p db.ExecutionPolicy) projectPolicyJSON {
	return projectPolicyJSON{DefaultMode: p.DefaultMode, AllowTaskOverride: p.AllowTaskOverride,
		EnvironmentID: projectNullable(p.EnvironmentID), Strategy: p.Strategy, BranchTemplate: p.BranchTemplate}
}

// projectNullable is s, or JSON null when s is empty.
func projectNullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// fieldPatch is a JSON member that remembers whether the body named it; null counts as named
// with the zero value. Nested objects refuse unknown fields like the top level does.
type fieldPatch[T any] struct {
	Set   bool
	Value T
}

// UnmarshalJSON implements json.Unmarshaler.
func (f *fieldPatch[T]) UnmarshalJSON(b []byte) error {
	f.Set = true
	var zero T
	f.Value = zero
	if string(bytes.TrimSpace(b)) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(&f.Value)
}

// projectInput is a new project, from the API or the form.
type projectInput struct {
	Name        string
	Key         string
	Description string
	Policy      projectPolicyInput
}

// projectPolicyInput is an execution policy as submitted: empty members take their defaults.
type projectPolicyInput struct {
	DefaultMode       string
	AllowTaskOverride bool
	EnvironmentID     string
	Strategy          string
	BranchTemplate    string
}

// projectChange is an update: only the members that are set change.
type projectChange struct {
	Name        *string
	Description *string
	Status      *string
	Policy      *projectPolicyInput
}

// unarchivesOrOnlyStatus reports whether a change is allowed on an archived project: it
// unarchives it (possibly with other changes), or it only restates a status.
func (ch projectChange) unarchivesOrOnlyStatus() bool {
	if ch.Status == nil {
		return false
	}
	return *ch.Status == db.ProjectActive || ch.Name == nil && ch.Description == nil && ch.Policy == nil
}

var projectKeyRE = regexp.MustCompile(`^[A-Z][A-Z0-9]{1,9}$`)

// projectNameProblem says what is wrong with a project name, or "".
func projectNameProblem(name string) string {
	switch {
	case name == "":
		return "is required"
	case utf8.RuneCountInString(name) > 200:
		return "must be at most 200 characters"
	case strings.ContainsFunc(name, projectControlRune):
		return "must not contain control characters"
	}
	return ""
}

// projectKeyProblem says what is wrong with a project key, or "".
func projectKeyProblem(key string) string {
	switch {
	case key == "":
		return "is required"
	case !projectKeyRE.MatchString(key):
		return "must be 2–10 capital letters or digits, starting with a letter (for example WEB or API2)"
	}
	return ""
}

// projectDescriptionProblem says what is wrong with a project description, or "".
func projectDescriptionProblem(d string) string {
	if utf8.RuneCountInString(d) > 10000 {
		return "must be at most 10000 characters"
	}
	return ""
}

// projectControlRune reports the characters refused in names.
func projectControlRune(r rune) bool { return r < 0x20 || r == 0x7f }

// normalize fills the policy's defaults.
func (p projectPolicyInput) normalize() db.ExecutionPolicy {
	out := db.ExecutionPolicy{DefaultMode: p.DefaultMode, AllowTaskOverride: p.AllowTaskOverride,
		EnvironmentID: strings.TrimSpace(p.EnvironmentID), Strategy: p.Strategy,
		BranchTemplate: strings.TrimSpace(p.BranchTemplate)}
	if out.DefaultMode == "" {
		out.DefaultMode = workspace.ModeShared
	}
	if out.Strategy == "" {
		out.Strategy = string(workspace.StrategyGitWorktree)
	}
	if out.BranchTemplate == "" {
		out.BranchTemplate = workspace.DefaultBranchTemplate
	}
	return out
}

// projectPolicyProblems validates a normalized policy's shape into fields (keyed
// execution_policy.<member>); the environment is checked against the database separately.
func projectPolicyProblems(p db.ExecutionPolicy, fields map[string]string) {
	if p.DefaultMode != workspace.ModeShared && p.DefaultMode != workspace.ModeIsolated {
		fields["execution_policy.default_mode"] = `must be "shared" or "isolated"`
	}
	if p.Strategy != string(workspace.StrategyGitWorktree) && p.Strategy != string(workspace.StrategyCopy) {
		fields["execution_policy.strategy"] = `must be "git_worktree" or "copy"`
	}
	if msg := workspace.ValidBranchTemplate(p.BranchTemplate); msg != "" {
		fields["execution_policy.branch_template"] = msg
	}
}

// checkPolicyEnvironment refuses a policy environment that is not one of the company's, in the
// same words whether it is missing or another company's, and stores the id in its canonical
// form. An archived environment is refused unless the policy already names it (current), so
// unrelated edits still pass.
func checkPolicyEnvironment(ctx context.Context, q db.Querier, companyID string, policy *db.ExecutionPolicy, current string, fields map[string]string) error {
	if policy.EnvironmentID == "" {
		return nil
	}
	env, err := db.PolicyEnvironmentByID(ctx, q, companyID, policy.EnvironmentID)
	switch {
	case errors.Is(err, db.ErrNotFound):
		fields["execution_policy.environment_id"] = "is not an environment of this company"
	case err != nil:
		return err
	case env.Status != "active" && env.ID != current:
		fields["execution_policy.environment_id"] = fmt.Sprintf("environment %q is archived; choose an active one", env.Name)
	default:
		policy.EnvironmentID = env.ID
	}
	return nil
}

// createProject validates a new project and inserts it with its audit event. A key already used
// in the company is a 409 (with the message on the key field, for forms).
func (s *Server) createProject(ctx context.Context, r *http.Request, a access, in projectInput) (db.Project, error) {
	in.Name, in.Key = strings.TrimSpace(in.Name), strings.TrimSpace(in.Key)
	policy := in.Policy.normalize()
	fields := map[string]string{}
	projectAddProblem(fields, "name", projectNameProblem(in.Name))
	projectAddProblem(fields, "key", projectKeyProblem(in.Key))
	projectAddProblem(fields, "description", projectDescriptionProblem(in.Description))
	projectPolicyProblems(policy, fields)
	if err := checkPolicyEnvironment(ctx, s.pool, a.Company.ID, &policy, "", fields); err != nil {
		return db.Project{}, err
	}
	if len(fields) > 0 {
		return db.Project{}, invalid(fields)
	}
	var p db.Project
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		p, err = db.CreateProject(ctx, tx, a.Company.ID, db.ProjectFields{Name: in.Name, Key: in.Key,
			Description: in.Description, Policy: policy})
		if errors.Is(err, db.ErrConflict) {
			return &httpError{Status: http.StatusConflict, Code: "key_taken",
				Message: fmt.Sprintf("Another project of this company already uses the key %s.", in.Key),
				Fields:  map[string]string{"key": "is already used by another project of this company"}}
		}
		if err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "project.created", "project", p.ID,
			map[string]any{"key": p.Key, "name": p.Name})
	})
	return p, err
}

// errProjectArchived refuses changes to an archived project and its workspaces.
var errProjectArchived = &httpError{Status: http.StatusConflict, Code: "project_archived",
	Message: "The project is archived; unarchive it before changing it or its workspaces."}

// updateProject applies a change to a project under its row lock. An archived project accepts
// nothing but being unarchived (which may come with other changes in the same request).
// Archiving and unarchiving are audited as such; other changes as project.updated with the
// names of the changed fields. A change that changes nothing writes nothing.
func (s *Server) updateProject(ctx context.Context, r *http.Request, a access, id string, ch projectChange) (db.Project, error) {
	var p db.Project
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		cur, err := db.LockProject(ctx, tx, a.Company.ID, id)
		if err != nil {
			return err
		}
		if cur.Archived() && !ch.unarchivesOrOnlyStatus() {
			return errProjectArchived
		}
		next, fields, err := applyProjectChange(ctx, tx, cur, ch)
		if err != nil {
			return err
		}
		if len(fields) > 0 {
			return invalid(fields)
		}
		changed := projectChangedFields(cur, next)
		if len(changed) == 0 && cur.Status == next.Status {
			p = cur
			return nil
		}
		if p, err = db.UpdateProject(ctx, tx, a.Company.ID, id, next); err != nil {
			return err
		}
		return s.auditProjectUpdate(ctx, tx, r, a, cur, p, changed)
	})
	return p, err
}

// applyProjectChange merges a change into the current project and validates the result.
func applyProjectChange(ctx context.Context, q db.Querier, cur db.Project, ch projectChange) (db.ProjectFields, map[string]string, error) {
	next := db.ProjectFields{Name: cur.Name, Key: cur.Key, Description: cur.Description, Status: cur.Status, Policy: cur.Policy}
	fields := map[string]string{}
	if ch.Name != nil {
		next.Name = strings.TrimSpace(*ch.Name)
		projectAddProblem(fields, "name", projectNameProblem(next.Name))
	}
	if ch.Description != nil {
		next.Description = *ch.Description
		projectAddProblem(fields, "description", projectDescriptionProblem(next.Description))
	}
	if ch.Status != nil {
		next.Status = *ch.Status
		if next.Status != db.ProjectActive && next.Status != db.ProjectArchived {
			fields["status"] = `must be "active" or "archived"`
		}
	}
	if ch.Policy != nil {
		next.Policy = ch.Policy.normalize()
		projectPolicyProblems(next.Policy, fields)
		if err := checkPolicyEnvironment(ctx, q, cur.CompanyID, &next.Policy, cur.Policy.EnvironmentID, fields); err != nil {
			return next, nil, err
		}
	}
	return next, fields, nil
}

// projectChangedFields names the fields (other than status) that differ between a project and
// its next values.
func projectChangedFields(cur db.Project, next db.ProjectFields) []string {
	var changed []string
	if cur.Name != next.Name {
		changed = append(changed, "name")
	}
	if cur.Description != next.Description {
		changed = append(changed, "description")
	}
	if cur.Policy != next.Policy {
		changed = append(changed, "execution_policy")
	}
	return changed
}

// auditProjectUpdate records an update and, separately, an archive or unarchive.
func (s *Server) auditProjectUpdate(ctx context.Context, tx pgx.Tx, r *http.Request, a access, before, after db.Project, changed []string) error {
	if len(changed) > 0 {
		if err := s.auditTx(ctx, tx, r, a, "project.updated", "project", after.ID,
			map[string]any{"key": after.Key, "changed": changed}); err != nil {
			return err
		}
	}
	switch {
	case before.Status != after.Status && after.Archived():
		return s.auditTx(ctx, tx, r, a, "project.archived", "project", after.ID, map[string]any{"key": after.Key})
	case before.Status != after.Status:
		return s.auditTx(ctx, tx, r, a, "project.unarchived", "project", after.ID, map[string]any{"key": after.Key})
	}
	return nil
}

// projectAddProblem records msg for field when there is one.
func projectAddProblem(fields map[string]string, field, msg string) {
	if msg != "" {
		fields[field] = msg
	}
}

// ---- JSON API ----

// projectCreateBody is POST /api/companies/{cid}/projects.
type projectCreateBody struct {
	Name            string             `json:"name"`
	Key             string             `json:"key"`
	Description     *string            `json:"description"`
	ExecutionPolicy *projectPolicyJSON `json:"execution_policy"`
	CompanyID       json.RawMessage    `json:"company_id"`
	Status          json.RawMessage    `json:"status"`
}

// projectPatchBody is PATCH /api/projects/{id}: named members replace, execution_policy as a
// whole; status is the archive action; key never changes.
type projectPatchBody struct {
	Name            fieldPatch[string]            `json:"name"`
	Description     fieldPatch[string]            `json:"description"`
	Status          fieldPatch[string]            `json:"status"`
	ExecutionPolicy fieldPatch[projectPolicyJSON] `json:"execution_policy"`
	Key             json.RawMessage               `json:"key"`
	CompanyID       json.RawMessage               `json:"company_id"`
}

// input is the policy a request sent; an absent policy is all defaults.
func (p *projectPolicyJSON) input() projectPolicyInput {
	if p == nil {
		return projectPolicyInput{}
	}
	in := projectPolicyInput{DefaultMode: p.DefaultMode, AllowTaskOverride: p.AllowTaskOverride,
		Strategy: p.Strategy, BranchTemplate: p.BranchTemplate}
	if p.EnvironmentID != nil {
		in.EnvironmentID = *p.EnvironmentID
	}
	return in
}

// errProjectServerOwned refuses a body that sets a field only the server writes.
func errProjectServerOwned(field string) error {
	return badRequest("server_owned_field", fmt.Sprintf("%s is set by the server and cannot be sent.", field))
}

// apiListProjects lists a company's projects by key: ?status=active|archived, limit, cursor.
func (s *Server) apiListProjects(w http.ResponseWriter, r *http.Request, p *principal) error {
	a, err := s.companyAccess(r.Context(), p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	page, err := s.listProjectPage(r, a)
	if err != nil {
		return err
	}
	out := listResponse[projectJSON]{Items: make([]projectJSON, 0, len(page.items)), NextCursor: page.next}
	for _, it := range page.items {
		out.Items = append(out.Items, projectOut(it.Project))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// projectListPage is one page of a company's projects.
type projectListPage struct {
	items []db.ProjectSummary
	next  string
}

// projectCursor is the keyset position of the projects list: the last key shown.
type projectCursor struct {
	Key string `json:"k"`
}

// listProjectPage reads one page of projects from the request's status, limit and cursor.
func (s *Server) listProjectPage(r *http.Request, a access) (projectListPage, error) {
	limit, cursor, err := pageParams(r)
	if err != nil {
		return projectListPage{}, err
	}
	var c projectCursor
	if err := decodeCursor(cursor, &c); err != nil {
		return projectListPage{}, err
	}
	status := r.URL.Query().Get("status")
	if status != "" && status != db.ProjectActive && status != db.ProjectArchived {
		return projectListPage{}, badRequest("bad_status", `status must be "active" or "archived".`)
	}
	items, err := db.ListProjects(r.Context(), s.pool, a.Company.ID, status, c.Key, limit+1)
	if err != nil {
		return projectListPage{}, err
	}
	page := projectListPage{items: items}
	if len(items) > limit {
		page.items = items[:limit]
		page.next = encodeCursor(projectCursor{Key: items[limit-1].Key})
	}
	return page, nil
}

// apiCreateProject creates a project: board members only; 201 with the project.
func (s *Server) apiCreateProject(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	a, err := s.companyAccess(ctx, p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	if err := s.requireManage(r, a, "project.create", "company", a.Company.ID); err != nil {
		return err
	}
	var body projectCreateBody
	if err := decodeJSON(w, r, &body); err != nil {
		return err
	}
	switch {
	case body.CompanyID != nil:
		return errProjectServerOwned("company_id")
	case body.Status != nil:
		return errProjectServerOwned("status (new projects are active)")
	}
	in := projectInput{Name: body.Name, Key: body.Key, Policy: body.ExecutionPolicy.input()}
	if body.Description != nil {
		in.Description = *body.Description
	}
	proj, err := s.createProject(ctx, r, a, in)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, projectOut(proj))
	return nil
}

// apiPatchProject changes a project: board members only; 200 with the project.
func (s *Server) apiPatchProject(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "projects", id, "project.update", "project")
	if err != nil {
		return err
	}
	var body projectPatchBody
	if err := decodeJSON(w, r, &body); err != nil {
		return err
	}
	switch {
	case body.Key != nil:
		return badRequest("key_immutable", "A project's key cannot change after it is created.")
	case body.CompanyID != nil:
		return errProjectServerOwned("company_id")
	}
	var ch projectChange
	if body.Name.Set {
		ch.Name = &body.Name.Value
	}
	if body.Description.Set {
		ch.Description = &body.Description.Value
	}
	if body.Status.Set {
		ch.Status = &body.Status.Value
	}
	if body.ExecutionPolicy.Set {
		pol := body.ExecutionPolicy.Value.input()
		ch.Policy = &pol
	}
	proj, err := s.updateProject(ctx, r, a, id, ch)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, projectOut(proj))
	return nil
}

// ---- Pages and forms ----

// projectsPage is a company's projects list, with the new-project form for board members.
func (s *Server) projectsPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	a, err := s.companyAccess(r.Context(), p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	d, err := s.projectsPageData(r, a)
	if err != nil {
		return err
	}
	return s.render(w, r, views.ProjectsPage(s.companyFrame(r, a, "Projects", "projects"), d))
}

// projectsPageData reads the projects list page and an empty new-project form.
func (s *Server) projectsPageData(r *http.Request, a access) (views.ProjectsPageData, error) {
	page, err := s.listProjectPage(r, a)
	if err != nil {
		return views.ProjectsPageData{}, err
	}
	envs, err := s.projectEnvOptions(r.Context(), a.Company.ID, "")
	if err != nil {
		return views.ProjectsPageData{}, err
	}
	d := views.ProjectsPageData{CompanyID: a.Company.ID, NextCursor: page.next, Paged: r.URL.Query().Get("cursor") != "",
		CanManage: a.canManage(), HasEnvironments: len(envs) > 0,
		Form: views.ProjectForm{CompanyID: a.Company.ID, Values: projectFormValuesOf(db.Project{
			Policy: projectPolicyInput{}.normalize()}), Environments: envs}}
	if len(envs) == 1 {
		d.Form.Values.EnvironmentID = envs[0].ID // the only choice is the likely one
	}
	for _, it := range page.items {
		d.Projects = append(d.Projects, views.ProjectRow{ID: it.ID, Key: it.Key, Name: it.Name,
			Status: it.Status, Workspaces: it.Workspaces, Tasks: it.Tasks})
	}
	return d, nil
}

// projectEnvOptions lists the environments a policy form offers: the company's active ones,
// plus the one the policy names now if it was archived since.
func (s *Server) projectEnvOptions(ctx context.Context, companyID, current string) ([]views.ProjectEnvOption, error) {
	envs, err := db.PolicyEnvironments(ctx, s.pool, companyID, current != "")
	if err != nil {
		return nil, err
	}
	var out []views.ProjectEnvOption
	for _, e := range envs {
		switch {
		case e.Status == "active":
			out = append(out, views.ProjectEnvOption{ID: e.ID, Name: e.Name, Driver: e.Driver})
		case e.ID == current:
			out = append(out, views.ProjectEnvOption{ID: e.ID, Name: e.Name + ", archived", Driver: e.Driver})
		}
	}
	return out, nil
}

// createProjectForm handles the new-project form: on success the browser goes to the new
// project; refused values re-render the form with their messages (422, or 409 for a taken key).
func (s *Server) createProjectForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	a, err := s.companyAccess(ctx, p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	if err := s.requireManage(r, a, "project.create", "company", a.Company.ID); err != nil {
		return err
	}
	if err := readProjectForm(w, r); err != nil {
		return err
	}
	vals := projectFormValuesFrom(r)
	proj, err := s.createProject(ctx, r, a, projectInputFrom(vals))
	if fields, status, ok := projectFormRefusal(err); ok {
		envs, err := s.projectEnvOptions(ctx, a.Company.ID, "")
		if err != nil {
			return err
		}
		form := views.ProjectForm{CompanyID: a.Company.ID, Values: vals, Errors: fields, Environments: envs}
		if isHTMX(r) {
			return s.renderStatus(w, r, status, views.ProjectCreateForm(form))
		}
		d, err := s.projectsPageData(r, a)
		if err != nil {
			return err
		}
		d.Form = form
		return s.renderStatus(w, r, status, views.ProjectsPage(s.companyFrame(r, a, "Projects", "projects"), d))
	}
	if err != nil {
		return err
	}
	projectSeeOther(w, r, "/projects/"+proj.ID)
	return nil
}

// projectPage shows a project: its policy (editable by board members), its workspaces and its
// tasks (loaded from the tasks page by htmx, with a plain link as the fallback).
func (s *Server) projectPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.objectAccess(ctx, p, "projects", id)
	if err != nil {
		return err
	}
	proj, err := db.ProjectByID(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	d, err := s.projectPageData(ctx, a, proj)
	if err != nil {
		return err
	}
	return s.render(w, r, views.ProjectPage(s.companyFrame(r, a, proj.Name, "projects"), d))
}

// projectPageData gathers a project's page: policy view, edit form, workspaces section.
func (s *Server) projectPageData(ctx context.Context, a access, proj db.Project) (views.ProjectPageData, error) {
	envs, err := db.PolicyEnvironments(ctx, s.pool, a.Company.ID, true)
	if err != nil {
		return views.ProjectPageData{}, err
	}
	options, err := s.projectEnvOptions(ctx, a.Company.ID, proj.Policy.EnvironmentID)
	if err != nil {
		return views.ProjectPageData{}, err
	}
	ws, err := s.projectWorkspacesData(ctx, a, proj)
	if err != nil {
		return views.ProjectPageData{}, err
	}
	editable := a.canManage() && !proj.Archived()
	return views.ProjectPageData{
		Project:    projectViewOf(proj, envs),
		CanManage:  a.canManage(),
		Editable:   editable,
		Edit:       views.ProjectForm{CompanyID: proj.CompanyID, ProjectID: proj.ID, Values: projectFormValuesOf(proj), Environments: options},
		Workspaces: ws,
	}, nil
}

// projectViewOf phrases a project for its page, naming its environment and what is wrong with it.
func projectViewOf(p db.Project, envs []db.PolicyEnvironment) views.ProjectView {
	v := views.ProjectView{ID: p.ID, CompanyID: p.CompanyID, Name: p.Name, Key: p.Key, Description: p.Description,
		Status: p.Status, DefaultMode: p.Policy.DefaultMode, AllowTaskOverride: p.Policy.AllowTaskOverride,
		EnvironmentID: p.Policy.EnvironmentID, Strategy: p.Policy.Strategy, BranchTemplate: p.Policy.BranchTemplate}
	if v.EnvironmentID == "" {
		return v
	}
	v.EnvironmentNote = "missing: it was deleted"
	for _, e := range envs {
		if e.ID == v.EnvironmentID {
			v.EnvironmentName, v.EnvironmentNote = e.Name, ""
			if e.Status != "active" {
				v.EnvironmentNote = "archived"
			}
		}
	}
	return v
}

// updateProjectForm handles a project's edit form (name, description, policy).
func (s *Server) updateProjectForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "projects", id, "project.update", "project")
	if err != nil {
		return err
	}
	if err := readProjectForm(w, r); err != nil {
		return err
	}
	vals := projectFormValuesFrom(r)
	in := projectInputFrom(vals)
	_, err = s.updateProject(ctx, r, a, id, projectChange{Name: &in.Name, Description: &in.Description, Policy: &in.Policy})
	if fields, status, ok := projectFormRefusal(err); ok {
		proj, err := db.ProjectByID(ctx, s.pool, a.Company.ID, id)
		if err != nil {
			return err
		}
		d, err := s.projectPageData(ctx, a, proj)
		if err != nil {
			return err
		}
		vals.Key = proj.Key
		d.Edit.Values, d.Edit.Errors = vals, fields
		if isHTMX(r) {
			return s.renderStatus(w, r, status, views.ProjectEditForm(d.Edit))
		}
		return s.renderStatus(w, r, status, views.ProjectPage(s.companyFrame(r, a, proj.Name, "projects"), d))
	}
	if err != nil {
		return err
	}
	projectSeeOther(w, r, "/projects/"+id)
	return nil
}

// projectStatusForm handles the archive and unarchive buttons.
func (s *Server) projectStatusForm(status string) func(http.ResponseWriter, *http.Request, *principal) error {
	action := "project.archive"
	if status == db.ProjectActive {
		action = "project.unarchive"
	}
	return func(w http.ResponseWriter, r *http.Request, p *principal) error {
		ctx := r.Context()
		id := r.PathValue("id")
		a, err := s.objectAccess(ctx, p, "projects", id)
		if err != nil {
			return err
		}
		if err := s.requireManage(r, a, action, "project", id); err != nil {
			return err
		}
		if _, err := s.updateProject(ctx, r, a, id, projectChange{Status: &status}); err != nil {
			return err
		}
		projectSeeOther(w, r, "/projects/"+id)
		return nil
	}
}

// readProjectForm parses a urlencoded form body of at most 1 MiB.
func readProjectForm(w http.ResponseWriter, r *http.Request) error {
	r.Body = http.MaxBytesReader(w, r.Body, maxJSONBody)
	if err := r.ParseForm(); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return &httpError{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large", Message: "The form is larger than 1 MiB."}
		}
		return badRequest("bad_form", "The form could not be read.")
	}
	return nil
}

// projectFormText is a textarea's value with browser line endings normalized.
func projectFormText(r *http.Request, name string) string {
	return strings.ReplaceAll(r.PostForm.Get(name), "\r\n", "\n")
}

// projectFormBool reads a checkbox.
func projectFormBool(r *http.Request, name string) bool {
	v := r.PostForm.Get(name)
	return v == "true" || v == "on" || v == "1"
}

// projectFormValuesFrom reads the project form's fields as typed.
func projectFormValuesFrom(r *http.Request) views.ProjectFormValues {
	return views.ProjectFormValues{Name: r.PostForm.Get("name"), Key: r.PostForm.Get("key"),
		Description: projectFormText(r, "description"), DefaultMode: r.PostForm.Get("default_mode"),
		AllowTaskOverride: projectFormBool(r, "allow_task_override"), EnvironmentID: r.PostForm.Get("environment_id"),
		Strategy: r.PostForm.Get("strategy"), BranchTemplate: r.PostForm.Get("branch_template")}
}

// projectFormValuesOf fills a project form from a stored project.
func projectFormValuesOf(p db.Project) views.ProjectFormValues {
	return views.ProjectFormValues{Name: p.Name, Key: p.Key, Description: p.Description,
		DefaultMode: p.Policy.DefaultMode, AllowTaskOverride: p.Policy.AllowTaskOverride,
		EnvironmentID: p.Policy.EnvironmentID, Strategy: p.Policy.Strategy, BranchTemplate: p.Policy.BranchTemplate}
}

// projectInputFrom turns form values into the input the API also builds.
func projectInputFrom(v views.ProjectFormValues) projectInput {
	return projectInput{Name: v.Name, Key: v.Key, Description: v.Description, Policy: projectPolicyInput{
		DefaultMode: v.DefaultMode, AllowTaskOverride: v.AllowTaskOverride, EnvironmentID: v.EnvironmentID,
		Strategy: v.Strategy, BranchTemplate: v.BranchTemplate}}
}

// projectFormRefusal extracts what a form shows next to its fields: validation messages (422)
// or a conflict that names a field (409).
func projectFormRefusal(err error) (map[string]string, int, bool) {
	var he *httpError
	if errors.As(err, &he) && len(he.Fields) > 0 {
		return he.Fields, he.Status, true
	}
	return nil, 0, false
}

// projectSeeOther sends the browser to url after a successful form post: a 303, or for htmx an
// HX-Redirect so the whole page moves.
func projectSeeOther(w http.ResponseWriter, r *http.Request, url string) {
	if isHTMX(r) {
		w.Header().Set("HX-Redirect", url)
		w.WriteHeader(http.StatusOK)
		return
	}
	http.Redirect(w, r, url, http.StatusSeeOther)
}
