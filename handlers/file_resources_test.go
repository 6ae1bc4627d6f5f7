package handlers

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fileWorld is a task world plus project FIL whose task FIL-1 reads two local roots made of real
// files: a primary `directory` source (Dir) and a local git repository (Repo). The project also
// has a URL git source, which is never a root.
type fileWorld struct {
	*taskWorld
	Project  string
	TaskID   string
	Dir      string // directory source: README.md, docs/, many/ (150 files), secrets, links…
	Repo     string // git work tree with main.go and its .git
	Outside  string // a directory next to the roots that no read may reach
	DirRoot  string // root names as the API gives them
	RepoRoot string
}

func newFileWorld(t *testing.T) *fileWorld {
	t.Helper()
	return newFileWorldOn(t, setup(t))
}

func newFileWorldOn(t *testing.T, e *testEnv) *fileWorld {
	t.Helper()
	w := &fileWorld{taskWorld: newTaskWorldOn(e), Dir: t.TempDir(), Repo: t.TempDir(), Outside: t.TempDir()}
	w.Project = w.addProject(w.r.A.ID, "FIL", `{}`)

	fileWrite(t, filepath.Join(w.Outside, "secret.txt"), "outside secret")
	fileWrite(t, filepath.Join(w.Dir, "README.md"), "# Hello\n")
	fileWrite(t, filepath.Join(w.Dir, "docs", "guide.md"), "the guide\n")
	fileWrite(t, filepath.Join(w.Dir, "<script>.txt"), "<script>alert(1)</script>")
	fileWrite(t, filepath.Join(w.Dir, "blob.bin"), "\x00\x01\x02\xff")
	fileWrite(t, filepath.Join(w.Dir, "big.txt"), strings.Repeat("0123456789abcdef", 600<<10/16))
	fileWrite(t, filepath.Join(w.Dir, ".env"), "SECRET=hunter2")
	fileWrite(t, filepath.Join(w.Dir, ".git", "config"), "[remote] url=https://token@example.com")
	for i := range 150 {
		fileWrite(t, filepath.Join(w.Dir, "many", fmt.Sprintf("f%03d.txt", i)), fmt.Sprint(i))
	}
	fileDo(t, os.Symlink("/etc", filepath.Join(w.Dir, "link-etc")))
	fileDo(t, os.Symlink("../"+filepath.Base(w.Outside), filepath.Join(w.Dir, "link-out")))
	fileDo(t, os.Symlink("docs", filepath.Join(w.Dir, "link-docs")))
	fileDo(t, os.Link(filepath.Join(w.Outside, "secret.txt"), filepath.Join(w.Dir, "hard.txt")))

	fileWrite(t, filepath.Join(w.Repo, "main.go"), "package main\n")
	fileGit(t, w.Repo, "init", "-q", "-b", "main")
	fileGit(t, w.Repo, "add", "main.go")
	fileGit(t, w.Repo, "commit", "-q", "-m", "first")

	dirID := w.id(`INSERT INTO project_workspaces (company_id, project_id, name, source_type, source, is_primary)
		VALUES ($1, $2, 'assets', 'directory', $3, true) RETURNING id`, w.r.A.ID, w.Project, w.Dir)
	repoID := w.id(`INSERT INTO project_workspaces (company_id, project_id, name, source_type, source, default_ref)
		VALUES ($1, $2, 'app', 'git', $3, 'main') RETURNING id`, w.r.A.ID, w.Project, w.Repo)
	w.id(`INSERT INTO project_workspaces (company_id, project_id, name, source_type, source, default_ref)
		VALUES ($1, $2, 'remote', 'git', 'https://example.com/app.git', 'main') RETURNING id`, w.r.A.ID, w.Project)
	w.DirRoot, w.RepoRoot = "project-workspace:"+dirID, "project-workspace:"+repoID
	w.TaskID = w.createTask(w.r.Board, w.Project, map[string]any{"title": "Read the files"})["id"].(string)
	return w
}

func fileWrite(t *testing.T, p, content string) {
	t.Helper()
	fileDo(t, os.MkdirAll(filepath.Dir(p), 0o755))
	fileDo(t, os.WriteFile(p, []byte(content), 0o644))
}

func fileDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func fileGit(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=Berth Test", "-c", "user.email=test@berth.test"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

// fileResp is a raw API answer.
type fileResp struct {
	Status int
	Header http.Header
	Body   string
}

// json decodes the body as an object.
func (r fileResp) json(t *testing.T) map[string]any {
	t.Helper()
	var out map[string]any
	if err := json.Unmarshal([]byte(r.Body), &out); err != nil {
		t.Fatalf("not JSON (%d): %.300s", r.Status, r.Body)
	}
	return out
}

// get calls a file-resource route of the task as a (bearer token; none when a.Token is empty)
// against base (the world's server when empty), and checks that no host path leaks.
func (w *fileWorld) get(t *testing.T, base string, a actor, route string, q url.Values) fileResp {
	t.Helper()
	if base == "" {
		base = w.e.ts.URL
	}
	req, err := http.NewRequest(http.MethodGet, base+"/api/tasks/"+w.TaskID+"/file-resources/"+route+"?"+q.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Token != "" {
		req.Header.Set("Authorization", "Bearer "+a.Token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	w.noHostPath(t, string(b))
	return fileResp{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}
}

// noHostPath fails when a response names a directory of the host.
func (w *fileWorld) noHostPath(t *testing.T, body string) {
	t.Helper()
	for _, p := range []string{w.Dir, w.Repo, w.Outside, filepath.Dir(w.Dir), "/srv/src"} {
		if strings.Contains(body, p) {
			t.Fatalf("response names the host path %s: %.500s", p, body)
		}
	}
}

// page fetches a browser page as c (optionally as htmx) and checks that no host path leaks.
func (w *fileWorld) page(t *testing.T, c *http.Client, path string, htmx bool) (*http.Response, string) {
	t.Helper()
	resp, body := w.taskWorld.get(c, path, htmx)
	w.noHostPath(t, body)
	return resp, body
}

func fileNames(t *testing.T, out map[string]any) []string {
	t.Helper()
	items, ok := out["items"].([]any)
	if !ok {
		t.Fatalf("no items: %v", out)
	}
	var names []string
	for _, it := range items {
		names = append(names, it.(map[string]any)["name"].(string))
	}
	return names
}

func fileCode(out map[string]any) string { return taskErrorCode(out) }

// TestFileResourcesHappyPaths proves the roots (order, names, no URL source), listing the
// default and a named root with denied names and symlinks pruned, the entry shape, text and
// binary previews with truncation, and the raw download with its headers.
func TestFileResourcesHappyPaths(t *testing.T) {
	t.Parallel()
	w := newFileWorld(t)
	board := w.r.Board

	r := w.get(t, "", board, "roots", nil)
	out := r.json(t)
	items := out["items"].([]any)
	if r.Status != http.StatusOK || len(items) != 2 {
		t.Fatalf("roots = %d %v", r.Status, out)
	}
	first, second := items[0].(map[string]any), items[1].(map[string]any)
	if first["name"] != w.DirRoot || first["default"] != true || first["kind"] != "project_workspace" ||
		first["label"] != "assets (directory, primary)" || second["name"] != w.RepoRoot || second["label"] != "app (git repository)" {
		t.Fatalf("roots = %v", items)
	}

	r = w.get(t, "", board, "list", nil)
	out = r.json(t)
	names := fileNames(t, out)
	want := []string{"<script>.txt", "README.md", "big.txt", "blob.bin", "docs", "hard.txt", "many"}
	if r.Status != http.StatusOK || !slices.Equal(names, want) || out["next_cursor"] != "" {
		t.Fatalf("list of the default root = %d %v (want %v)", r.Status, out, want)
	}
	for _, it := range out["items"].([]any) {
		e := it.(map[string]any)
		keys := make([]string, 0, len(e))
		for k := range e {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, []string{"modified_at", "name", "path", "size", "type"}) {
			t.Fatalf("entry keys = %v", keys)
		}
		if _, err := time.Parse(time.RFC3339Nano, e["modified_at"].(string)); err != nil {
			t.Fatalf("modified_at %v: %v", e["modified_at"], err)
		}
		switch e["name"] {
		case "docs":
			if e["type"] != "dir" || e["size"] != float64(0) || e["path"] != "docs" {
				t.Fatalf("docs entry = %v", e)
			}
		case "README.md":
			if e["type"] != "file" || e["size"] != float64(8) || e["path"] != "README.md" {
				t.Fatalf("README entry = %v", e)
			}
		}
	}

	out = w.get(t, "", board, "list", url.Values{"root": {w.DirRoot}, "path": {"link-docs"}}).json(t)
	if e := out["items"].([]any); len(e) != 1 || e[0].(map[string]any)["path"] != "docs/guide.md" {
		t.Fatalf("list through an in-root symlink = %v", out)
	}
	r = w.get(t, "", board, "list", url.Values{"root": {w.RepoRoot}})
	if names := fileNames(t, r.json(t)); r.Status != http.StatusOK || !slices.Equal(names, []string{"main.go"}) {
		t.Fatalf("list of the git root = %d %v", r.Status, names)
	}

	r = w.get(t, "", board, "content", url.Values{"path": {"docs/guide.md"}})
	out = r.json(t)
	if r.Status != http.StatusOK || out["path"] != "docs/guide.md" || out["size"] != float64(10) ||
		out["encoding"] != "utf8" || out["content"] != "the guide\n" || out["truncated"] != false || len(out) != 5 {
		t.Fatalf("content = %d %v", r.Status, out)
	}
	out = w.get(t, "", board, "content", url.Values{"root": {w.RepoRoot}, "path": {"main.go"}}).json(t)
	if out["content"] != "package main\n" {
		t.Fatalf("content of the git root = %v", out)
	}
	out = w.get(t, "", board, "content", url.Values{"path": {"blob.bin"}}).json(t)
	if out["encoding"] != "base64" || out["content"] != base64.StdEncoding.EncodeToString([]byte("\x00\x01\x02\xff")) {
		t.Fatalf("binary content = %v", out)
	}
	out = w.get(t, "", board, "content", url.Values{"path": {"big.txt"}}).json(t)
	if out["truncated"] != true || out["size"] != float64(600<<10) || len(out["content"].(string)) != 512<<10 {
		t.Fatalf("big content: truncated %v size %v len %d", out["truncated"], out["size"], len(out["content"].(string)))
	}

	r = w.get(t, "", board, "content", url.Values{"path": {"<script>.txt"}, "download": {"1"}})
	if r.Status != http.StatusOK || r.Body != "<script>alert(1)</script>" {
		t.Fatalf("download = %d %q", r.Status, r.Body)
	}
	if got := r.Header.Get("Content-Type"); got != "application/octet-stream" {
		t.Fatalf("download Content-Type = %q", got)
	}
	if got := r.Header.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Fatalf("download X-Content-Type-Options = %q", got)
	}
	if got, want := r.Header.Get("Content-Disposition"), `attachment; filename="_script_.txt"; filename*=UTF-8''%3Cscript%3E.txt`; got != want {
		t.Fatalf("Content-Disposition = %q, want %q", got, want)
	}
	r = w.get(t, "", board, "content", url.Values{"path": {"blob.bin"}, "download": {"1"}})
	if r.Body != "\x00\x01\x02\xff" || r.Header.Get("Content-Length") != "4" {
		t.Fatalf("binary download = %q length %q", r.Body, r.Header.Get("Content-Length"))
	}
	if n := w.e.count(`SELECT count(*) FROM audit_events WHERE action = 'file_resource.denied'`); n != 0 {
		t.Fatalf("denials after successful reads = %d", n)
	}
}

// TestFileResourcesPagination proves a directory of 150 entries comes in pages of at most 100,
// sorted, without repeats or gaps, that limit is honoured and capped, and that a bad limit or
// cursor is a 400.
func TestFileResourcesPagination(t *testing.T) {
	t.Parallel()
	w := newFileWorld(t)
	var all []string
	cursor, pages := "", 0
	for {
		q := url.Values{"path": {"many"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		r := w.get(t, "", w.r.Board, "list", q)
		out := r.json(t)
		if r.Status != http.StatusOK {
			t.Fatalf("page %d = %d %v", pages, r.Status, out)
		}
		names := fileNames(t, out)
		if len(names) > 100 {
			t.Fatalf("page of %d entries", len(names))
		}
		all = append(all, names...)
		pages++
		cursor, _ = out["next_cursor"].(string)
		if cursor == "" {
			break
		}
		if pages > 3 {
			t.Fatal("pagination does not end")
		}
	}
	want := make([]string, 150)
	for i := range want {
		want[i] = fmt.Sprintf("f%03d.txt", i)
	}
	if pages != 2 || !slices.Equal(all, want) {
		t.Fatalf("%d pages, %d names; first %v", pages, len(all), all[:min(3, len(all))])
	}

	out := w.get(t, "", w.r.Board, "list", url.Values{"path": {"many"}, "limit": {"20"}}).json(t)
	if names := fileNames(t, out); len(names) != 20 || names[19] != "f019.txt" || out["next_cursor"] == "" {
		t.Fatalf("limit 20 = %d names, cursor %v", len(names), out["next_cursor"])
	}
	if names := fileNames(t, w.get(t, "", w.r.Board, "list", url.Values{"path": {"many"}, "limit": {"200"}}).json(t)); len(names) != 100 {
		t.Fatalf("limit 200 = %d names, want the cap of 100", len(names))
	}
	for _, q := range []url.Values{{"limit": {"0"}}, {"limit": {"201"}}, {"limit": {"x"}}, {"cursor": {"%%%"}}} {
		if r := w.get(t, "", w.r.Board, "list", q); r.Status != http.StatusBadRequest {
			t.Fatalf("list %v = %d %s", q, r.Status, r.Body)
		}
	}
}

// TestFileResourcesRefusals proves every refusal's status and code, that 403s (and only they)
// are audited with the task, root, requested path and reason and no content, and that no
// response names a host path.
func TestFileResourcesRefusals(t *testing.T) {
	t.Parallel()
	w := newFileWorld(t)
	cases := []struct {
		route  string
		q      url.Values
		status int
		code   string
	}{
		{"content", url.Values{"path": {"../x"}}, 403, "path_escape"},
		{"content", url.Values{"path": {"docs/../../" + filepath.Base(w.Outside) + "/secret.txt"}}, 403, "path_escape"},
		{"content", url.Values{"path": {"link-etc/passwd"}}, 403, "path_escape"},
		{"list", url.Values{"path": {"link-etc"}}, 403, "path_escape"},
		{"content", url.Values{"path": {"link-out/secret.txt"}}, 403, "path_escape"},
		{"content", url.Values{"path": {".git/config"}}, 403, "path_denied"},
		{"list", url.Values{"path": {".git"}}, 403, "path_denied"},
		{"content", url.Values{"path": {".env"}}, 403, "path_denied"},
		{"content", url.Values{"path": {".git/config"}, "root": {w.RepoRoot}}, 403, "path_denied"},
		{"content", url.Values{"path": {".env"}, "download": {"1"}}, 403, "path_denied"},
		{"content", url.Values{"path": {"docs"}}, 403, "not_regular"},
		{"list", url.Values{"path": {"README.md"}}, 403, "not_regular"},
		{"content", url.Values{"path": {"hard.txt"}}, 403, "hard_link"},
		{"content", url.Values{"path": {"hard.txt"}, "download": {"1"}}, 403, "hard_link"},
		{"content", url.Values{"path": {"/etc/passwd"}}, 400, "bad_path"},
		{"content", url.Values{"path": {"a\x00b"}}, 400, "bad_path"},
		{"content", url.Values{"path": {""}}, 400, "bad_path"},
		{"content", url.Values{"path": {"~/x"}}, 400, "bad_path"},
		{"content", url.Values{"path": {`docs\guide.md`}}, 400, "bad_path"},
		{"content", url.Values{"path": {"C:/x"}}, 400, "bad_path"},
		{"content", url.Values{"path": {"file:///etc/passwd"}}, 400, "bad_path"},
		{"list", url.Values{"path": {strings.Repeat("a/", 2049)}}, 400, "bad_path"},
		{"content", url.Values{"path": {"README.md"}, "download": {"yes"}}, 400, "bad_download"},
		{"content", url.Values{"path": {"missing.txt"}}, 404, "file_not_found"},
		{"list", url.Values{"path": {"nope"}}, 404, "file_not_found"},
		{"list", url.Values{"root": {"project-workspace:" + w.ProjectID}}, 404, "unknown_root"},
		{"content", url.Values{"root": {"/etc"}, "path": {"passwd"}}, 404, "unknown_root"},
	}
	audited := 0
	for _, c := range cases {
		r := w.get(t, "", w.r.Board, c.route, c.q)
		out := r.json(t)
		if r.Status != c.status || fileCode(out) != c.code {
			t.Errorf("%s %v = %d %s, want %d %s", c.route, c.q, r.Status, r.Body, c.status, c.code)
			continue
		}
		if c.status != http.StatusForbidden {
			continue // the total below proves that nothing else was audited
		}
		audited++
		root := c.q.Get("root")
		if root == "" {
			root = w.DirRoot
		}
		op := c.route
		if c.q.Get("download") == "1" {
			op = "download"
		}
		if n := w.e.count(`SELECT count(*) FROM audit_events WHERE action = 'file_resource.denied' AND company_id = $1
			AND target_type = 'task' AND target_id = $2 AND actor_id = $3 AND details->>'root' = $4
			AND details->>'path' = $5 AND details->>'reason' = $6 AND details->>'operation' = $7`,
			w.r.A.ID, w.TaskID, w.r.Board.User.ID, root, c.q.Get("path"), c.code, op); n != 1 {
			t.Errorf("%s %v: %d matching audit events, want 1", c.route, c.q, n)
		}
	}
	if n := w.e.count(`SELECT count(*) FROM audit_events WHERE action = 'file_resource.denied'`); n != audited {
		t.Fatalf("denial events = %d, want %d", n, audited)
	}
	if n := w.e.count(`SELECT count(*) FROM audit_events WHERE action = 'file_resource.denied' AND
		(details::text LIKE '%hunter2%' OR details::text LIKE '%outside secret%' OR details::text LIKE '%token@%')`); n != 0 {
		t.Fatalf("%d denial events hold file content", n)
	}
	if n := w.e.count(`SELECT count(*) FROM audit_events WHERE action = 'file_resource.denied'
		AND details->>'path' = '.env' AND details->>'operation' = 'download'`); n != 1 {
		t.Fatalf("download denial events = %d", n)
	}
}

// TestFileResourcesRoleMatrix proves who reads: board, viewer and instance admin read; another
// company and a malformed task id get 404; no credentials 401; pages without a session go to
// /login; and a task without a local root is a 404 that says it has no readable workspace yet.
func TestFileResourcesRoleMatrix(t *testing.T) {
	t.Parallel()
	w := newFileWorld(t)
	// Board members read their project's local workspace roots (docs/api.md "File resources");
	// viewers and instance admins who are not board members read only execution workspaces, which
	// this task has none of.
	for _, route := range []string{"roots", "list"} {
		if r := w.get(t, "", w.r.Board, route, nil); r.Status != http.StatusOK {
			t.Errorf("board %s = %d %s", route, r.Status, r.Body)
		}
	}
	if r := w.get(t, "", w.r.Board, "content", url.Values{"path": {"README.md"}}); r.Status != http.StatusOK {
		t.Errorf("board content = %d %s", r.Status, r.Body)
	}
	for name, a := range map[string]actor{"viewer": w.r.Viewer, "admin": w.r.Admin} {
		if r := w.get(t, "", a, "list", nil); r.Status != http.StatusNotFound {
			t.Errorf("%s list of project roots = %d, want 404", name, r.Status)
		}
		if r := w.get(t, "", a, "roots", nil); r.Status != http.StatusOK || len(r.json(t)["items"].([]any)) != 0 {
			t.Errorf("%s roots = %d %s, want an empty list", name, r.Status, r.Body)
		}
	}
	for _, route := range []string{"roots", "list", "content?path=README.md"} {
		path := "/api/tasks/" + w.TaskID + "/file-resources/" + route
		if status, out := w.e.call(w.r.Other, http.MethodGet, path, nil); status != http.StatusNotFound || fileCode(out) != "not_found" {
			t.Errorf("other company %s = %d %v", route, status, out)
		}
		if status, _ := w.e.call(actor{}, http.MethodGet, path, nil); status != http.StatusUnauthorized {
			t.Errorf("anonymous %s = %d", route, status)
		}
		if status, _ := w.e.call(w.r.Board, http.MethodGet, "/api/tasks/not-a-uuid/file-resources/"+route, nil); status != http.StatusNotFound {
			t.Errorf("malformed task id %s = %d", route, status)
		}
	}
	anon := w.e.client()
	for _, path := range []string{"/tasks/" + w.TaskID + "/files", "/tasks/" + w.TaskID + "/files?path=docs"} {
		if resp := w.e.do(anon, http.MethodGet, path, nil, nil); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" {
			t.Errorf("anonymous page %s = %d %s", path, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	if resp, _ := w.page(t, w.e.browser(w.r.Other), "/tasks/"+w.TaskID+"/files", false); resp.StatusCode != http.StatusNotFound {
		t.Errorf("other company page = %d", resp.StatusCode)
	}

	// A task whose project has only a URL source has no root.
	bare := w.addProject(w.r.A.ID, "URL", `{}`)
	w.id(`INSERT INTO project_workspaces (company_id, project_id, name, source_type, source, default_ref, is_primary)
		VALUES ($1, $2, 'remote', 'git', 'https://example.com/x.git', 'main', true) RETURNING id`, w.r.A.ID, bare)
	lonely := w.createTask(w.r.Board, bare, map[string]any{"title": "No files"})["id"].(string)
	status, out := w.e.call(w.r.Viewer, http.MethodGet, "/api/tasks/"+lonely+"/file-resources/list", nil)
	msg, _ := out["error"].(map[string]any)["message"].(string)
	if status != http.StatusNotFound || fileCode(out) != "no_readable_workspace" || !strings.Contains(msg, "no readable workspace yet") {
		t.Fatalf("task without a root: list = %d %v", status, out)
	}
	if status, out := w.e.call(w.r.Viewer, http.MethodGet, "/api/tasks/"+lonely+"/file-resources/content?path=README.md", nil); status != http.StatusNotFound || fileCode(out) != "no_readable_workspace" {
		t.Fatalf("task without a root: content = %d %v", status, out)
	}
	if status, out := w.e.call(w.r.Viewer, http.MethodGet, "/api/tasks/"+lonely+"/file-resources/roots", nil); status != http.StatusOK || len(out["items"].([]any)) != 0 {
		t.Fatalf("task without a root: roots = %d %v", status, out)
	}
	viewer := w.e.browser(w.r.Viewer)
	if resp, body := w.page(t, viewer, "/tasks/"+lonely, false); resp.StatusCode != http.StatusOK || !strings.Contains(body, "No readable workspace yet") {
		t.Fatalf("task page without a root = %d", resp.StatusCode)
	}
	if resp, body := w.page(t, viewer, "/tasks/"+lonely+"/files", false); resp.StatusCode != http.StatusNotFound || !strings.Contains(body, "No readable workspace yet") {
		t.Fatalf("files page without a root = %d", resp.StatusCode)
	}
}

// fileClock is a clock a test moves by hand.
type fileClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fileClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fileClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestFileResourcesRateLimit proves, on the real handlers with a limit of 3 per minute and a
// fake clock, that list, content and the browser panel share one bucket per user, that the
// fourth read is a 429 with Retry-After (audited), that other users are unaffected, and that
// the bucket refills with time.
func TestFileResourcesRateLimit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	w := newFileWorldOn(t, e)
	clock := &fileClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	lim := newRateLimiter(3, time.Minute, clock.Now)
	mux := http.NewServeMux()
	mux.Handle("GET /api/tasks/{id}/file-resources/list", e.srv.api(e.srv.fileListAPI(lim)))
	mux.Handle("GET /api/tasks/{id}/file-resources/content", e.srv.api(e.srv.fileContentAPI(lim)))
	mux.Handle("GET /tasks/{id}/files", e.srv.page(e.srv.filesPage(lim)))
	ts := httptest.NewServer(e.srv.middleware(mux))
	t.Cleanup(ts.Close)

	first := e.actorWith("board2@acme.test", false, w.r.A.ID, "board")
	readme := url.Values{"path": {"README.md"}}
	for i, route := range []string{"list", "content", "list"} {
		q := url.Values{}
		if route == "content" {
			q = readme
		}
		if r := w.get(t, ts.URL, first, route, q); r.Status != http.StatusOK {
			t.Fatalf("read %d = %d %s", i+1, r.Status, r.Body)
		}
	}
	r := w.get(t, ts.URL, first, "content", readme)
	if r.Status != http.StatusTooManyRequests || fileCode(r.json(t)) != "rate_limited" || r.Header.Get("Retry-After") != "20" {
		t.Fatalf("fourth read = %d Retry-After %q %s", r.Status, r.Header.Get("Retry-After"), r.Body)
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE action = 'file_resource.denied' AND target_id = $1
		AND actor_id = $2 AND details->>'reason' = 'rate_limited' AND details->>'path' = 'README.md'
		AND details->>'root' = $3`, w.TaskID, first.User.ID, w.DirRoot); n != 1 {
		t.Fatalf("rate-limit denial events = %d", n)
	}
	if r := w.get(t, ts.URL, w.r.Board, "list", nil); r.Status != http.StatusOK {
		t.Fatalf("another user = %d", r.Status)
	}

	clock.advance(19 * time.Second)
	if r := w.get(t, ts.URL, first, "list", nil); r.Status != http.StatusTooManyRequests || r.Header.Get("Retry-After") != "1" {
		t.Fatalf("after 19 s = %d Retry-After %q", r.Status, r.Header.Get("Retry-After"))
	}
	clock.advance(time.Second)
	if r := w.get(t, ts.URL, first, "list", nil); r.Status != http.StatusOK {
		t.Fatalf("after 20 s = %d %s", r.Status, r.Body)
	}

	// The browser panel spends the same tokens: the board member's bucket is full again (one
	// read 20 s ago), so three panels load and the fourth shows the refusal inside the panel (200
	// for htmx). Cookies ignore ports, so the session reaches the limited server.
	c := w.e.browser(w.r.Board)
	for i := range 4 {
		req, err := http.NewRequest(http.MethodGet, ts.URL+"/tasks/"+w.TaskID+"/files", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("HX-Request", "true")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body := readBody(t, resp)
		resp.Body.Close()
		w.noHostPath(t, body)
		limited := strings.Contains(body, "Too many file requests")
		if resp.StatusCode != http.StatusOK || limited != (i == 3) || !limited && !strings.Contains(body, "README.md") {
			t.Fatalf("panel %d = %d, limited %v:\n%s", i+1, resp.StatusCode, limited, body)
		}
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE action = 'file_resource.denied'
		AND actor_id = $1 AND details->>'reason' = 'rate_limited'`, w.r.Board.User.ID); n != 1 {
		t.Fatalf("panel rate-limit denial events = %d", n)
	}
}

// TestFileRateLimiter proves the token bucket on a fake clock: the burst, the wait it reports,
// continuous refill capped at the burst, independent keys, a clock that goes backwards, and the
// sweep of idle buckets.
func TestFileRateLimiter(t *testing.T) {
	t.Parallel()
	clock := &fileClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := newRateLimiter(120, time.Minute, clock.Now)
	for i := range 120 {
		if ok, _ := l.allow("u1"); !ok {
			t.Fatalf("request %d refused within the burst", i+1)
		}
	}
	ok, wait := l.allow("u1")
	if ok || wait != 500*time.Millisecond || retryAfterSeconds(wait) != 1 {
		t.Fatalf("121st = %v wait %v", ok, wait)
	}
	if ok, _ := l.allow("u2"); !ok {
		t.Fatal("another key was refused")
	}
	clock.advance(499 * time.Millisecond)
	if ok, _ := l.allow("u1"); ok {
		t.Fatal("allowed before a token refilled")
	}
	clock.advance(time.Millisecond)
	if ok, _ := l.allow("u1"); !ok {
		t.Fatal("refused after a token refilled")
	}
	clock.advance(-time.Hour)
	if ok, _ := l.allow("u1"); ok {
		t.Fatal("a clock going backwards refilled the bucket")
	}
	clock.advance(2 * time.Hour)
	for i := range 120 {
		if ok, _ := l.allow("u1"); !ok {
			t.Fatalf("after a long idle, request %d refused: the refill is not capped at the burst", i+1)
		}
	}
	if ok, _ := l.allow("u1"); ok {
		t.Fatal("refill exceeded the burst")
	}

	small := newRateLimiter(2, time.Minute, clock.Now)
	if ok, w := small.allow("a"); !ok || w != 0 {
		t.Fatal("first request refused")
	}
	small.allow("a")
	if _, w := small.allow("a"); retryAfterSeconds(w) != 30 {
		t.Fatalf("wait with 2 per minute = %v", w)
	}
	for i := range rateSweepAt {
		small.allow(fmt.Sprint("idle-", i))
	}
	clock.advance(time.Minute)
	small.allow("fresh")
	small.mu.Lock()
	n := len(small.tat)
	small.mu.Unlock()
	if n != 1 {
		t.Fatalf("buckets after the sweep = %d, want only the fresh one", n)
	}
}

// TestFileAttachmentDisposition proves downloads are named safely: quotes, control characters,
// separators and non-ASCII never reach the quoted name, and the exact name is percent-encoded.
func TestFileAttachmentDisposition(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"report.pdf":        `attachment; filename="report.pdf"; filename*=UTF-8''report.pdf`,
		"a\"b\r\n;c.txt":    `attachment; filename="a_b___c.txt"; filename*=UTF-8''a%22b%0D%0A%3Bc.txt`,
		"résumé 1.txt":      `attachment; filename="r_sum_ 1.txt"; filename*=UTF-8''r%C3%A9sum%C3%A9%201.txt`,
		"..":                `attachment; filename="download"; filename*=UTF-8''..`,
		"\xff\xfe":          `attachment; filename="_"; filename*=UTF-8''_`,
		"x/../y\\z%41.html": `attachment; filename="x_.._y_z_41.html"; filename*=UTF-8''x%2F..%2Fy%5Cz%2541.html`,
	}
	for name, want := range cases {
		if got := attachmentDisposition(name); got != want {
			t.Errorf("attachmentDisposition(%q) = %q, want %q", name, got, want)
		}
	}
}

// TestFileBrowserPanel proves the task page's panel (roots, the htmx load with a plain link as
// fallback), htmx navigation into directories and pages, the escaped name and preview of
// <script>.txt, the truncation notice, download links, refusals shown inside the panel (200 for
// htmx, the real status for the page), and no inline script or style.
func TestFileBrowserPanel(t *testing.T) {
	t.Parallel()
	w := newFileWorld(t)
	c := w.e.browser(w.r.Board)
	base := "/tasks/" + w.TaskID + "/files"
	rootList := base + "?" + url.Values{"root": {w.DirRoot}}.Encode()

	resp, body := w.page(t, c, "/tasks/"+w.TaskID, false)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="files"`) ||
		!strings.Contains(body, `hx-get="`+htmlAttr(rootList)+`" hx-trigger="load"`) ||
		!strings.Contains(body, `href="`+htmlAttr(rootList)+`"`) ||
		!strings.Contains(body, "assets (directory, primary)") || !strings.Contains(body, "app (git repository)") {
		t.Fatalf("task page panel = %d\n%s", resp.StatusCode, filePanel(body))
	}

	resp, body = w.page(t, c, rootList, true)
	if resp.StatusCode != http.StatusOK || strings.Contains(body, "<html") || !strings.HasPrefix(strings.TrimSpace(body), `<section class="card" id="files"`) {
		t.Fatalf("panel fragment = %d\n%s", resp.StatusCode, body)
	}
	if strings.Contains(body, "<script>") || !strings.Contains(body, "&lt;script&gt;.txt") {
		t.Fatalf("file name not escaped:\n%s", body)
	}
	for _, want := range []string{"README.md", "docs", "many",
		htmlAttr(base + "?" + url.Values{"root": {w.DirRoot}, "path": {"docs"}}.Encode()),
		htmlAttr(base + "?" + url.Values{"root": {w.DirRoot}, "file": {"README.md"}}.Encode()),
		htmlAttr("/api/tasks/" + w.TaskID + "/file-resources/content?" + url.Values{"root": {w.DirRoot}, "path": {"README.md"}, "download": {"1"}}.Encode()),
	} {
		if !strings.Contains(body, want) {
			t.Fatalf("panel lacks %q:\n%s", want, body)
		}
	}
	for _, hidden := range []string{".env", ".git", "link-etc", "link-out"} {
		if strings.Contains(body, ">"+hidden) {
			t.Fatalf("panel lists %s", hidden)
		}
	}
	fileNoInline(t, body)

	resp, body = w.page(t, c, base+"?"+url.Values{"root": {w.DirRoot}, "file": {"<script>.txt"}}.Encode(), true)
	if resp.StatusCode != http.StatusOK || strings.Contains(body, "<script>alert") ||
		!strings.Contains(body, "<pre>&lt;script&gt;alert(1)&lt;/script&gt;</pre>") || !strings.Contains(body, "download") {
		t.Fatalf("preview = %d\n%s", resp.StatusCode, body)
	}
	_, body = w.page(t, c, base+"?"+url.Values{"root": {w.DirRoot}, "file": {"big.txt"}}.Encode(), true)
	if !strings.Contains(body, "Showing the first 512.0 KiB of 600.0 KiB") {
		t.Fatalf("no truncation notice:\n%.2000s", body)
	}
	_, body = w.page(t, c, base+"?"+url.Values{"root": {w.DirRoot}, "file": {"blob.bin"}}.Encode(), true)
	if !strings.Contains(body, "not text") || strings.Contains(body, "<pre>") {
		t.Fatalf("binary preview:\n%s", body)
	}

	_, body = w.page(t, c, base+"?"+url.Values{"root": {w.DirRoot}, "path": {"many"}}.Encode(), true)
	if strings.Count(body, "<tr>") != 101 || !strings.Contains(body, "Next page") || strings.Contains(body, "f100.txt") {
		t.Fatalf("first page of many/ = %d rows", strings.Count(body, "<tr>")-1)
	}
	next := htmlUnescapeAttr(between(body, `<a class="btn" href="`, `"`))
	_, body = w.page(t, c, next, true)
	if strings.Count(body, "<tr>") != 51 || !strings.Contains(body, "f149.txt") || strings.Contains(body, "Next page") {
		t.Fatalf("second page of many/ (%s) = %d rows", next, strings.Count(body, "<tr>")-1)
	}

	_, body = w.page(t, c, base+"?"+url.Values{"root": {w.RepoRoot}}.Encode(), true)
	if !strings.Contains(body, "main.go") || strings.Contains(body, ">.git") {
		t.Fatalf("git root panel:\n%s", body)
	}

	refusals := []struct {
		q      url.Values
		status int
		text   string
	}{
		{url.Values{"root": {w.DirRoot}, "file": {".env"}}, 403, "never readable through Berth"},
		{url.Values{"root": {w.DirRoot}, "path": {"link-etc"}}, 403, "outside the workspace"},
		{url.Values{"root": {w.DirRoot}, "file": {"missing.txt"}}, 404, "No such file or directory"},
		{url.Values{"root": {w.DirRoot}, "file": {"/etc/passwd"}}, 400, "not valid"},
		{url.Values{"root": {"project-workspace:nope"}}, 404, "no file root by that name"},
	}
	for _, r := range refusals {
		resp, body := w.page(t, c, base+"?"+r.q.Encode(), true)
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, `role="alert"`) || !strings.Contains(body, r.text) {
			t.Errorf("htmx %v = %d\n%s", r.q, resp.StatusCode, body)
		}
		resp, body = w.page(t, c, base+"?"+r.q.Encode(), false)
		if resp.StatusCode != r.status || !strings.Contains(body, "<html") || !strings.Contains(body, r.text) {
			t.Errorf("page %v = %d, want %d", r.q, resp.StatusCode, r.status)
		}
		fileNoInline(t, body)
	}
	if n := w.e.count(`SELECT count(*) FROM audit_events WHERE action = 'file_resource.denied' AND actor_id = $1`, w.r.Board.User.ID); n != 4 {
		t.Fatalf("panel denial events = %d, want 4 (two 403s, each as htmx and as a page)", n)
	}

	resp, body = w.page(t, c, base+"?"+url.Values{"root": {w.DirRoot}, "path": {"docs"}}.Encode(), false)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "<html") || !strings.Contains(body, "guide.md") ||
		!strings.Contains(body, `<strong aria-current="location">docs</strong>`) {
		t.Fatalf("full page = %d\n%s", resp.StatusCode, filePanel(body))
	}
	fileNoInline(t, body)
}

// fileNoInline fails on inline script, style or event handlers (the CSP forbids them).
func fileNoInline(t *testing.T, body string) {
	t.Helper()
	lower := strings.ToLower(body)
	if strings.Contains(lower, " style=") || strings.Contains(lower, "<style") || strings.Contains(lower, " onclick=") ||
		strings.Contains(lower, " onload=") || strings.Contains(lower, "javascript:") {
		t.Fatalf("inline style or script:\n%s", body)
	}
	for _, tag := range strings.Split(lower, "<script")[1:] {
		if !strings.HasPrefix(strings.TrimSpace(tag), "src=") {
			t.Fatalf("inline <script%.80s", tag)
		}
	}
}

// filePanel cuts the file browser out of a page, for failure messages.
func filePanel(body string) string {
	if i := strings.Index(body, `id="files"`); i >= 0 {
		return body[i:min(len(body), i+3000)]
	}
	return body[:min(len(body), 3000)]
}

// htmlAttr is s as templ writes it in an attribute.
func htmlAttr(s string) string { return strings.ReplaceAll(s, "&", "&amp;") }

func htmlUnescapeAttr(s string) string { return strings.ReplaceAll(s, "&amp;", "&") }

// between returns the text after the first from and before the next to.
func between(s, from, to string) string {
	_, after, ok := strings.Cut(s, from)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(after, to)
	return v
}
