package handlers

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/views"
)

// Source roots (docs/decisions.md "Local sources"): the host directories under which board
// members may point local project workspace sources. BERTH_SOURCE_ROOTS stays in force (the
// bootstrap default, shown read-only); instance administrators add and remove more on
// /admin/source-roots, stored in the database and audited. A board member refused a directory
// can ask for it: the request waits on that page until an administrator approves (the path
// becomes a root) or dismisses it.

// effectiveSourceRoots is BERTH_SOURCE_ROOTS plus the stored roots.
func (s *Server) effectiveSourceRoots(ctx context.Context) ([]string, error) {
	stored, err := db.SourceRootPaths(ctx, s.pool)
	if err != nil {
		return nil, err
	}
	return append(append([]string(nil), s.sourceRoots...), stored...), nil
}

// errSourceOutsideRoots is the refusal of a board member's local source outside every root.
func errSourceOutsideRoots(source string) error {
	return &httpError{Status: http.StatusUnprocessableEntity, Code: "source_outside_roots",
		Message: "Some fields are not valid.",
		Fields: map[string]string{"source": "This local directory is outside the directories board members may use. " +
			"Ask an instance administrator to allow it (the button below sends the request; scripts POST " +
			"/api/projects/{id}/source-root-requests), or have them set this source themselves; a file:// URL is a local path too."},
		Extra: map[string]any{"path": requestablePath(source)}}
}

// requestablePath is the directory a refused source names, cleaned ("" when it is not an
// absolute path).
func requestablePath(source string) string {
	p := filepath.Clean(strings.TrimPrefix(source, "file://"))
	if !filepath.IsAbs(p) || len(p) > 4096 || strings.ContainsRune(p, 0) {
		return ""
	}
	return p
}

// sourceRequestOf is the directory an outside-the-roots refusal offers to request, "" for any
// other error.
func sourceRequestOf(err error) string {
	var he *httpError
	if errors.As(err, &he) && he.Code == "source_outside_roots" {
		p, _ := he.Extra["path"].(string)
		return p
	}
	return ""
}

// openSourceRootRequest records a board member's request for path in the project's company
// (audited there); the open request for the same path is returned rather than a second one.
func (s *Server) openSourceRootRequest(ctx context.Context, r *http.Request, a access, projectID, path string) (req db.SourceRootRequest, created bool, err error) {
	p := requestablePath(path)
	if p == "" || path == "" {
		return db.SourceRootRequest{}, false, invalid(map[string]string{"path": "An absolute directory path, at most 4096 bytes."})
	}
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		req, created, err = db.OpenSourceRootRequest(ctx, tx, a.Company.ID, projectID, a.P.User.ID, p)
		if err != nil || !created {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "source_root_request.opened", "project", projectID, map[string]any{"path": p})
	})
	return req, created, err
}

// sourceRootRequestForm is POST /projects/{id}/source-root-requests (board members).
func (s *Server) sourceRootRequestForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "projects", id, "source_root_request.open", "project")
	if err != nil {
		return err
	}
	form, err := readForm(w, r, maxFormBody)
	if err != nil {
		return err
	}
	if _, _, err := s.openSourceRootRequest(r.Context(), r, a, id, form.Get("path")); err != nil {
		return err
	}
	redirectAfterForm(w, r, "/projects/"+id+"?flash=request_sent")
	return nil
}

// sourceRootRequestJSON is a request in the API.
type sourceRootRequestJSON struct {
	ID        string `json:"id"`
	CompanyID string `json:"company_id"`
	ProjectID string `json:"project_id"`
	Path      string `json:"path"`
	Status    string `json:"status"`
}

// sourceRootRequestAPI is POST /api/projects/{id}/source-root-requests {path} → 201 (or 200 with
// the request already open for that path).
func (s *Server) sourceRootRequestAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "projects", id, "source_root_request.open", "project")
	if err != nil {
		return err
	}
	var in struct {
		Path string `json:"path"`
	}
	if err := decodeJSON(w, r, &in); err != nil {
		return err
	}
	req, created, err := s.openSourceRootRequest(r.Context(), r, a, id, in.Path)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, sourceRootRequestJSON{ID: req.ID, CompanyID: req.CompanyID, ProjectID: req.ProjectID, Path: req.Path, Status: req.Status})
	return nil
}

// sourceRootsPage is GET /admin/source-roots (instance admins; anyone else 404).
func (s *Server) sourceRootsPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	return s.renderSourceRoots(w, r, p, http.StatusOK, views.SourceRootForm{})
}

func (s *Server) renderSourceRoots(w http.ResponseWriter, r *http.Request, p *principal, status int, form views.SourceRootForm) error {
	if !isInstanceAdmin(p) {
		return errNotFound
	}
	ctx := r.Context()
	stored, err := db.SourceRoots(ctx, s.pool)
	if err != nil {
		return err
	}
	reqs, err := db.SourceRootRequests(ctx, s.pool)
	if err != nil {
		return err
	}
	d := views.SourceRootsData{Env: s.sourceRoots, Form: form}
	for _, sr := range stored {
		d.Stored = append(d.Stored, views.SourceRootRow{ID: sr.ID, Path: sr.Path, Note: sr.Note, CreatedBy: sr.CreatedBy, CreatedAt: sr.CreatedAt})
	}
	for _, q := range reqs {
		d.Requests = append(d.Requests, views.SourceRootRequestRow{ID: q.ID, CompanyID: q.CompanyID, CompanyName: q.CompanyName,
			ProjectID: q.ProjectID, ProjectName: q.ProjectName, Requester: q.Requester, Path: q.Path, Status: q.Status, CreatedAt: q.CreatedAt})
	}
	f := s.frame(r, "Source roots", "admin-source-roots")
	return s.renderStatus(w, r, status, views.SourceRootsPage(f, d))
}

// addSourceRoot stores a root (instance admins), audited at instance level.
func (s *Server) addSourceRoot(ctx context.Context, r *http.Request, p *principal, path, note string) (db.SourceRoot, error) {
	clean := requestablePath(strings.TrimSpace(path))
	errs := map[string]string{}
	if clean == "" {
		errs["path"] = "An absolute directory path, such as /srv/repos."
	} else if clean == "/" {
		errs["path"] = "Not the whole host: name the directory that holds the repositories."
	}
	if len(note) > 500 {
		errs["note"] = "At most 500 characters."
	}
	if len(errs) > 0 {
		return db.SourceRoot{}, invalid(errs)
	}
	var root db.SourceRoot
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		root, err = db.AddSourceRoot(ctx, tx, clean, strings.TrimSpace(note), p.User.ID)
		if errors.Is(err, db.ErrConflict) {
			return &httpError{Status: http.StatusConflict, Code: "source_root_exists", Message: clean + " is a source root already."}
		}
		if err != nil {
			return err
		}
		return db.InsertAudit(ctx, tx, db.AuditEvent{ActorType: db.ActorUser, ActorID: p.User.ID, ActorLabel: p.User.Email,
			Action: "source_root.added", TargetType: "source_root", TargetID: root.ID, Details: map[string]any{"path": clean}, IP: clientIP(r)})
	})
	return root, err
}

// addSourceRootForm is POST /admin/source-roots.
func (s *Server) addSourceRootForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	if !isInstanceAdmin(p) {
		return errNotFound
	}
	form, err := readForm(w, r, maxFormBody)
	if err != nil {
		return err
	}
	_, err = s.addSourceRoot(r.Context(), r, p, form.Get("path"), form.Get("note"))
	if he, refused := formRefusal(err); refused {
		return s.renderSourceRoots(w, r, p, he.Status, views.SourceRootForm{Path: form.Get("path"), Note: form.Get("note"), Errors: formErrors(he)})
	}
	if err != nil {
		return err
	}
	redirectAfterForm(w, r, "/admin/source-roots?flash=source_root_added")
	return nil
}

// removeSourceRootForm is POST /admin/source-roots/{id}/remove. Sources already saved inside it
// stay as they are (they are checked when saved, not when used).
func (s *Server) removeSourceRootForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	if !isInstanceAdmin(p) {
		return errNotFound
	}
	if _, err := readForm(w, r, maxFormBody); err != nil {
		return err
	}
	ctx := r.Context()
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		root, err := db.DeleteSourceRoot(ctx, tx, r.PathValue("id"))
		if err != nil {
			return err
		}
		return db.InsertAudit(ctx, tx, db.AuditEvent{ActorType: db.ActorUser, ActorID: p.User.ID, ActorLabel: p.User.Email,
			Action: "source_root.removed", TargetType: "source_root", TargetID: root.ID, Details: map[string]any{"path": root.Path}, IP: clientIP(r)})
	})
	if err != nil {
		return err
	}
	redirectAfterForm(w, r, "/admin/source-roots?flash=source_root_removed")
	return nil
}

// resolveSourceRootRequestForm is POST /admin/source-root-requests/{id}/approve|dismiss:
// approving adds the path as a root (unless one covers it already) in the same transaction;
// both are audited in the request's company, so its board sees the answer.
func (s *Server) resolveSourceRootRequestForm(approve bool) func(http.ResponseWriter, *http.Request, *principal) error {
	return func(w http.ResponseWriter, r *http.Request, p *principal) error {
		if !isInstanceAdmin(p) {
			return errNotFound
		}
		if _, err := readForm(w, r, maxFormBody); err != nil {
			return err
		}
		ctx := r.Context()
		status, flash := "dismissed", "request_dismissed"
		if approve {
			status, flash = "approved", "request_approved"
		}
		err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
			req, err := db.ResolveSourceRootRequest(ctx, tx, r.PathValue("id"), status, p.User.ID)
			if errors.Is(err, db.ErrConflict) {
				return &httpError{Status: http.StatusConflict, Code: "request_resolved", Message: "This request was answered already."}
			}
			if err != nil {
				return err
			}
			if approve {
				if _, err := db.AddSourceRoot(ctx, tx, req.Path, "requested for "+req.CompanyName, p.User.ID); err != nil && !errors.Is(err, db.ErrConflict) {
					return err
				}
			}
			return db.InsertAudit(ctx, tx, db.AuditEvent{CompanyID: req.CompanyID, ActorType: db.ActorUser, ActorID: p.User.ID,
				ActorLabel: p.User.Email, Action: "source_root_request." + status, TargetType: "project", TargetID: req.ProjectID,
				Details: map[string]any{"path": req.Path}, IP: clientIP(r)})
		})
		if err != nil {
			return err
		}
		redirectAfterForm(w, r, "/admin/source-roots?flash="+flash)
		return nil
	}
}

// sourceRootsAPI is GET /api/source-roots (instance admins; anyone else 404): the roots in force.
func (s *Server) sourceRootsAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	if !isInstanceAdmin(p) {
		return errNotFound
	}
	stored, err := db.SourceRoots(r.Context(), s.pool)
	if err != nil {
		return err
	}
	type rootJSON struct {
		ID     string `json:"id,omitempty"`
		Path   string `json:"path"`
		Origin string `json:"origin"` // "environment" (BERTH_SOURCE_ROOTS) or "database"
	}
	out := listResponse[rootJSON]{Items: []rootJSON{}}
	for _, e := range s.sourceRoots {
		out.Items = append(out.Items, rootJSON{Path: e, Origin: "environment"})
	}
	for _, sr := range stored {
		out.Items = append(out.Items, rootJSON{ID: sr.ID, Path: sr.Path, Origin: "database"})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
