package handlers

import (
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"unicode/utf8"

	"berth/workspace"
)

// Writing file resources (docs/api.md "File resources"; the MCP tools file_write, file_edit and
// file_delete call these routes). The read rules hold (workspace.Files: relative paths, no
// escape through .. or a symlink, the deny list with .git and secrets, regular single-link files
// only), and on top of them:
//
//   - Who: board members of the task's company, and a live run token on its own task; viewers
//     get 403 (audited as file_resource.write.denied).
//   - Where: an execution workspace root only. A project workspace root is the user's own
//     source and is read-only here (403 read_only_root); a run token writes only into its own
//     run's workspace (403); a sealed attempt's workspace takes no writes (409
//     workspace_sealed).
//   - Size: at most workspace.MaxWriteBytes (1 MiB) stored per write or edit (413).
//
// Every write, edit and delete is audited (file_resource.written, .edited, .deleted) with the
// root, the path, the size and the sha256 of what was stored, never the content. Writes spend
// the caller's file-request tokens like reads.

var errReadOnlyRoot = &httpError{Status: http.StatusForbidden, Code: "read_only_root",
	Message: "Only an execution workspace's files can be changed through Berth; project workspace roots are read-only."}

// errRootOnOtherNode refuses what is not forwarded between nodes yet (file_resources_forward.go
// forwards list, preview and download): changes and ranged reads of a root on another node's disk.
var errRootOnOtherNode = &httpError{Status: http.StatusConflict, Code: "root_on_other_node",
	Message: "That workspace lives on another node's disk: changes and ranged reads are served only by a web node on that node."}

var errRunOtherWorkspace = &httpError{Status: http.StatusForbidden, Code: "forbidden",
	Message: "A run token changes files in its own run's workspace only."}

// fileWriteRequest is the body of PUT …/file-resources/content.
type fileWriteRequest struct {
	Root       string `json:"root"`
	Path       string `json:"path"`
	Content    string `json:"content"`
	Encoding   string `json:"encoding"` // "utf8" (default) or "base64"
	CreateDirs bool   `json:"create_dirs"`
}

// fileEditRequest is the body of POST …/file-resources/edit.
type fileEditRequest struct {
	Root                 string `json:"root"`
	Path                 string `json:"path"`
	OldString            string `json:"old_string"`
	NewString            string `json:"new_string"`
	ExpectedReplacements int    `json:"expected_replacements"` // 0 means 1
}

// writableRoot authorizes a change to a task's files and picks the execution workspace root it
// names ("" for the task's first root).
func (s *Server) writableRoot(r *http.Request, p *principal, taskID, rootName string, in fileQuery) (access, taskFiles, fileRoot, error) {
	a, err := s.manageObjectOrRun(r, p, "tasks", taskID, "file_resource.write", "task")
	if err != nil {
		return access{}, taskFiles{}, fileRoot{}, err
	}
	tf, root, err := s.taskFileRoot(r.Context(), a, taskID, rootName)
	if err != nil {
		return access{}, taskFiles{}, fileRoot{}, err
	}
	wsID, ok := strings.CutPrefix(root.Name, executionWorkspaceRootPrefix)
	switch {
	case !ok:
		s.auditFileDenied(r, a, taskID, root.Name, in, "read_only_root")
		return access{}, taskFiles{}, fileRoot{}, errReadOnlyRoot
	case p.Run != nil && wsID != p.Run.WorkspaceID:
		s.auditFileDenied(r, a, taskID, root.Name, in, "other_workspace")
		return access{}, taskFiles{}, fileRoot{}, errRunOtherWorkspace
	}
	if root.node != "" {
		return access{}, taskFiles{}, fileRoot{}, errRootOnOtherNode
	}
	if err := refuseSealed(r.Context(), s.pool, a, wsID); err != nil {
		return access{}, taskFiles{}, fileRoot{}, err
	}
	return a, tf, root, nil
}

// writeFileError maps what only writes meet, then the read refusals (fileRefusal).
func (s *Server) writeFileError(r *http.Request, a access, taskID, root string, in fileQuery, err error) error {
	var mc *workspace.MatchCountError
	switch {
	case errors.As(err, &mc):
		return &httpError{Status: http.StatusConflict, Code: "match_count",
			Message: "The search text does not occur the expected number of times; nothing was changed. Give more context to make it unique, or set expected_replacements.",
			Extra:   map[string]any{"matches": mc.Matches, "expected": mc.Expected}}
	case errors.Is(err, workspace.ErrChanged):
		return &httpError{Status: http.StatusConflict, Code: "file_changed", Message: "The file changed while it was being edited; nothing was changed. Read it again and retry."}
	case errors.Is(err, workspace.ErrTooLarge):
		return &httpError{Status: http.StatusRequestEntityTooLarge, Code: "file_too_large", Message: "Writes and edits store at most 1 MiB."}
	}
	return s.fileRefusal(r, a, taskID, root, in, err)
}

// fileWriteAPI is PUT /api/tasks/{id}/file-resources/content: create or replace a file → 200
// {path, size, sha256, created}.
func (s *Server) fileWriteAPI(lim *rateLimiter) func(http.ResponseWriter, *http.Request, *principal) error {
	return func(w http.ResponseWriter, r *http.Request, p *principal) error {
		id := r.PathValue("id")
		var body fileWriteRequest
		if err := decodeJSON(w, r, &body); err != nil {
			return err
		}
		data := []byte(body.Content)
		switch body.Encoding {
		case "", "utf8":
			if !utf8.ValidString(body.Content) {
				return badRequest("bad_content", "content is not valid UTF-8: send it with encoding base64.")
			}
		case "base64":
			var err error
			if data, err = base64.StdEncoding.DecodeString(body.Content); err != nil {
				return badRequest("bad_content", "content is not valid base64.")
			}
		default:
			return badRequest("bad_encoding", "encoding must be utf8 or base64.")
		}
		in := fileQuery{Op: "write", Root: body.Root, Path: body.Path}
		a, tf, root, err := s.writableRoot(r, p, id, body.Root, in)
		if err != nil {
			return err
		}
		if err := s.admitFileRead(w, r, a, lim, id, root.Name, in); err != nil {
			return err
		}
		res, err := tf.files.Write(r.Context(), root.Name, body.Path, data, workspace.WriteOptions{CreateDirs: body.CreateDirs})
		if err != nil {
			return s.writeFileError(r, a, id, root.Name, in, err)
		}
		s.auditFileChange(r, a, id, root.Name, "file_resource.written", res)
		writeJSON(w, http.StatusOK, res)
		return nil
	}
}

// fileEditAPI is POST /api/tasks/{id}/file-resources/edit: replace old_string with new_string
// exactly expected_replacements times (default 1) → 200 {path, size, sha256, replacements}; any
// other count → 409 match_count with matches and expected, nothing changed.
func (s *Server) fileEditAPI(lim *rateLimiter) func(http.ResponseWriter, *http.Request, *principal) error {
	return func(w http.ResponseWriter, r *http.Request, p *principal) error {
		id := r.PathValue("id")
		var body fileEditRequest
		if err := decodeJSON(w, r, &body); err != nil {
			return err
		}
		if body.OldString == "" {
			return invalid(map[string]string{"old_string": "Give the text to replace."})
		}
		if body.ExpectedReplacements < 0 || body.ExpectedReplacements > 10000 {
			return invalid(map[string]string{"expected_replacements": "Give 1 to 10000 (default 1)."})
		}
		in := fileQuery{Op: "edit", Root: body.Root, Path: body.Path}
		a, tf, root, err := s.writableRoot(r, p, id, body.Root, in)
		if err != nil {
			return err
		}
		if err := s.admitFileRead(w, r, a, lim, id, root.Name, in); err != nil {
			return err
		}
		res, err := tf.files.Edit(r.Context(), root.Name, body.Path, body.OldString, body.NewString, body.ExpectedReplacements)
		if err != nil {
			return s.writeFileError(r, a, id, root.Name, in, err)
		}
		s.auditFileChange(r, a, id, root.Name, "file_resource.edited", res)
		writeJSON(w, http.StatusOK, res)
		return nil
	}
}

// fileDeleteAPI is DELETE /api/tasks/{id}/file-resources/content?root=&path=: remove a regular
// file → 200 {path, deleted: true}.
func (s *Server) fileDeleteAPI(lim *rateLimiter) func(http.ResponseWriter, *http.Request, *principal) error {
	return func(w http.ResponseWriter, r *http.Request, p *principal) error {
		id := r.PathValue("id")
		q := r.URL.Query()
		in := fileQuery{Op: "delete", Root: q.Get("root"), Path: q.Get("path")}
		a, tf, root, err := s.writableRoot(r, p, id, in.Root, in)
		if err != nil {
			return err
		}
		if err := s.admitFileRead(w, r, a, lim, id, root.Name, in); err != nil {
			return err
		}
		res, err := tf.files.Delete(r.Context(), root.Name, in.Path)
		if err != nil {
			return s.writeFileError(r, a, id, root.Name, in, err)
		}
		s.auditFileChange(r, a, id, root.Name, "file_resource.deleted", res)
		writeJSON(w, http.StatusOK, res)
		return nil
	}
}

// auditFileChange records a change to a task's files: where, how big, its digest; no content.
func (s *Server) auditFileChange(r *http.Request, a access, taskID, root, action string, res workspace.Written) {
	ctx, cancel := background(r.Context())
	defer cancel()
	d := map[string]any{"root": auditText(root), "path": auditText(res.Path), "size": res.Size}
	if res.SHA256 != "" {
		d["sha256"] = res.SHA256
	}
	if res.Replacements > 0 {
		d["replacements"] = res.Replacements
	}
	s.audit(ctx, r, a.P, a.Company.ID, action, "task", taskID, d)
}
