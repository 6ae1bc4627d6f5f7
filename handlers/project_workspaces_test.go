package handlers

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// projGit runs git for a fixture repository with a fixed identity and no user config.
func projGit(t testing.TB, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=T", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=T", "GIT_COMMITTER_EMAIL=t@example.com"}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

// projRepo makes a git work tree on branch main with one commit.
func projRepo(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	projGit(t, dir, "init", "-q", "-b", "main")
	if err := os.WriteFile(filepath.Join(dir, "README"), []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	projGit(t, dir, "add", "README")
	projGit(t, dir, "commit", "-q", "-m", "first")
	return dir
}

// workspace adds a workspace to a project through the API as the board member.
func (f *projT) workspace(projectID string, body map[string]any) map[string]any {
	f.t.Helper()
	status, out := f.e.call(f.Board, http.MethodPost, "/api/projects/"+projectID+"/workspaces", body)
	if status != http.StatusCreated {
		f.t.Fatalf("create workspace %v = %d %v", body, status, out)
	}
	return out
}

// dirWorkspace is a directory workspace body with a fresh directory.
func (f *projT) dirWorkspace(name string) map[string]any {
	return map[string]any{"name": name, "source_type": "directory", "source": f.t.TempDir()}
}

// primaries lists the names of a project's primary workspaces, straight from the table.
func (f *projT) primaries(projectID string) []string {
	f.t.Helper()
	rows, err := f.e.pool.Query(context.Background(), `SELECT name FROM project_workspaces WHERE project_id = $1 AND is_primary ORDER BY name`, projectID)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			f.t.Fatal(err)
		}
		names = append(names, n)
	}
	return names
}

func TestProjectWorkspaceRoleMatrix(t *testing.T) {
	t.Parallel()
	f := newProjT(t)
	pid := f.project("WS", nil)["id"].(string)
	w := f.workspace(pid, f.dirWorkspace("main"))
	wid := w["id"].(string)
	second := f.workspace(pid, f.dirWorkspace("second"))["id"].(string)
	snapshot := func() string {
		var s string
		if err := f.e.pool.QueryRow(context.Background(), `SELECT string_agg(name || ':' || is_primary::text || ':' || source, ',' ORDER BY name)
			FROM project_workspaces`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}

	for _, tc := range []struct {
		who  actor
		want int
	}{{f.Board, 200}, {f.Viewer, 200}, {f.Admin, 200}, {f.Other, 404}} {
		for _, path := range []string{"/api/projects/" + pid + "/workspaces", "/api/project-workspaces/" + wid} {
			if status, out := f.e.call(tc.who, http.MethodGet, path, nil); status != tc.want {
				t.Errorf("%s GET %s = %d %v, want %d", tc.who.User.Email, path, status, out, tc.want)
			}
		}
		if resp, _ := f.get(tc.who, "/project-workspaces/"+wid); resp.StatusCode != tc.want {
			t.Errorf("%s page = %d, want %d", tc.who.User.Email, resp.StatusCode, tc.want)
		}
	}

	dir := t.TempDir()
	for _, tc := range []struct {
		who  actor
		want int
	}{{f.Viewer, 403}, {f.Admin, 403}, {f.Other, 404}} {
		before := snapshot()
		for _, req := range []struct {
			method, path string
			body         any
		}{
			{http.MethodPost, "/api/projects/" + pid + "/workspaces", map[string]any{"name": "x", "source_type": "directory", "source": dir}},
			{http.MethodPatch, "/api/project-workspaces/" + wid, map[string]any{"name": "hijacked"}},
			{http.MethodPatch, "/api/project-workspaces/" + second, map[string]any{"is_primary": true}},
			{http.MethodDelete, "/api/project-workspaces/" + second, nil},
		} {
			if status, out := f.e.call(tc.who, req.method, req.path, req.body); status != tc.want {
				t.Errorf("%s %s %s = %d %v, want %d", tc.who.User.Email, req.method, req.path, status, out, tc.want)
			}
		}
		for _, fm := range []struct {
			path string
			form url.Values
		}{
			{"/projects/" + pid + "/workspaces", url.Values{"name": {"x"}, "source_type": {"directory"}, "source": {dir}}},
			{"/project-workspaces/" + wid, url.Values{"name": {"hijacked"}, "source_type": {"directory"}, "source": {dir}}},
			{"/project-workspaces/" + second + "/primary", nil},
			{"/project-workspaces/" + second + "/delete", nil},
		} {
			if resp, _ := f.post(tc.who, fm.path, fm.form, false); resp.StatusCode != tc.want {
				t.Errorf("%s POST %s = %d, want %d", tc.who.User.Email, fm.path, resp.StatusCode, tc.want)
			}
		}
		if after := snapshot(); after != before {
			t.Errorf("%s changed workspaces: %s → %s", tc.who.User.Email, before, after)
		}
	}
	// Viewer and admin, API and form: one create, two updates (rename, primary), one delete each.
	for action, want := range map[string]int{"project_workspace.create.denied": 4, "project_workspace.update.denied": 8,
		"project_workspace.delete.denied": 4} {
		if n := f.audits(action); n != want {
			t.Errorf("%s events = %d, want %d", action, n, want)
		}
	}

	// The board member may do all of it.
	if status, out := f.e.call(f.Board, http.MethodPatch, "/api/project-workspaces/"+second, map[string]any{"is_primary": true}); status != 200 || out["is_primary"] != true {
		t.Fatalf("board PATCH = %d %v", status, out)
	}
	if status, _ := f.e.call(f.Board, http.MethodDelete, "/api/project-workspaces/"+wid, nil); status != 204 {
		t.Fatalf("board DELETE = %d", status)
	}
	if status, _ := f.e.call(f.Board, http.MethodGet, "/api/project-workspaces/"+wid, nil); status != 404 {
		t.Fatalf("deleted workspace GET = %d", status)
	}
}

func TestProjectWorkspaceSourceValidation(t *testing.T) {
	t.Parallel()
	f := newProjT(t)
	pid := f.project("SRC", nil)["id"].(string)
	repo := projRepo(t)
	bare := filepath.Join(t.TempDir(), "bare.git")
	projGit(t, repo, "clone", "-q", "--bare", repo, bare)
	plain := t.TempDir()
	file := filepath.Join(plain, "f.txt")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name             string
		typ, source, ref string
		field, msg       string // expected refusal; "" = created
		wantRef          any
	}{
		{"missing path", "git", filepath.Join(plain, "missing"), "", "source", "does not exist", nil},
		{"not a repository", "git", plain, "", "source", "not a git repository", nil},
		{"a file", "git", file, "", "source", "not a directory", nil},
		{"missing ref", "git", repo, "release", "default_ref", `"release" does not name a commit`, nil},
		{"relative path", "git", "repo", "main", "source", "absolute path", nil},
		{"root", "directory", "/", "", "source", "/ itself", nil},
		{"dot-dot", "directory", plain + "/../x", "", "source", "..", nil},
		{"URL with credentials", "git", "https://bob:hunter2@git.example.com/app.git", "main", "source", "credentials", nil},
		{"URL without ref", "git", "https://git.example.com/app.git", "", "default_ref", "required", nil},
		{"unknown type", "svn", plain, "", "source_type", "git", nil},
		{"directory with ref", "directory", plain, "main", "default_ref", "only git", nil},
		{"repository, ref resolved from HEAD", "git", repo, "", "", "", "main"},
		{"bare repository", "git", bare, "main", "", "", "main"},
		{"URL", "git", "git@github.com:acme/app.git", "v1", "", "", "v1"},
		{"directory", "directory", plain + "/", "", "", "", nil},
	}
	for i, tc := range cases {
		before := f.e.count(`SELECT count(*) FROM project_workspaces`)
		status, out := f.e.call(f.Board, http.MethodPost, "/api/projects/"+pid+"/workspaces", map[string]any{
			"name": fmt.Sprintf("w%d", i), "source_type": tc.typ, "source": tc.source, "default_ref": tc.ref})
		after := f.e.count(`SELECT count(*) FROM project_workspaces`)
		if tc.field != "" {
			msg, _ := projErrFields(out)[tc.field].(string)
			if status != 422 || !strings.Contains(msg, tc.msg) || after != before {
				t.Errorf("%s = %d %v (count %d→%d); want 422 with %q on %s", tc.name, status, out, before, after, tc.msg, tc.field)
			}
			continue
		}
		if status != 201 || out["default_ref"] != tc.wantRef || after != before+1 {
			t.Errorf("%s = %d %v; want 201 with default_ref %v", tc.name, status, out, tc.wantRef)
		}
		if tc.typ == "directory" && out["source"] != filepath.Clean(tc.source) {
			t.Errorf("%s: source stored as %v, want the cleaned path", tc.name, out["source"])
		}
	}
	if f.e.count(`SELECT count(*) FROM audit_events WHERE details::text LIKE '%hunter2%'`) != 0 {
		t.Fatal("a refused credential reached the audit trail")
	}
}

func TestProjectWorkspacePrimaryRules(t *testing.T) {
	t.Parallel()
	f := newProjT(t)
	pid := f.project("PRI", nil)["id"].(string)
	first := f.workspace(pid, f.dirWorkspace("a"))
	if first["is_primary"] != true {
		t.Fatalf("first workspace is not primary: %v", first)
	}
	second := f.workspace(pid, f.dirWorkspace("b"))
	if second["is_primary"] != false || strings.Join(f.primaries(pid), ",") != "a" {
		t.Fatalf("second workspace took the primary flag: %v", f.primaries(pid))
	}
	third := f.workspace(pid, map[string]any{"name": "c", "source_type": "directory", "source": t.TempDir(), "is_primary": true})
	if third["is_primary"] != true || strings.Join(f.primaries(pid), ",") != "c" || f.audits("project_workspace.primary_changed") != 1 {
		t.Fatalf("is_primary on create did not flip: %v", f.primaries(pid))
	}
	// PATCH moves the flag; false on the primary is refused.
	bID := second["id"].(string)
	if status, out := f.e.call(f.Board, http.MethodPatch, "/api/project-workspaces/"+bID, map[string]any{"is_primary": true}); status != 200 || out["is_primary"] != true {
		t.Fatalf("PATCH is_primary = %d %v", status, out)
	}
	if strings.Join(f.primaries(pid), ",") != "b" || f.audits("project_workspace.primary_changed") != 2 {
		t.Fatalf("primaries after flip = %v", f.primaries(pid))
	}
	if status, out := f.e.call(f.Board, http.MethodPatch, "/api/project-workspaces/"+bID, map[string]any{"is_primary": false}); status != 409 || projErrCode(out) != "primary_required" {
		t.Fatalf("unset primary = %d %v, want 409 primary_required", status, out)
	}
	// Deleting the primary while others exist is refused; deleting the others, then it, is fine.
	if status, out := f.e.call(f.Board, http.MethodDelete, "/api/project-workspaces/"+bID, nil); status != 409 || projErrCode(out) != "primary_required" {
		t.Fatalf("delete primary = %d %v, want 409", status, out)
	}
	for _, id := range []string{first["id"].(string), third["id"].(string), bID} {
		if status, out := f.e.call(f.Board, http.MethodDelete, "/api/project-workspaces/"+id, nil); status != 204 {
			t.Fatalf("delete %s = %d %v", id, status, out)
		}
	}
	if n := f.e.count(`SELECT count(*) FROM project_workspaces`); n != 0 || f.audits("project_workspace.deleted") != 3 {
		t.Fatalf("%d workspaces left", n)
	}

	// The database itself refuses a second primary, whatever the API does.
	x := f.workspace(pid, f.dirWorkspace("x"))
	y := f.workspace(pid, f.dirWorkspace("y"))
	ctx := context.Background()
	if _, err := f.e.pool.Exec(ctx, `UPDATE project_workspaces SET is_primary = true WHERE id = $1`, y["id"]); err == nil {
		t.Fatal("the database accepted a second primary by UPDATE")
	}
	if _, err := f.e.pool.Exec(ctx, `INSERT INTO project_workspaces (company_id, project_id, name, source_type, source, is_primary)
		VALUES ($1, $2, 'z', 'directory', '/srv', true)`, f.A.ID, pid); err == nil {
		t.Fatal("the database accepted a second primary by INSERT")
	}
	if strings.Join(f.primaries(pid), ",") != "x" || x["is_primary"] != true {
		t.Fatalf("primaries = %v", f.primaries(pid))
	}
}

func TestProjectWorkspaceServicesValidation(t *testing.T) {
	t.Parallel()
	f := newProjT(t)
	pid := f.project("SVC", nil)["id"].(string)
	ok := map[string]any{"name": "web", "command": "npm run dev"}
	with := func(over map[string]any) map[string]any {
		m := map[string]any{}
		for k, v := range ok {
			m[k] = v
		}
		for k, v := range over {
			m[k] = v
		}
		return m
	}
	many := make([]any, 21)
	for i := range many {
		many[i] = map[string]any{"name": fmt.Sprintf("s%d", i), "command": "x"}
	}
	cases := []struct {
		name     string
		services []any
		field    string
	}{
		{"bad name", []any{with(map[string]any{"name": "Web Server"})}, "services[0].name"},
		{"empty name", []any{with(map[string]any{"name": ""})}, "services[0].name"},
		{"long name", []any{with(map[string]any{"name": strings.Repeat("a", 65)})}, "services[0].name"},
		{"duplicate name", []any{ok, with(map[string]any{"command": "y"})}, "services[1].name"},
		{"no command", []any{with(map[string]any{"command": "  "})}, "services[0].command"},
		{"bad port env", []any{ok, with(map[string]any{"name": "api", "port_env": "port"})}, "services[1].port_env"},
		{"port env with digit first", []any{with(map[string]any{"port_env": "9PORT"})}, "services[0].port_env"},
		{"reserved port env", []any{with(map[string]any{"port_env": "PATH"})}, "services[0].port_env"},
		{"berth port env", []any{with(map[string]any{"port_env": "BERTH_RUN_TOKEN"})}, "services[0].port_env"},
		{"relative health path", []any{with(map[string]any{"health_path": "health"})}, "services[0].health_path"},
		{"scheme-relative health path", []any{with(map[string]any{"health_path": "//evil.example/"})}, "services[0].health_path"},
		{"zero timeout", []any{with(map[string]any{"ready_timeout_s": 0})}, "services[0].ready_timeout_s"},
		{"long timeout", []any{with(map[string]any{"ready_timeout_s": 601})}, "services[0].ready_timeout_s"},
		{"bad stop policy", []any{with(map[string]any{"stop_policy": "never"})}, "services[0].stop_policy"},
		{"bad lifecycle", []any{with(map[string]any{"lifecycle": "forever"})}, "services[0].lifecycle"},
		{"too many", many, "services"},
	}
	for _, tc := range cases {
		before := f.e.count(`SELECT count(*) FROM project_workspaces`)
		status, out := f.e.call(f.Board, http.MethodPost, "/api/projects/"+pid+"/workspaces", map[string]any{
			"name": "w", "source_type": "directory", "source": t.TempDir(), "services": tc.services})
		if status != 422 || projErrFields(out)[tc.field] == nil || f.e.count(`SELECT count(*) FROM project_workspaces`) != before {
			t.Errorf("%s = %d %v, want 422 on %s and nothing created", tc.name, status, out, tc.field)
		}
	}
	// Unknown members of a service are refused like unknown top-level fields.
	status, _ := f.e.call(f.Board, http.MethodPost, "/api/projects/"+pid+"/workspaces", map[string]any{
		"name": "w", "source_type": "directory", "source": t.TempDir(), "services": []any{with(map[string]any{"port": 3000})}})
	if status != 400 {
		t.Fatalf("unknown service member = %d, want 400", status)
	}
	// Defaults are filled and stored.
	w := f.workspace(pid, map[string]any{"name": "w", "source_type": "directory", "source": t.TempDir(),
		"services": []any{ok, map[string]any{"name": "api-2", "command": "./api", "port_env": "API_PORT", "health_path": "/healthz",
			"ready_timeout_s": 600, "stop_policy": "on_run_finish", "lifecycle": "shared"}}})
	svcs := w["services"].([]any)
	got := fmt.Sprint(svcs[0])
	want := fmt.Sprint(map[string]any{"name": "web", "command": "npm run dev", "port_env": "PORT", "health_path": "/",
		"ready_timeout_s": float64(30), "stop_policy": "manual", "lifecycle": "ephemeral"})
	if got != want || svcs[1].(map[string]any)["lifecycle"] != "shared" {
		t.Fatalf("services = %v, want first %v", svcs, want)
	}
}

func TestProjectWorkspacePatch(t *testing.T) {
	t.Parallel()
	f := newProjT(t)
	pid := f.project("PAT", nil)["id"].(string)
	repo := projRepo(t)
	projGit(t, repo, "branch", "develop")
	w := f.workspace(pid, map[string]any{"name": "code", "source_type": "git", "source": repo, "setup_command": "make deps"})
	f.workspace(pid, f.dirWorkspace("other"))
	path := "/api/project-workspaces/" + w["id"].(string)

	status, out := f.e.call(f.Board, http.MethodPatch, path, map[string]any{"default_ref": "develop", "services": []any{map[string]any{"name": "web", "command": "x"}}})
	if status != 200 || out["default_ref"] != "develop" || out["setup_command"] != "make deps" || len(out["services"].([]any)) != 1 {
		t.Fatalf("PATCH ref = %d %v", status, out)
	}
	for _, tc := range []struct {
		body  any
		want  int
		code  string
		field string
	}{
		{map[string]any{"name": "other"}, 409, "name_taken", "name"},
		{map[string]any{"default_ref": "nope"}, 422, "validation_failed", "default_ref"},
		{map[string]any{"source": filepath.Join(repo, "missing")}, 422, "validation_failed", "source"},
		{map[string]any{"source_type": "hg"}, 422, "validation_failed", "source_type"},
		{map[string]any{"services": []any{map[string]any{"name": "web"}}}, 422, "validation_failed", "services[0].command"},
		{map[string]any{"project_id": pid}, 400, "server_owned_field", ""},
		{map[string]any{"is_primary": "yes"}, 400, "bad_json", ""},
	} {
		before := f.e.count(`SELECT count(*) FROM audit_events`)
		status, out := f.e.call(f.Board, http.MethodPatch, path, tc.body)
		if status != tc.want || projErrCode(out) != tc.code || (tc.field != "" && projErrFields(out)[tc.field] == nil) {
			t.Errorf("PATCH %v = %d %v, want %d %s on %q", tc.body, status, out, tc.want, tc.code, tc.field)
		}
		_, now := f.e.call(f.Board, http.MethodGet, path, nil)
		if now["name"] != "code" || now["default_ref"] != "develop" || len(now["services"].([]any)) != 1 || f.e.count(`SELECT count(*) FROM audit_events`) != before {
			t.Errorf("PATCH %v changed the workspace: %v", tc.body, now)
		}
	}
	// Moving to a directory clears the ref; an unchanged source is not checked again.
	status, out = f.e.call(f.Board, http.MethodPatch, path, map[string]any{"source_type": "directory", "setup_command": nil})
	if status != 200 || out["default_ref"] != nil || out["setup_command"] != nil || out["source_type"] != "directory" {
		t.Fatalf("PATCH to directory = %d %v", status, out)
	}
	if err := os.RemoveAll(repo); err != nil {
		t.Fatal(err)
	}
	if status, out := f.e.call(f.Board, http.MethodPatch, path, map[string]any{"name": "renamed"}); status != 200 || out["name"] != "renamed" {
		t.Fatalf("rename with the source gone = %d %v", status, out)
	}
	if status, out := f.e.call(f.Board, http.MethodPatch, path, map[string]any{"source": repo + "/"}); status != 422 || projErrFields(out)["source"] == nil {
		t.Fatalf("changed source is not checked: %d %v", status, out)
	}
	var changed string
	if err := f.e.pool.QueryRow(context.Background(), `SELECT details->>'changed' FROM audit_events
		WHERE action = 'project_workspace.updated' ORDER BY id DESC LIMIT 1`).Scan(&changed); err != nil || !strings.Contains(changed, "name") {
		t.Fatalf("update audit = %q %v", changed, err)
	}
}

func TestProjectWorkspaceArchivedProject(t *testing.T) {
	t.Parallel()
	f := newProjT(t)
	pid := f.project("ARC", nil)["id"].(string)
	w := f.workspace(pid, f.dirWorkspace("main"))
	wid := w["id"].(string)
	if status, _ := f.e.call(f.Board, http.MethodPatch, "/api/projects/"+pid, map[string]any{"status": "archived"}); status != 200 {
		t.Fatal("archive failed")
	}
	before := f.e.count(`SELECT count(*) FROM project_workspaces`)
	for _, req := range []struct {
		method, path string
		body         any
	}{
		{http.MethodPost, "/api/projects/" + pid + "/workspaces", f.dirWorkspace("new")},
		{http.MethodPatch, "/api/project-workspaces/" + wid, map[string]any{"name": "renamed"}},
		{http.MethodDelete, "/api/project-workspaces/" + wid, nil},
	} {
		if status, out := f.e.call(f.Board, req.method, req.path, req.body); status != 409 || projErrCode(out) != "project_archived" {
			t.Errorf("%s %s on an archived project = %d %v, want 409 project_archived", req.method, req.path, status, out)
		}
	}
	for _, path := range []string{"/projects/" + pid + "/workspaces", "/project-workspaces/" + wid, "/project-workspaces/" + wid + "/delete"} {
		form := url.Values{"name": {"x"}, "source_type": {"directory"}, "source": {t.TempDir()}}
		if resp, _ := f.post(f.Board, path, form, false); resp.StatusCode != 409 {
			t.Errorf("form %s on an archived project = %d, want 409", path, resp.StatusCode)
		}
	}
	if f.e.count(`SELECT count(*) FROM project_workspaces`) != before {
		t.Fatal("writes to an archived project's workspaces changed something")
	}
	if status, out := f.e.call(f.Viewer, http.MethodGet, "/api/project-workspaces/"+wid, nil); status != 200 || out["name"] != "main" {
		t.Fatalf("read on an archived project = %d", status)
	}
	resp, body := f.get(f.Board, "/project-workspaces/"+wid)
	if resp.StatusCode != 200 || strings.Contains(body, `id="edit-workspace"`) || !strings.Contains(body, "read-only") {
		t.Fatal("archived project's workspace page offers editing")
	}
}

func TestProjectWorkspaceAPIHygiene(t *testing.T) {
	t.Parallel()
	f := newProjT(t)
	pid := f.project("HYW", nil)["id"].(string)
	wid := f.workspace(pid, f.dirWorkspace("main"))["id"].(string)
	create := "/api/projects/" + pid + "/workspaces"
	patch := "/api/project-workspaces/" + wid
	big := `{"name":"` + strings.Repeat("a", 1<<20) + `"}`
	for _, tc := range []struct {
		method, path, ctype, body string
		want                      int
	}{
		{http.MethodPost, create, "text/plain", `{"name":"x"}`, 415},
		{http.MethodPost, create, "application/json", big, 413},
		{http.MethodPost, create, "application/json", `{"name":"x","source_type":"directory","source":"/tmp","colour":"red"}`, 400},
		{http.MethodPost, create, "application/json", `{"name":"x","source_type":"directory","source":"/tmp","company_id":"x"}`, 400},
		{http.MethodPost, create, "application/json", `{"name":"x","source_type":"directory","source":"/tmp","project_id":"x"}`, 400},
		{http.MethodPatch, patch, "text/plain", `{"name":"x"}`, 415},
		{http.MethodPatch, patch, "application/json", big, 413},
		{http.MethodPatch, patch, "application/json", `{"services":[{"name":"a","command":"b","extra":1}]}`, 400},
		{http.MethodPatch, patch, "application/json", `{"id":"x"}`, 400},
	} {
		status, body := f.raw(f.Board, tc.method, tc.path, tc.ctype, tc.body)
		if status != tc.want {
			t.Errorf("%s %s (%s) = %d %.200s, want %d", tc.method, tc.path, tc.ctype, status, body, tc.want)
		}
	}
	if n := f.e.count(`SELECT count(*) FROM project_workspaces WHERE name = 'main'`); n != 1 || f.e.count(`SELECT count(*) FROM project_workspaces`) != 1 {
		t.Fatal("refused requests changed the workspaces")
	}
	// Pagination: limit and cursor walk the list by name.
	for _, n := range []string{"b", "c", "d"} {
		f.workspace(pid, f.dirWorkspace(n))
	}
	var names []string
	cursor := ""
	for range 4 {
		status, out := f.e.call(f.Viewer, http.MethodGet, create+"?limit=3&cursor="+url.QueryEscape(cursor), nil)
		if status != 200 {
			t.Fatalf("list = %d %v", status, out)
		}
		for _, it := range out["items"].([]any) {
			names = append(names, it.(map[string]any)["name"].(string))
		}
		if cursor, _ = out["next_cursor"].(string); cursor == "" {
			break
		}
	}
	if strings.Join(names, ",") != "b,c,d,main" {
		t.Fatalf("paged names = %v", names)
	}
}

func TestProjectWorkspaceForms(t *testing.T) {
	t.Parallel()
	f := newProjT(t)
	pid := f.project("FRM", nil)["id"].(string)
	repo := projRepo(t)
	add := url.Values{"name": {"code"}, "source_type": {"git"}, "source": {repo}, "default_ref": {""},
		"setup_command": {"make deps\r\nmake build"}}

	// Refused: the section (htmx) or the page re-renders with the message; nothing is created.
	bad := url.Values{"name": {"code"}, "source_type": {"git"}, "source": {filepath.Join(repo, "nope")}}
	resp, body := f.post(f.Board, "/projects/"+pid+"/workspaces", bad, true)
	if resp.StatusCode != 422 || !strings.Contains(body, `id="workspaces"`) || !strings.Contains(body, "does not exist") || strings.Contains(body, "<html") {
		t.Fatalf("bad htmx add = %d %.400s", resp.StatusCode, body)
	}
	resp, body = f.post(f.Board, "/projects/"+pid+"/workspaces", bad, false)
	if resp.StatusCode != 422 || !strings.Contains(body, "<html") || !strings.Contains(body, "does not exist") {
		t.Fatalf("bad add = %d", resp.StatusCode)
	}
	if n := f.e.count(`SELECT count(*) FROM project_workspaces`); n != 0 {
		t.Fatalf("refused forms created %d workspaces", n)
	}

	// Added with htmx: the refreshed section lists it as primary.
	resp, body = f.post(f.Board, "/projects/"+pid+"/workspaces", add, true)
	if resp.StatusCode != 200 || !strings.Contains(body, `id="workspaces"`) || !strings.Contains(body, "primary") || !strings.Contains(body, repo) {
		t.Fatalf("htmx add = %d %.400s", resp.StatusCode, body)
	}
	add.Set("name", "docs")
	add.Set("source_type", "directory")
	add.Set("source", t.TempDir())
	resp, _ = f.post(f.Board, "/projects/"+pid+"/workspaces", add, false)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/projects/"+pid {
		t.Fatalf("add = %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	var codeID, docsID, setup, ref string
	ctx := context.Background()
	if err := f.e.pool.QueryRow(ctx, `SELECT id, setup_command, default_ref FROM project_workspaces WHERE name = 'code'`).Scan(&codeID, &setup, &ref); err != nil {
		t.Fatal(err)
	}
	if err := f.e.pool.QueryRow(ctx, `SELECT id FROM project_workspaces WHERE name = 'docs'`).Scan(&docsID); err != nil {
		t.Fatal(err)
	}
	if setup != "make deps\nmake build" || ref != "main" {
		t.Fatalf("stored setup %q ref %q", setup, ref)
	}

	// Edit with a service in the form's blank row; a refused row changes nothing.
	edit := url.Values{"name": {"docs"}, "source_type": {"directory"}, "source": {add.Get("source")},
		"services_rows": {"1"}, "services[0].new": {"1"}, "services[0].name": {"web"},
		"services[0].command": {"python3 -m http.server $PORT"}, "services[0].strip_prefix": {"true"}}
	resp, _ = f.post(f.Board, "/project-workspaces/"+docsID, edit, false)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("edit = %d", resp.StatusCode)
	}
	_, body = f.get(f.Viewer, "/project-workspaces/"+docsID)
	if !strings.Contains(body, "python3 -m http.server $PORT") || !strings.Contains(body, "ephemeral") {
		t.Fatal("workspace page does not list the service")
	}
	for _, bad := range []map[string]string{{"services[0].name": "Web"}, {"services[0].command": " "}, {"services[0].ready_timeout_s": "soon"}} {
		refused := url.Values{}
		for k, v := range edit {
			refused[k] = v
		}
		for k, v := range bad {
			refused.Set(k, v)
		}
		resp, body = f.post(f.Board, "/project-workspaces/"+docsID, refused, true)
		if resp.StatusCode != 422 || !strings.Contains(body, `id="edit-workspace"`) || !strings.Contains(body, "field-error") {
			t.Errorf("services %v = %d", bad, resp.StatusCode)
		}
	}
	if n := f.e.count(`SELECT jsonb_array_length(services) FROM project_workspaces WHERE id = $1`, docsID); n != 1 {
		t.Fatalf("refused edits changed the services: %d", n)
	}
	// Make primary from the project page (htmx refreshes the section), then delete the other.
	resp, body = f.post(f.Board, "/project-workspaces/"+docsID+"/primary", nil, true)
	if resp.StatusCode != 200 || !strings.Contains(body, `id="workspaces"`) || strings.Join(f.primaries(pid), ",") != "docs" {
		t.Fatalf("make primary = %d, primaries %v", resp.StatusCode, f.primaries(pid))
	}
	_, body = f.get(f.Board, "/project-workspaces/"+docsID)
	if strings.Contains(body, "/delete") || !strings.Contains(body, "make another workspace") {
		t.Fatal("the primary's page offers deletion while another workspace exists")
	}
	resp, _ = f.post(f.Board, "/project-workspaces/"+codeID+"/delete", nil, false)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/projects/"+pid {
		t.Fatalf("delete form = %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if f.e.count(`SELECT count(*) FROM project_workspaces`) != 1 {
		t.Fatal("delete form did not delete")
	}
}

func TestProjectWorkspaceHTMLEscaping(t *testing.T) {
	t.Parallel()
	f := newProjT(t)
	pid := f.project("ESC", nil)["id"].(string)
	dir := filepath.Join(t.TempDir(), `<script>d`)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	w := f.workspace(pid, map[string]any{"name": `<script>alert(1)</script>`, "source_type": "directory", "source": dir,
		"setup_command": `echo "<b>hi</b>"`, "services": []any{map[string]any{"name": "web", "command": `<img src=x onerror=alert(1)>`}}})
	for _, path := range []string{"/projects/" + pid, "/project-workspaces/" + w["id"].(string)} {
		resp, body := f.get(f.Viewer, path)
		if resp.StatusCode != 200 {
			t.Fatalf("%s = %d", path, resp.StatusCode)
		}
		if strings.Contains(body, "<script>alert") || strings.Contains(body, "<script>d") || strings.Contains(body, "<b>hi") || strings.Contains(body, "<img src=x") {
			t.Fatalf("%s renders workspace text unescaped", path)
		}
		if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
			t.Fatalf("%s does not show the escaped name", path)
		}
	}
}
