package handlers

import (
	"bytes"
	"encoding/json"
	"net/http"
	"time"

	"berth/db"
)

// Projects in the JSON API: the project object, the POST and PATCH bodies, and the handlers.

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
		Description: optional(p.Description), Status: p.Status, ExecutionPolicy: projectPolicyOut(p.Policy),
		CreatedAt: p.CreatedAt.UTC(), UpdatedAt: p.UpdatedAt.UTC()}
}

// projectPolicyOut is a stored policy as the API shows it (no environment as null).
func projectPolicyOut(p db.ExecutionPolicy) projectPolicyJSON {
	return projectPolicyJSON{DefaultMode: p.DefaultMode, AllowTaskOverride: p.AllowTaskOverride,
		EnvironmentID: optional(p.EnvironmentID), Strategy: p.Strategy, BranchTemplate: p.BranchTemplate}
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
		return errServerOwned("company_id", "")
	case body.Status != nil:
		return errServerOwned("status", "new projects are active")
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
		return errServerOwned("company_id", "")
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
