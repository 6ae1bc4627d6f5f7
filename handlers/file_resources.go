package handlers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"berth/db"
	"berth/views"
	"berth/workspace"
)

// File resources are a task's files, read-only, from the roots the task is authorized for
// (docs/api.md "File resources"). The roots, in this order:
//
//  1. The task's readable execution workspaces whose directory is on this node (this process
//     needs a workspace manager), each named "execution-workspace:<execution workspace id>".
//  2. The local workspaces of the task's project: `directory` sources and `git` sources given as
//     an absolute path on this host (URL sources have no local tree), primary first, then by
//     name. Each is named "project-workspace:<project workspace id>": the id, not the
//     workspace's name, so a rename does not break a saved link or a client's configuration.
//
// Who: every reader of the task's company (board members, viewers) and instance admins; anyone
// else gets the task's 404; board members also read the project's local workspace roots. A run
// token reads its own task's roots while the run is live (docs/security.md "Run tokens"). Paths
// are resolved by workspace.Files, which never lets a read leave its root;
// responses carry root names and root-relative paths only, never a host path. Each refusal by
// the resolver (403) and each rate-limited request (429) is audited as file_resource.denied.
//
// Every read (both API routes and the browser panel) spends a token of the caller's per-user
// bucket: fileRateBurst per fileRateWindow, counted in this process's memory, so each web node
// counts on its own.
const (
	fileRateBurst  = 120
	fileRateWindow = time.Minute

	projectWorkspaceRootPrefix   = "project-workspace:"
	executionWorkspaceRootPrefix = "execution-workspace:"
	maxAuditPathBytes            = 1024
)

// newFileRateLimiter is the per-user limiter the file-resource routes share: burst requests
// per fileRateWindow (0: fileRateBurst).
func newFileRateLimiter(burst int) *rateLimiter {
	if burst <= 0 {
		burst = fileRateBurst
	}
	return newRateLimiter(burst, fileRateWindow, time.Now)
}

// Refusals specific to file resources; resolver refusals are mapped by fileError.
var (
	errNoReadableWorkspace = &httpError{Status: http.StatusNotFound, Code: "no_readable_workspace",
		Message: "This task has no readable workspace yet: add a local project workspace (a directory or a git repository on this host) to its project, or start a run to create its execution workspace."}
	errUnknownRoot = &httpError{Status: http.StatusNotFound, Code: "unknown_root",
		Message: "This task has no file root by that name."}
)

// fileRoot is one directory a task may read. dir is a host path and never leaves the server.
type fileRoot struct {
	Name  string
	Kind  string // execution_workspace or project_workspace
	Label string
	dir   string
	node  string // not "": the root lives on that other node's disk (file_resources_forward.go)
}

// taskFiles is a task's roots in order and the resolver over them (nil when there is no root).
type taskFiles struct {
	roots []fileRoot
	files *workspace.Files
}

// loadTaskFiles loads the roots the task may read (company-filtered) and builds the resolver over them.
func (s *Server) loadTaskFiles(ctx context.Context, a access, taskID string) (taskFiles, error) {
	var tf taskFiles
	execs, err := db.TaskReadableExecutionWorkspaces(ctx, s.pool, a.Company.ID, taskID)
	if err != nil {
		return taskFiles{}, err
	}
	for _, w := range execs {
		label := "execution workspace " + w.Ref[:11] + " (" + strings.ToLower(views.StrategyLabel(w.Strategy)) + ")"
		dir, err := "", error(errNoReadableWorkspace)
		if s.workspaces != nil {
			dir, err = s.workspaces.Root(w.Ref)
		}
		if err != nil {
			if node := s.remoteRoot(w); node != "" { // read through its node
				tf.roots = append(tf.roots, fileRoot{Name: executionWorkspaceRootPrefix + w.ID, Kind: "execution_workspace",
					Label: label, node: node})
			}
			continue // else gone
		}
		tf.roots = append(tf.roots, fileRoot{Name: executionWorkspaceRootPrefix + w.ID, Kind: "execution_workspace",
			Label: label, dir: dir})
	}
	local, err := db.TaskLocalProjectWorkspaces(ctx, s.pool, a.Company.ID, taskID)
	if err != nil {
		return taskFiles{}, err
	}
	if !a.canManage() {
		local = nil // only board members read their project's local workspace roots (docs/decisions.md)
	}
	for _, w := range local {
		tf.roots = append(tf.roots, fileRoot{Name: projectWorkspaceRootPrefix + w.ID, Kind: "project_workspace",
			Label: projectWorkspaceRootLabel(w), dir: w.Dir})
	}
	if len(tf.roots) == 0 {
		return tf, nil
	}
	roots := make([]workspace.FileRoot, 0, len(tf.roots))
	for _, r := range tf.roots {
		if r.node == "" {
			roots = append(roots, workspace.FileRoot{Name: r.Name, Dir: r.dir})
		}
	}
	if len(roots) == 0 {
		return tf, nil // every root is on another node
	}
	if tf.files, err = workspace.NewFiles(workspace.FileLimits{}, roots...); err != nil {
		return taskFiles{}, fmt.Errorf("file roots of task %s: %w", taskID, err)
	}
	return tf, nil
}

// projectWorkspaceRootLabel names a project workspace root for people.
func projectWorkspaceRootLabel(w db.LocalProjectWorkspace) string {
	kind := "directory"
	if w.SourceType == "git" {
		kind = "git repository"
	}
	if w.IsPrimary {
		kind += ", primary"
	}
	return w.Name + " (" + kind + ")"
}

// pick returns the root a request names; an empty name is the first root.
func (tf taskFiles) pick(name string) (fileRoot, error) {
	if len(tf.roots) == 0 {
		return fileRoot{}, errNoReadableWorkspace
	}
	if name == "" {
		return tf.roots[0], nil
	}
	for _, r := range tf.roots {
		if r.Name == name {
			return r, nil
		}
	}
	return fileRoot{}, errUnknownRoot
}

// fileQuery is one file-resource read as asked for.
type fileQuery struct {
	Op     string // list, content or download: recorded with a denial
	Root   string // "" for the task's first root
	Path   string // relative to the root
	Cursor string
	Limit  int
}

// admitFileRead spends one of the caller's file-read tokens; without one it is a 429 with
// Retry-After, audited.
func (s *Server) admitFileRead(w http.ResponseWriter, r *http.Request, a access, lim *rateLimiter, taskID, root string, in fileQuery) error {
	key := a.P.User.ID
	if a.P.Run != nil {
		key = "run:" + a.P.Run.ID
	}
	ok, wait := lim.allow(key)
	if ok {
		return nil
	}
	secs := retryAfterSeconds(wait)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	s.auditFileDenied(r, a, taskID, root, in, "rate_limited")
	return &httpError{Status: http.StatusTooManyRequests, Code: "rate_limited",
		Message: fmt.Sprintf("Too many file requests; try again in %d seconds.", secs)}
}

// taskFileRoot loads the task's roots and picks the one a request names ("" for the first).
func (s *Server) taskFileRoot(ctx context.Context, a access, taskID, name string) (taskFiles, fileRoot, error) {
	tf, err := s.loadTaskFiles(ctx, a, taskID)
	if err != nil {
		return taskFiles{}, fileRoot{}, err
	}
	root, err := tf.pick(name)
	if err != nil {
		return taskFiles{}, fileRoot{}, err
	}
	return tf, root, nil
}

// fileError maps a resolver refusal to what the caller sees (nil for anything else). Messages are
// fixed texts: a resolver error names relative paths only, but none of it is echoed.
func fileError(err error) *httpError {
	he := func(status int, code, msg string) *httpError {
		return &httpError{Status: status, Code: code, Message: msg}
	}
	switch {
	case errors.Is(err, workspace.ErrBadPath):
		return he(http.StatusBadRequest, "bad_path", "The path or cursor is not valid: give a path relative to the root (no leading /, ~, \\, NUL, control characters, scheme or drive letter; at most 4096 bytes).")
	case errors.Is(err, workspace.ErrEscape):
		return he(http.StatusForbidden, "path_escape", "That path leads outside the workspace.")
	case errors.Is(err, workspace.ErrDenied):
		return he(http.StatusForbidden, "path_denied", "That path is never readable through Berth (version control data, secrets, keys, credentials, dependency trees and build caches).")
	case errors.Is(err, workspace.ErrNotRegular):
		return he(http.StatusForbidden, "not_regular", "Only regular files can be read and only directories listed.")
	case errors.Is(err, workspace.ErrHardLink):
		return he(http.StatusForbidden, "hard_link", "The file has several hard links, so where its content lives cannot be verified; it is not shown.")
	case errors.Is(err, workspace.ErrNotFound):
		return he(http.StatusNotFound, "file_not_found", "No such file or directory.")
	case errors.Is(err, workspace.ErrTooLarge):
		return he(http.StatusRequestEntityTooLarge, "file_too_large", "The file is too large to read through Berth.")
	}
	return nil
}

// fileRefusal turns a resolver error into the response error, auditing 403s.
func (s *Server) fileRefusal(r *http.Request, a access, taskID, root string, in fileQuery, err error) error {
	he := fileError(err)
	if he == nil {
		return err
	}
	if he.Status == http.StatusForbidden {
		s.auditFileDenied(r, a, taskID, root, in, he.Code)
	}
	return he
}

// auditFileDenied records a refused read: the task, the root, the path asked for and why. Never
// any content.
func (s *Server) auditFileDenied(r *http.Request, a access, taskID, root string, in fileQuery, reason string) {
	ctx, cancel := background(r.Context())
	defer cancel()
	s.audit(ctx, r, a.P, a.Company.ID, "file_resource.denied", "task", taskID, map[string]any{
		"root": auditText(root), "path": auditText(in.Path), "operation": in.Op, "reason": reason})
}

// auditText makes a client-supplied string storable in the audit trail: valid UTF-8 without
// control characters (jsonb refuses NUL), cut to maxAuditPathBytes.
func auditText(v string) string {
	v = strings.ToValidUTF8(v, "\uFFFD")
	v = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) {
			return '\uFFFD'
		}
		return r
	}, v)
	if len(v) <= maxAuditPathBytes {
		return v
	}
	cut := maxAuditPathBytes
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return v[:cut] + "…"
}

// listFiles spends a rate-limit token and returns one page of a directory of root.
func (s *Server) listFiles(w http.ResponseWriter, r *http.Request, a access, lim *rateLimiter, taskID string, tf taskFiles, root fileRoot, in fileQuery) (workspace.Page, error) {
	if err := s.admitFileRead(w, r, a, lim, taskID, root.Name, in); err != nil {
		return workspace.Page{}, err
	}
	if root.node != "" {
		return s.remoteList(r.Context(), a, taskID, root, in)
	}
	page, err := tf.files.List(r.Context(), root.Name, in.Path, in.Cursor, in.Limit)
	if err != nil {
		return workspace.Page{}, s.fileRefusal(r, a, taskID, root.Name, in, err)
	}
	return page, nil
}

// readFile spends a rate-limit token and returns the preview of a file of root.
func (s *Server) readFile(w http.ResponseWriter, r *http.Request, a access, lim *rateLimiter, taskID string, tf taskFiles, root fileRoot, in fileQuery) (workspace.Content, error) {
	if err := s.admitFileRead(w, r, a, lim, taskID, root.Name, in); err != nil {
		return workspace.Content{}, err
	}
	if root.node != "" {
		return s.remoteRead(r.Context(), a, taskID, root, in)
	}
	c, err := tf.files.Read(r.Context(), root.Name, in.Path)
	if err != nil {
		return workspace.Content{}, s.fileRefusal(r, a, taskID, root.Name, in, err)
	}
	return c, nil
}

// fileListLimit reads `limit` for a listing: default and cap workspace.MaxPageSize (100); values
// up to the API-wide 200 are accepted and served as 100.
func fileListLimit(r *http.Request) (int, error) {
	if r.URL.Query().Get("limit") == "" {
		return workspace.MaxPageSize, nil
	}
	limit, _, err := pageParams(r)
	if err != nil {
		return 0, err
	}
	return min(limit, workspace.MaxPageSize), nil
}

// fileRootJSON is one root in GET /api/tasks/{id}/file-resources/roots.
type fileRootJSON struct {
	Name    string `json:"name"`
	Kind    string `json:"kind"`
	Label   string `json:"label"`
	Default bool   `json:"default"`
}

// fileRootsAPI lists the roots a task's files may be read from, in order; the first is the
// default of the other routes. A task without one has an empty list.
func (s *Server) fileRootsAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx, id := r.Context(), r.PathValue("id")
	a, err := s.objectAccess(ctx, p, "tasks", id)
	if err != nil {
		return err
	}
	tf, err := s.loadTaskFiles(ctx, a, id)
	if err != nil {
		return err
	}
	out := listResponse[fileRootJSON]{Items: make([]fileRootJSON, 0, len(tf.roots))}
	for i, root := range tf.roots {
		out.Items = append(out.Items, fileRootJSON{Name: root.Name, Kind: root.Kind, Label: root.Label, Default: i == 0})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// fileListAPI lists one page of a directory (`path`, empty for the root) of a task's root:
// {items: [{name, path, type, size, modified_at}], next_cursor}, sorted by name, at most 100.
func (s *Server) fileListAPI(lim *rateLimiter) func(http.ResponseWriter, *http.Request, *principal) error {
	return func(w http.ResponseWriter, r *http.Request, p *principal) error {
		ctx, id := r.Context(), r.PathValue("id")
		a, err := s.objectAccess(ctx, p, "tasks", id)
		if err != nil {
			return err
		}
		q := r.URL.Query()
		in := fileQuery{Op: "list", Root: q.Get("root"), Path: q.Get("path"), Cursor: q.Get("cursor")}
		if in.Limit, err = fileListLimit(r); err != nil {
			return err
		}
		tf, root, err := s.taskFileRoot(ctx, a, id, in.Root)
		if err != nil {
			return err
		}
		page, err := s.listFiles(w, r, a, lim, id, tf, root, in)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, page)
		return nil
	}
}

// fileContentAPI returns a file of a task's root: a preview {path, size, encoding, content,
// truncated} (UTF-8 text as is, anything else base64, at most 512 KiB), or with download=1 the
// raw bytes as an attachment.
func (s *Server) fileContentAPI(lim *rateLimiter) func(http.ResponseWriter, *http.Request, *principal) error {
	return func(w http.ResponseWriter, r *http.Request, p *principal) error {
		ctx, id := r.Context(), r.PathValue("id")
		a, err := s.objectAccess(ctx, p, "tasks", id)
		if err != nil {
			return err
		}
		q := r.URL.Query()
		in := fileQuery{Op: "content", Root: q.Get("root"), Path: q.Get("path")}
		switch q.Get("download") {
		case "", "0", "false":
		case "1", "true":
			in.Op = "download"
		default:
			return badRequest("bad_download", "download must be 1 (the raw file) or absent (a preview).")
		}
		tf, root, err := s.taskFileRoot(ctx, a, id, in.Root)
		if err != nil {
			return err
		}
		if in.Op == "download" {
			return s.downloadFile(w, r, a, lim, id, tf, root, in)
		}
		if rg, ranged, err := fileRange(q); err != nil {
			return err
		} else if ranged {
			return s.readFileRange(w, r, a, lim, id, tf, root, in, rg)
		}
		c, err := s.readFile(w, r, a, lim, id, tf, root, in)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, c)
		return nil
	}
}

// downloadFile spends a rate-limit token and streams a file of root as an attachment that no
// browser renders: octet-stream, nosniff, a sanitized file name. Exactly the size checked when
// the file was opened is served (ranges allowed), even if the file grows meanwhile.
func (s *Server) downloadFile(w http.ResponseWriter, r *http.Request, a access, lim *rateLimiter, taskID string, tf taskFiles, root fileRoot, in fileQuery) error {
	if err := s.admitFileRead(w, r, a, lim, taskID, root.Name, in); err != nil {
		return err
	}
	if root.node != "" {
		return s.remoteDownload(w, r, a, taskID, root)
	}
	f, entry, err := tf.files.Open(r.Context(), root.Name, in.Path)
	if err != nil {
		return s.fileRefusal(r, a, taskID, root.Name, in, err)
	}
	defer f.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Disposition", attachmentDisposition(entry.Name))
	h.Set("Cache-Control", "no-store")
	http.ServeContent(w, r, "", entry.ModifiedAt, io.NewSectionReader(f, 0, entry.Size))
	return nil
}

// attachmentDisposition is a Content-Disposition that saves the file under its name: an ASCII
// fallback (anything unusual replaced by "_") and the exact UTF-8 name per RFC 5987.
func attachmentDisposition(name string) string {
	name = strings.ToValidUTF8(name, "_")
	var ascii, ext strings.Builder
	for _, c := range name {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', strings.ContainsRune(" ._-+()", c):
			ascii.WriteRune(c)
		default:
			ascii.WriteByte('_')
		}
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$&+-.^_`|~", c) >= 0 {
			ext.WriteByte(c)
		} else {
			fmt.Fprintf(&ext, "%%%02X", c)
		}
	}
	fallback := strings.TrimSpace(ascii.String())
	if fallback == "" || strings.Trim(fallback, ".") == "" {
		fallback = "download"
	}
	return `attachment; filename="` + fallback + `"; filename*=UTF-8''` + ext.String()
}
