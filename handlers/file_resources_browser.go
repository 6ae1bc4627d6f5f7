package handlers

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"berth/db"
	"berth/views"
	"berth/workspace"
)

// The task page's file browser: the panel's intro, directory and file views for htmx and as a page,
// and their links.

// filesURL is the file browser page (or, for htmx, its panel) with the given query.
func filesURL(taskID string, v url.Values) string {
	return "/tasks/" + taskID + "/files?" + v.Encode()
}

// filesListURL lists a directory of a root in the browser.
func filesListURL(taskID, root, dir, cursor string) string {
	v := url.Values{"root": {root}}
	if dir != "" {
		v.Set("path", dir)
	}
	if cursor != "" {
		v.Set("cursor", cursor)
	}
	return filesURL(taskID, v)
}

// filesDownloadURL is the raw download of a file (the API route, which also takes the session).
func filesDownloadURL(taskID, root, file string) string {
	v := url.Values{"root": {root}, "path": {file}, "download": {"1"}}
	return "/api/tasks/" + taskID + "/file-resources/content?" + v.Encode()
}

// fileRootOptions are the root selector's choices.
func fileRootOptions(tf taskFiles) []views.FileRootOption {
	opts := make([]views.FileRootOption, 0, len(tf.roots))
	for _, r := range tf.roots {
		opts = append(opts, views.FileRootOption{Name: r.Name, Label: r.Label})
	}
	return opts
}

// fileCrumbs is the breadcrumb to p (the listed directory or the previewed file): the root, then
// each component linking to its listing; the last step is the current one and has no link.
func fileCrumbs(taskID string, root fileRoot, p string) []views.FileCrumb {
	var comps []string
	for _, c := range strings.Split(p, "/") {
		if c != "" && c != "." {
			comps = append(comps, c)
		}
	}
	crumbs := []views.FileCrumb{{Label: root.Label, URL: filesListURL(taskID, root.Name, "", "")}}
	for i, c := range comps {
		crumbs = append(crumbs, views.FileCrumb{Label: c, URL: filesListURL(taskID, root.Name, strings.Join(comps[:i+1], "/"), "")})
	}
	crumbs[len(crumbs)-1].URL = ""
	return crumbs
}

// fileBrowserIntro is the task page's file browser: the roots, and the URL the panel loads its
// listing from (htmx), so the task page itself reads no file and spends no rate-limit token.
func (s *Server) fileBrowserIntro(ctx context.Context, a access, taskID string) (views.FileBrowserData, error) {
	tf, err := s.loadTaskFiles(ctx, a, taskID)
	if err != nil {
		return views.FileBrowserData{}, err
	}
	d := views.FileBrowserData{TaskID: taskID, PageURL: "/tasks/" + taskID + "/files", Roots: fileRootOptions(tf)}
	if len(tf.roots) > 0 {
		d.Root = tf.roots[0].Name
		d.LoadURL = filesListURL(taskID, d.Root, "", "")
	}
	return d, nil
}

// fileBrowser builds the browser panel for a request (`root`, then `path` to list a directory or
// `file` to preview one, `cursor` for the next page). A refusal is shown inside the panel, and
// its status returned for the full page; other errors are returned.
func (s *Server) fileBrowser(w http.ResponseWriter, r *http.Request, a access, lim *rateLimiter, taskID string) (views.FileBrowserData, int, error) {
	q := r.URL.Query()
	in := fileQuery{Op: "list", Root: q.Get("root"), Path: q.Get("path"), Cursor: q.Get("cursor"), Limit: workspace.MaxPageSize}
	if q.Has("file") {
		in.Op, in.Path, in.Cursor = "content", q.Get("file"), ""
	}
	tf, err := s.loadTaskFiles(r.Context(), a, taskID)
	if err != nil {
		return views.FileBrowserData{}, 0, err
	}
	d := views.FileBrowserData{TaskID: taskID, PageURL: "/tasks/" + taskID + "/files", Roots: fileRootOptions(tf)}
	if len(tf.roots) == 0 {
		return d, http.StatusNotFound, nil
	}
	refused := func(root fileRoot, err error) (views.FileBrowserData, int, error) {
		var he *httpError
		if !errors.As(err, &he) {
			return views.FileBrowserData{}, 0, err
		}
		d.Problem = he.Message
		if root.Name != "" {
			d.Crumbs = []views.FileCrumb{{Label: root.Label, URL: filesListURL(taskID, root.Name, "", "")}}
		}
		return d, he.Status, nil
	}
	root, err := tf.pick(in.Root)
	if err != nil {
		return refused(fileRoot{}, err)
	}
	d.Root = root.Name
	if in.Op == "content" {
		c, err := s.readFile(w, r, a, lim, taskID, tf, root, in)
		if err != nil {
			return refused(root, err)
		}
		d.Crumbs = fileCrumbs(taskID, root, c.Path)
		d.Preview = &views.FilePreview{Name: d.Crumbs[len(d.Crumbs)-1].Label, Size: c.Size, Truncated: c.Truncated,
			Binary: c.Encoding != "utf8", DownloadURL: filesDownloadURL(taskID, root.Name, c.Path)}
		if !d.Preview.Binary {
			d.Preview.Text, d.Preview.Shown = c.Content, int64(len(c.Content))
		}
		return d, http.StatusOK, nil
	}
	page, err := s.listFiles(w, r, a, lim, taskID, tf, root, in)
	if err != nil {
		return refused(root, err)
	}
	d.Crumbs, d.Listed = fileCrumbs(taskID, root, in.Path), true
	for _, e := range page.Items {
		fe := views.FileEntry{Name: e.Name, Dir: e.Type == workspace.TypeDir, Size: e.Size, ModifiedAt: e.ModifiedAt}
		if fe.Dir {
			fe.URL = filesListURL(taskID, root.Name, e.Path, "")
		} else {
			fe.URL = filesURL(taskID, url.Values{"root": {root.Name}, "file": {e.Path}})
			fe.DownloadURL = filesDownloadURL(taskID, root.Name, e.Path)
		}
		d.Entries = append(d.Entries, fe)
	}
	if page.NextCursor != "" {
		d.NextURL = filesListURL(taskID, root.Name, in.Path, page.NextCursor)
	}
	return d, http.StatusOK, nil
}

// filesPage is the file browser. htmx gets the panel alone, always with 200 and any refusal
// written inside it (htmx swaps only successful responses, see static/js/app.js); a browser gets
// the whole page with the refusal's status.
func (s *Server) filesPage(lim *rateLimiter) func(http.ResponseWriter, *http.Request, *principal) error {
	return func(w http.ResponseWriter, r *http.Request, p *principal) error {
		ctx, id := r.Context(), r.PathValue("id")
		a, err := s.objectAccess(ctx, p, "tasks", id)
		if err != nil {
			return err
		}
		d, status, err := s.fileBrowser(w, r, a, lim, id)
		if err != nil {
			return err
		}
		w.Header().Set("Vary", "HX-Request")
		if taskFragmentRequest(r) {
			return s.render(w, r, views.FileBrowser(d))
		}
		t, err := db.TaskByID(ctx, s.pool, a.Company.ID, id)
		if err != nil {
			return err
		}
		detail := views.TaskDetail{ID: t.ID, Key: t.Key, Title: t.Title, ProjectID: t.ProjectID, ProjectName: t.ProjectName}
		return s.renderStatus(w, r, status, views.FilesPage(s.taskFrame(r, a, t), detail, d))
	}
}
