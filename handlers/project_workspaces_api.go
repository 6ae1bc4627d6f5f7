package handlers

import (
	"encoding/json"
	"net/http"
	"time"

	"berth/db"
)

// Project workspaces in the JSON API.

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
		SourceType: w.SourceType, Source: w.Source, DefaultRef: optional(w.DefaultRef),
		SetupCommand: optional(w.SetupCommand), CleanupCommand: optional(w.CleanupCommand),
		IsPrimary: w.IsPrimary, Services: services, CreatedAt: w.CreatedAt.UTC(), UpdatedAt: w.UpdatedAt.UTC()}
}

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
		return errServerOwned("company_id", "")
	case body.ProjectID != nil:
		return errServerOwned("project_id", "it is the project in the URL")
	}
	pw, err := s.createProjectWorkspace(ctx, r, a, id, projectWorkspaceInput{Name: body.Name, SourceType: body.SourceType,
		Source: body.Source, DefaultRef: deref(body.DefaultRef), SetupCommand: deref(body.SetupCommand),
		CleanupCommand: deref(body.CleanupCommand), IsPrimary: body.IsPrimary, Services: body.Services})
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
		return errServerOwned("company_id", "")
	case body.ProjectID != nil:
		return errServerOwned("project_id", "a workspace cannot move to another project")
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
