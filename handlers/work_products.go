package handlers

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"

	"berth/db"
)

// workProductRequest is the body of POST /api/tasks/{id}/work-products.
type workProductRequest struct {
	Kind                 string         `json:"kind"`
	Ref                  string         `json:"ref"`
	URL                  string         `json:"url"`
	Path                 string         `json:"path"`
	Metadata             map[string]any `json:"metadata"`
	ExecutionWorkspaceID string         `json:"execution_workspace_id"`
}

// maxWorkProductMetadata bounds a work product's metadata document.
const maxWorkProductMetadata = 16 << 10

// validate checks the body: a known kind with the field it needs (branch and commit: ref;
// preview_url: an absolute http(s) url; artifact and file: a relative path or a ref).
func (in workProductRequest) validate() error {
	f := map[string]string{}
	switch in.Kind {
	case "branch", "commit":
		if in.Ref == "" {
			f["ref"] = "A " + in.Kind + " needs its ref."
		}
	case "preview_url":
		u, err := url.Parse(in.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			f["url"] = "Give an absolute http or https URL."
		}
	case "artifact", "file":
		if in.Path == "" && in.Ref == "" {
			f["path"] = "Give the path (relative to the workspace) or a ref."
		}
	default:
		f["kind"] = "kind must be branch, commit, preview_url, artifact or file."
	}
	if len(in.Ref) > 255 || strings.ContainsRune(in.Ref, 0) {
		f["ref"] = "At most 255 bytes, no NUL."
	}
	if len(in.URL) > 2048 {
		f["url"] = "At most 2048 bytes."
	}
	if p := in.Path; len(p) > 4096 || strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) || strings.Contains(p, "\\") ||
		p == ".." || strings.HasPrefix(p, "../") || strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") {
		f["path"] = "Give a path relative to the workspace (no leading /, no .., no \\, at most 4096 bytes)."
	}
	if b, _ := json.Marshal(in.Metadata); len(b) > maxWorkProductMetadata {
		f["metadata"] = "At most 16 KiB of JSON."
	}
	if len(f) > 0 {
		return invalid(f)
	}
	return nil
}

// createWorkProductAPI is POST /api/tasks/{id}/work-products (board members; a run token for
// its own task, recorded as its run's product in its workspace) → 201 with the product. An
// execution_workspace_id must be of the task's company (a run token: its own workspace, else
// 403). Audited as work_product.created.
func (s *Server) createWorkProductAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.manageObjectOrRun(r, p, "tasks", id, "work_product.create", "task")
	if err != nil {
		return err
	}
	var in workProductRequest
	if err := decodeJSON(w, r, &in); err != nil {
		return err
	}
	if err := in.validate(); err != nil {
		return err
	}
	wp := db.WorkProduct{CompanyID: a.Company.ID, TaskID: id, Kind: in.Kind, Ref: in.Ref, URL: in.URL, Path: in.Path,
		Metadata: in.Metadata, ExecutionWorkspaceID: strings.ToLower(in.ExecutionWorkspaceID)}
	if p.Run != nil {
		if wp.ExecutionWorkspaceID != "" && wp.ExecutionWorkspaceID != p.Run.WorkspaceID {
			s.auditRunDenied(r.Context(), p, "object", map[string]any{"table": "execution_workspaces", "id": wp.ExecutionWorkspaceID})
			return errRunTokenForbidden
		}
		wp.RunID, wp.ExecutionWorkspaceID = p.Run.ID, p.Run.WorkspaceID
	} else if wp.ExecutionWorkspaceID != "" {
		if cid, err := db.CompanyOf(r.Context(), s.pool, "execution_workspaces", wp.ExecutionWorkspaceID); err != nil || cid != a.Company.ID {
			return invalid(map[string]string{"execution_workspace_id": "No such execution workspace."})
		}
	}
	var out db.WorkProduct
	err = db.InTx(r.Context(), s.pool, func(tx pgx.Tx) error {
		var err error
		if out, err = db.CreateWorkProduct(r.Context(), tx, wp); err != nil {
			return err
		}
		return s.auditTx(r.Context(), tx, r, a, "work_product.created", "task", id, map[string]any{"work_product_id": out.ID, "kind": out.Kind})
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, newWorkProductJSON(out))
	return nil
}
