package handlers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
)

// taskWorld is a server with the standard roles and, in company A, project PRJ with a primary
// git workspace and an active local environment set as its policy's environment.
type taskWorld struct {
	e         *testEnv
	r         roles
	ProjectID string
	EnvID     string
}

func newTaskWorld(t testing.TB) *taskWorld {
	t.Helper()
	return newTaskWorldOn(setup(t))
}

// newTaskWorldOn populates a server that is already set up.
func newTaskWorldOn(e *testEnv) *taskWorld {
	e.t.Helper()
	w := &taskWorld{e: e, r: e.roles()}
	w.EnvID = w.addEnvironment(w.r.A.ID, "local", "local", "active", "")
	w.ProjectID = w.addProject(w.r.A.ID, "PRJ", fmt.Sprintf(`{"default_mode":"shared","environment_id":%q,"strategy":"git_worktree"}`, w.EnvID))
	w.addProjectWorkspace(w.r.A.ID, w.ProjectID, "git", true)
	return w
}

// id runs an INSERT … RETURNING id.
func (w *taskWorld) id(sql string, args ...any) string {
	w.e.t.Helper()
	var id string
	if err := w.e.pool.QueryRow(context.Background(), sql, args...).Scan(&id); err != nil {
		w.e.t.Fatalf("%s: %v", sql, err)
	}
	return id
}

func (w *taskWorld) exec(sql string, args ...any) {
	w.e.t.Helper()
	if _, err := w.e.pool.Exec(context.Background(), sql, args...); err != nil {
		w.e.t.Fatalf("%s: %v", sql, err)
	}
}

func (w *taskWorld) addProject(companyID, key, policy string) string {
	return w.id(`INSERT INTO projects (company_id, name, key, execution_policy) VALUES ($1, $2, $3, $4) RETURNING id`,
		companyID, "Project "+key, key, policy)
}

// addEnvironment inserts an environment; qualification is its JSON or "" for none.
func (w *taskWorld) addEnvironment(companyID, name, driver, status, qualification string) string {
	var q any
	if qualification != "" {
		q = qualification
	}
	return w.id(`INSERT INTO environments (company_id, name, driver, status, qualification) VALUES ($1, $2, $3, $4, $5) RETURNING id`,
		companyID, name, driver, status, q)
}

func (w *taskWorld) addProjectWorkspace(companyID, projectID, sourceType string, primary bool) string {
	return w.id(`INSERT INTO project_workspaces (company_id, project_id, name, source_type, source, is_primary)
		VALUES ($1, $2, $3, $4, '/srv/src', $5) RETURNING id`, companyID, projectID, "ws-"+sourceType+fmt.Sprint(primary), sourceType, primary)
}

// addExecWorkspace inserts an execution workspace with a fresh opaque ref.
func (w *taskWorld) addExecWorkspace(companyID, projectID, trust, status string) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return w.id(`INSERT INTO execution_workspaces (company_id, project_id, mode, strategy, trust, status, ref, branch)
		VALUES ($1, $2, 'isolated', 'git_worktree', $3, $4, $5, 'berth/PRJ-1') RETURNING id`,
		companyID, projectID, trust, status, "ws-"+hex.EncodeToString(b))
}

// createTask creates a task through the API as a and returns it; anything but 201 fails the test.
func (w *taskWorld) createTask(a actor, projectID string, body map[string]any) map[string]any {
	w.e.t.Helper()
	status, out := w.e.call(a, http.MethodPost, "/api/projects/"+projectID+"/tasks", body)
	if status != http.StatusCreated {
		w.e.t.Fatalf("create task = %d %v", status, out)
	}
	return out
}

// fingerprint digests every task, binding and remembered binding request, so a test can assert
// that a refused request changed nothing.
func (w *taskWorld) fingerprint() string {
	w.e.t.Helper()
	var s string
	err := w.e.pool.QueryRow(context.Background(), `SELECT
		coalesce((SELECT md5(string_agg(t::text, ',' ORDER BY t.id)) FROM tasks t), '') ||
		coalesce((SELECT md5(string_agg(b::text, ',' ORDER BY b.task_id)) FROM task_workspace_bindings b), '') ||
		coalesce((SELECT md5(string_agg(r::text, ',' ORDER BY r.task_id, r.request_key)) FROM task_binding_requests r), '') ||
		(SELECT string_agg(next_task_number::text, ',' ORDER BY id) FROM projects)`).Scan(&s)
	if err != nil {
		w.e.t.Fatal(err)
	}
	return s
}

// postForm posts a urlencoded form from a browser session, optionally as htmx.
func (w *taskWorld) postForm(c *http.Client, path string, form url.Values, htmx bool) (*http.Response, string) {
	w.e.t.Helper()
	h := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
	if htmx {
		h["HX-Request"] = "true"
	}
	resp := w.e.do(c, http.MethodPost, path, strings.NewReader(form.Encode()), h)
	return resp, readBody(w.e.t, resp)
}

// get fetches a page from a browser session, optionally as htmx.
func (w *taskWorld) get(c *http.Client, path string, htmx bool) (*http.Response, string) {
	w.e.t.Helper()
	h := map[string]string{}
	if htmx {
		h["HX-Request"] = "true"
	}
	resp := w.e.do(c, http.MethodGet, path, nil, h)
	return resp, readBody(w.e.t, resp)
}

func taskErrorCode(out map[string]any) string {
	e, _ := out["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

func taskErrorFields(out map[string]any) map[string]any {
	e, _ := out["error"].(map[string]any)
	f, _ := e["fields"].(map[string]any)
	return f
}

// TestTaskKeysAreAllocatedPerProject proves keys are KEY-N in creation order, that numbering is
// per project, and that concurrent creates get distinct, gap-free numbers.
func TestTaskKeysAreAllocatedPerProject(t *testing.T) {
	t.Parallel()
	w := newTaskWorld(t)
	for i := 1; i <= 3; i++ {
		out := w.createTask(w.r.Board, w.ProjectID, map[string]any{"title": fmt.Sprint("Task ", i)})
		if out["key"] != fmt.Sprint("PRJ-", i) || out["number"] != float64(i) {
			t.Fatalf("task %d = key %v number %v", i, out["key"], out["number"])
		}
	}
	other := w.addProject(w.r.A.ID, "OPS", `{}`)
	if out := w.createTask(w.r.Board, other, map[string]any{"title": "First ops task"}); out["key"] != "OPS-1" {
		t.Fatalf("first task of another project = %v", out["key"])
	}

	const n = 16
	var wg sync.WaitGroup
	keys := make(chan string, n)
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, out, err := taskRawCall(w.e, w.r.Board, http.MethodPost, "/api/projects/"+w.ProjectID+"/tasks", `{"title":"concurrent"}`)
			if err != nil || status != http.StatusCreated {
				errs <- fmt.Errorf("concurrent create = %d %v %v", status, out, err)
				return
			}
			keys <- out["key"].(string)
		}()
	}
	wg.Wait()
	close(keys)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var got []string
	for k := range keys {
		got = append(got, k)
	}
	for i := 4; i < 4+n; i++ {
		if !slices.Contains(got, fmt.Sprint("PRJ-", i)) {
			t.Fatalf("concurrent keys %v miss PRJ-%d", got, i)
		}
	}
	if next := w.e.count(`SELECT next_task_number FROM projects WHERE id = $1`, w.ProjectID); next != 4+n {
		t.Fatalf("next_task_number = %d, want %d", next, 4+n)
	}
}

// taskRawCall is testEnv.call for goroutines: it reports errors instead of failing the test.
func taskRawCall(e *testEnv, a actor, method, path, body string) (int, map[string]any, error) {
	req, err := http.NewRequest(method, e.ts.URL+path, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+a.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return resp.StatusCode, nil, err
	}
	return resp.StatusCode, out, nil
}

// TestTaskCreateAndPatch proves the task object's shape, defaults, PATCH replacing only the
// named fields, free status moves, clearing the environment with null, and the audit events.
func TestTaskCreateAndPatch(t *testing.T) {
	t.Parallel()
	w := newTaskWorld(t)
	out := w.createTask(w.r.Board, w.ProjectID, map[string]any{"title": "  Build the thing  ", "command": "make",
		"environment_id": w.EnvID})
	wantKeys := []string{"id", "project_id", "key", "number", "title", "description", "status", "command", "trust",
		"workspace_mode", "environment_id", "created_at", "updated_at"}
	if got := taskSortedKeys(out); !slices.Equal(got, taskSorted(wantKeys)) {
		t.Fatalf("task keys = %v", got)
	}
	if out["title"] != "Build the thing" || out["status"] != "todo" || out["trust"] != "standard" ||
		out["workspace_mode"] != "inherit" || out["environment_id"] != w.EnvID || out["project_id"] != w.ProjectID {
		t.Fatalf("created task = %v", out)
	}
	id := out["id"].(string)

	for _, st := range []string{"done", "in_progress", "cancelled", "todo"} {
		status, got := w.e.call(w.r.Board, http.MethodPatch, "/api/tasks/"+id, map[string]any{"status": st})
		if status != http.StatusOK || got["status"] != st {
			t.Fatalf("PATCH status %s = %d %v", st, status, got)
		}
	}
	status, got := w.e.call(w.r.Board, http.MethodPatch, "/api/tasks/"+id, map[string]any{"title": "Renamed", "environment_id": nil})
	if status != http.StatusOK || got["title"] != "Renamed" || got["environment_id"] != nil || got["command"] != "make" {
		t.Fatalf("PATCH title+env = %d %v", status, got)
	}
	status, got = w.e.call(w.r.Viewer, http.MethodGet, "/api/tasks/"+id, nil)
	if status != http.StatusOK || got["title"] != "Renamed" || got["key"] != "PRJ-1" {
		t.Fatalf("GET = %d %v", status, got)
	}
	if n := w.e.count(`SELECT count(*) FROM audit_events WHERE action = 'task.created' AND target_id = $1`, id); n != 1 {
		t.Fatalf("task.created events = %d", n)
	}
	if n := w.e.count(`SELECT count(*) FROM audit_events WHERE action = 'task.updated' AND target_id = $1
		AND details->'changes'->'title'->>'to' = 'Renamed'`, id); n != 1 {
		t.Fatalf("task.updated events naming the title = %d", n)
	}
	before := w.e.count(`SELECT count(*) FROM audit_events WHERE action = 'task.updated'`)
	if status, _ := w.e.call(w.r.Board, http.MethodPatch, "/api/tasks/"+id, map[string]any{"title": "Renamed"}); status != http.StatusOK {
		t.Fatalf("no-op PATCH = %d", status)
	}
	if after := w.e.count(`SELECT count(*) FROM audit_events WHERE action = 'task.updated'`); after != before {
		t.Fatalf("a PATCH that changes nothing was audited")
	}
}

func taskSortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return taskSorted(keys)
}

func taskSorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestTaskValidationChangesNothing proves every refused create or update (API and forms) answers
// with the documented status and leaves tasks, numbering and bindings untouched.
func TestTaskValidationChangesNothing(t *testing.T) {
	t.Parallel()
	w := newTaskWorld(t)
	id := w.createTask(w.r.Board, w.ProjectID, map[string]any{"title": "Keep me"})["id"].(string)
	otherEnv := w.addEnvironment(w.r.B.ID, "theirs", "local", "active", "")
	archivedEnv := w.addEnvironment(w.r.A.ID, "old", "local", "archived", "")
	archivedProject := w.addProject(w.r.A.ID, "OLD", `{}`)
	w.exec(`UPDATE projects SET status = 'archived' WHERE id = $1`, archivedProject)
	create := "/api/projects/" + w.ProjectID + "/tasks"
	patch := "/api/tasks/" + id

	cases := []struct {
		name, method, path string
		body               any
		status             int
		code, field        string
	}{
		{"empty title", "POST", create, map[string]any{"title": "  "}, 422, "validation_failed", "title"},
		{"long title", "POST", create, map[string]any{"title": strings.Repeat("x", 301)}, 422, "validation_failed", "title"},
		{"bad trust", "POST", create, map[string]any{"title": "t", "trust": "high"}, 422, "validation_failed", "trust"},
		{"bad mode", "POST", create, map[string]any{"title": "t", "workspace_mode": "elsewhere"}, 422, "validation_failed", "workspace_mode"},
		{"NUL in command", "POST", create, map[string]any{"title": "t", "command": "a\x00b"}, 422, "validation_failed", "command"},
		{"malformed environment", "POST", create, map[string]any{"title": "t", "environment_id": "nope"}, 422, "validation_failed", "environment_id"},
		{"other company's environment", "POST", create, map[string]any{"title": "t", "environment_id": otherEnv}, 422, "validation_failed", "environment_id"},
		{"archived environment", "POST", create, map[string]any{"title": "t", "environment_id": archivedEnv}, 422, "validation_failed", "environment_id"},
		{"status on create", "POST", create, map[string]any{"title": "t", "status": "done"}, 400, "bad_json", ""},
		{"unknown field", "POST", create, map[string]any{"title": "t", "color": "red"}, 400, "bad_json", ""},
		{"bad json", "POST", create, `{"title":`, 400, "bad_json", ""},
		{"too large", "POST", create, `{"title":"` + strings.Repeat("x", 1<<20) + `"}`, 413, "body_too_large", ""},
		{"archived project", "POST", "/api/projects/" + archivedProject + "/tasks", map[string]any{"title": "t"}, 409, "project_archived", ""},
		{"patch key", "PATCH", patch, map[string]any{"key": "PRJ-9"}, 400, "immutable_field", ""},
		{"patch number", "PATCH", patch, map[string]any{"number": 9}, 400, "immutable_field", ""},
		{"patch project", "PATCH", patch, map[string]any{"project_id": archivedProject}, 400, "immutable_field", ""},
		{"patch null title", "PATCH", patch, map[string]any{"title": nil}, 422, "validation_failed", "title"},
		{"patch bad status", "PATCH", patch, map[string]any{"status": "shipped"}, 422, "validation_failed", "status"},
		{"patch other company's environment", "PATCH", patch, map[string]any{"environment_id": otherEnv}, 422, "validation_failed", "environment_id"},
		{"patch unknown field", "PATCH", patch, map[string]any{"priority": 1}, 400, "bad_json", ""},
	}
	for _, c := range cases {
		before := w.fingerprint()
		status, out := w.e.call(w.r.Board, c.method, c.path, c.body)
		if status != c.status || taskErrorCode(out) != c.code {
			t.Errorf("%s: %d %v, want %d %s", c.name, status, out, c.status, c.code)
		}
		if c.field != "" && taskErrorFields(out)[c.field] == nil {
			t.Errorf("%s: no message for field %s: %v", c.name, c.field, out)
		}
		if w.fingerprint() != before {
			t.Errorf("%s: a refused request changed data", c.name)
		}
	}

	before := w.fingerprint()
	resp := w.e.do(w.e.client(), http.MethodPost, create, strings.NewReader("title=x"), map[string]string{
		"Authorization": "Bearer " + w.r.Board.Token, "Content-Type": "application/x-www-form-urlencoded"})
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("form body on the API = %d, want 415", resp.StatusCode)
	}

	c := w.e.browser(w.r.Board)
	resp, body := w.postForm(c, "/projects/"+w.ProjectID+"/tasks", url.Values{"title": {""}, "command": {"kept <b>command</b>"}}, false)
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, "field-error") ||
		!strings.Contains(body, "kept &lt;b&gt;command&lt;/b&gt;") {
		t.Errorf("invalid create form = %d (want 422 with the message and the values kept)", resp.StatusCode)
	}
	resp, _ = w.postForm(c, "/tasks/"+id, url.Values{"title": {"ok"}, "status": {"nope"}, "trust": {"standard"}, "workspace_mode": {"inherit"}}, false)
	if resp.StatusCode != http.StatusUnprocessableEntity {
		t.Errorf("invalid edit form = %d, want 422", resp.StatusCode)
	}
	if w.fingerprint() != before {
		t.Errorf("a refused form changed data")
	}
	w.exec(`UPDATE projects SET status = 'archived' WHERE id = $1`, w.ProjectID)
	if status, out := w.e.call(w.r.Board, http.MethodPatch, patch, map[string]any{"title": "x"}); status != http.StatusConflict || taskErrorCode(out) != "project_archived" {
		t.Errorf("PATCH in an archived project = %d %v", status, out)
	}
}

// TestTaskListFiltersAndPagination walks 120 tasks page by page (no duplicates, none missed,
// newest first) and checks the status, trust and literal substring filters.
func TestTaskListFiltersAndPagination(t *testing.T) {
	t.Parallel()
	w := newTaskWorld(t)
	statuses := []string{"todo", "in_progress", "in_review", "done", "cancelled"}
	w.exec(`INSERT INTO tasks (company_id, project_id, number, key, title, status, trust)
		SELECT $1, $2, i, 'PRJ-' || i,
			CASE WHEN i % 10 = 0 THEN 'Ship 100% of it_' || i ELSE 'Task ' || i END,
			($3::text[])[1 + i % 5], CASE WHEN i % 3 = 0 THEN 'low' ELSE 'standard' END
		FROM generate_series(1, 120) i`, w.r.A.ID, w.ProjectID, statuses)
	w.exec(`UPDATE projects SET next_task_number = 121 WHERE id = $1`, w.ProjectID)

	list := func(query string) []map[string]any {
		t.Helper()
		var all []map[string]any
		cursor := ""
		for page := 0; ; page++ {
			path := "/api/projects/" + w.ProjectID + "/tasks?limit=7&" + query
			if cursor != "" {
				path += "&cursor=" + url.QueryEscape(cursor)
			}
			status, out := w.e.call(w.r.Viewer, http.MethodGet, path, nil)
			if status != http.StatusOK || page > 100 {
				t.Fatalf("GET %s = %d %v", path, status, out)
			}
			items, _ := out["items"].([]any)
			if len(items) > 7 {
				t.Fatalf("page of %d items with limit 7", len(items))
			}
			for _, it := range items {
				all = append(all, it.(map[string]any))
			}
			cursor, _ = out["next_cursor"].(string)
			if cursor == "" {
				return all
			}
		}
	}
	all := list("")
	if len(all) != 120 {
		t.Fatalf("walked %d tasks, want 120", len(all))
	}
	for i, it := range all {
		if it["number"] != float64(120-i) {
			t.Fatalf("item %d has number %v: pages are not newest-first without gaps or duplicates", i, it["number"])
		}
	}
	count := func(query string, want int, check func(map[string]any) bool) {
		t.Helper()
		got := list(query)
		if len(got) != want {
			t.Errorf("%s: %d tasks, want %d", query, len(got), want)
		}
		for _, it := range got {
			if !check(it) {
				t.Errorf("%s: unexpected %v", query, it)
			}
		}
	}
	count("status=done", 24, func(it map[string]any) bool { return it["status"] == "done" })
	count("status=todo,cancelled", 48, func(it map[string]any) bool { return it["status"] == "todo" || it["status"] == "cancelled" })
	count("status=todo&status=done", 48, func(it map[string]any) bool { return it["status"] == "todo" || it["status"] == "done" })
	count("trust=low", 40, func(it map[string]any) bool { return it["trust"] == "low" })
	count("trust=low&status=done", 8, func(it map[string]any) bool { return it["trust"] == "low" && it["status"] == "done" })
	count("q="+url.QueryEscape("100%"), 12, func(it map[string]any) bool { return strings.Contains(it["title"].(string), "100%") })
	count("q="+url.QueryEscape("t_1"), 4, func(it map[string]any) bool { return strings.Contains(it["title"].(string), "t_1") })
	count("q=prj-11", 11, func(it map[string]any) bool { return strings.HasPrefix(it["key"].(string), "PRJ-11") })
	count("q="+url.QueryEscape("%"), 12, func(it map[string]any) bool { return strings.Contains(it["title"].(string), "%") })
	count("q="+url.QueryEscape("_"), 12, func(it map[string]any) bool { return strings.Contains(it["title"].(string), "_") })

	for _, bad := range []string{"status=bogus", "trust=high", "limit=0", "limit=201", "cursor=%21%21", "q=" + strings.Repeat("x", 201)} {
		if status, out := w.e.call(w.r.Board, http.MethodGet, "/api/projects/"+w.ProjectID+"/tasks?"+bad, nil); status != http.StatusBadRequest {
			t.Errorf("%s = %d %v, want 400", bad, status, out)
		}
	}

	c := w.e.browser(w.r.Viewer)
	resp, body := w.get(c, "/projects/"+w.ProjectID+"/tasks", false)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "<html") || !strings.Contains(body, "PRJ-120<") ||
		!strings.Contains(body, "PRJ-71<") || strings.Contains(body, "PRJ-70<") || !strings.Contains(body, "Next page") ||
		strings.Contains(body, "New task") {
		t.Fatalf("list page = %d", resp.StatusCode)
	}
	resp, body = w.get(c, "/projects/"+w.ProjectID+"/tasks?trust=low", false)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "PRJ-120<") || strings.Contains(body, "PRJ-119<") ||
		strings.Contains(body, "Next page") {
		t.Fatalf("filtered list page = %d", resp.StatusCode)
	}
	resp, body = w.get(c, "/projects/"+w.ProjectID+"/tasks?status=todo&q=Ship", true)
	if resp.StatusCode != http.StatusOK || strings.Contains(body, "<html") || !strings.Contains(body, `id="task-list"`) ||
		!strings.Contains(body, "PRJ-110<") || strings.Contains(body, "PRJ-105<") {
		t.Fatalf("htmx list fragment = %d %s", resp.StatusCode, body)
	}
	if resp.Header.Get("Vary") != "HX-Request" {
		t.Errorf("list page without Vary: HX-Request")
	}
}

// TestTaskBrowserFlow proves a newcomer can create a task entirely in the browser: the empty
// state says what to do, the form redirects to the task page, which shows the plan and trace,
// and the edit form saves.
func TestTaskBrowserFlow(t *testing.T) {
	t.Parallel()
	w := newTaskWorld(t)
	c := w.e.browser(w.r.Board)
	resp, body := w.get(c, "/projects/"+w.ProjectID+"/tasks", false)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Create the first task") || !strings.Contains(body, "New task") {
		t.Fatalf("empty list page = %d", resp.StatusCode)
	}
	resp, _ = w.postForm(c, "/projects/"+w.ProjectID+"/tasks", url.Values{"title": {"Fix the build"}, "command": {"make test"},
		"trust": {"standard"}, "workspace_mode": {"inherit"}, "environment_id": {""}}, false)
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/tasks/") {
		t.Fatalf("create form = %d to %q", resp.StatusCode, loc)
	}
	resp, body = w.get(c, loc, false)
	for _, want := range []string{"PRJ-1", "Fix the build", "Effective plan", "project_default_mode", "host_scripts",
		"Workspace binding", "Not bound yet", "Edit task", "make test"} {
		if !strings.Contains(body, want) {
			t.Errorf("task page lacks %q", want)
		}
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("task page = %d", resp.StatusCode)
	}
	resp, _ = w.postForm(c, loc, url.Values{"title": {"Fix the build"}, "description": {"now"}, "command": {"make test"},
		"status": {"in_progress"}, "trust": {"standard"}, "workspace_mode": {"isolated"}, "environment_id": {w.EnvID}}, false)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != loc+"?flash=task_saved" {
		t.Fatalf("edit form = %d to %q, want the task page with its confirmation", resp.StatusCode, resp.Header.Get("Location"))
	}
	id := strings.TrimPrefix(loc, "/tasks/")
	if n := w.e.count(`SELECT count(*) FROM tasks WHERE id = $1 AND status = 'in_progress' AND workspace_mode = 'isolated'
		AND environment_id = $2 AND description = 'now'`, id, w.EnvID); n != 1 {
		t.Fatalf("edit form did not save")
	}
	resp, body = w.get(c, "/projects/"+w.ProjectID+"/tasks", false)
	if !strings.Contains(body, "Fix the build") || !strings.Contains(body, "In progress") {
		t.Fatalf("list after create = %d", resp.StatusCode)
	}
}

// TestTaskHTMLEscaping proves user text renders escaped on the list and on the task page.
func TestTaskHTMLEscaping(t *testing.T) {
	t.Parallel()
	w := newTaskWorld(t)
	title := `<script>alert("t")</script>`
	desc := `<script>alert("d")</script><img src=x onerror=alert(1)>`
	id := w.createTask(w.r.Board, w.ProjectID, map[string]any{"title": title, "description": desc, "command": `echo "<b>"`})["id"].(string)
	c := w.e.browser(w.r.Viewer)
	for _, path := range []string{"/projects/" + w.ProjectID + "/tasks", "/tasks/" + id} {
		resp, body := w.get(c, path, false)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s = %d", path, resp.StatusCode)
		}
		if strings.Contains(body, "<script>alert") || strings.Contains(body, "<img src=x") || strings.Contains(body, `"<b>"`) {
			t.Errorf("%s renders user text unescaped", path)
		}
		if !strings.Contains(body, "&lt;script&gt;alert(&#34;t&#34;)&lt;/script&gt;") {
			t.Errorf("%s lacks the escaped title", path)
		}
	}
	_, body := w.get(c, "/tasks/"+id, false)
	if !strings.Contains(body, "&lt;img src=x onerror=alert(1)&gt;") {
		t.Errorf("task page lacks the escaped description")
	}
}

// taskRoleCase is one request of a role-matrix test and the status each actor gets.
type taskRoleCase struct {
	name                        string
	do                          func(a actor) int
	board, viewer, admin, other int
	write                       bool // non-board callers must change nothing
}

// runTaskRoleMatrix sends every case as the other company's board member, the instance admin
// (non-member) and the viewer, then as the board member, checking statuses and that refused
// writes changed nothing.
func runTaskRoleMatrix(t *testing.T, w *taskWorld, cases []taskRoleCase) {
	t.Helper()
	for _, c := range cases {
		for _, who := range []struct {
			name string
			a    actor
			want int
		}{{"other company", w.r.Other, c.other}, {"instance admin", w.r.Admin, c.admin}, {"viewer", w.r.Viewer, c.viewer}, {"board", w.r.Board, c.board}} {
			before := w.fingerprint()
			if got := c.do(who.a); got != who.want {
				t.Errorf("%s as %s = %d, want %d", c.name, who.name, got, who.want)
			}
			if c.write && who.name != "board" && w.fingerprint() != before {
				t.Errorf("%s as %s changed data", c.name, who.name)
			}
		}
	}
}

// TestTaskRoleMatrix proves who may call every task and binding route, API and browser: board
// members change, viewers and instance admins read (writes 403, audited), another company's
// member gets 404 and changes nothing.
func TestTaskRoleMatrix(t *testing.T) {
	t.Parallel()
	w := newTaskWorld(t)
	id := w.createTask(w.r.Board, w.ProjectID, map[string]any{"title": "Matrix"})["id"].(string)
	browsers := map[string]*http.Client{}
	for _, a := range []actor{w.r.Board, w.r.Viewer, w.r.Admin, w.r.Other} {
		browsers[a.User.ID] = w.e.browser(a)
	}
	api := func(method, path string, body func() any) func(actor) int {
		return func(a actor) int {
			var b any
			if body != nil {
				b = body()
			}
			status, _ := w.e.call(a, method, path, b)
			return status
		}
	}
	page := func(path string, htmx bool) func(actor) int {
		return func(a actor) int {
			resp, _ := w.get(browsers[a.User.ID], path, htmx)
			return resp.StatusCode
		}
	}
	form := func(path string, values func() url.Values) func(actor) int {
		return func(a actor) int {
			resp, _ := w.postForm(browsers[a.User.ID], path, values(), false)
			return resp.StatusCode
		}
	}
	revision := func() int {
		return w.e.count(`SELECT coalesce((SELECT revision FROM task_workspace_bindings WHERE task_id = $1), 0)::int`, id)
	}
	n := 0
	next := func() string { n++; return fmt.Sprint("matrix-", n) }
	taskForm := func() url.Values {
		return url.Values{"title": {next()}, "status": {"todo"}, "trust": {"standard"}, "workspace_mode": {"inherit"}}
	}
	runTaskRoleMatrix(t, w, []taskRoleCase{
		{"GET /api/projects/{id}/tasks", api("GET", "/api/projects/"+w.ProjectID+"/tasks", nil), 200, 200, 200, 404, false},
		{"POST /api/projects/{id}/tasks", api("POST", "/api/projects/"+w.ProjectID+"/tasks", func() any { return map[string]any{"title": next()} }), 201, 403, 403, 404, true},
		{"GET /api/tasks/{id}", api("GET", "/api/tasks/"+id, nil), 200, 200, 200, 404, false},
		{"PATCH /api/tasks/{id}", api("PATCH", "/api/tasks/"+id, func() any { return map[string]any{"title": next()} }), 200, 403, 403, 404, true},
		{"GET /api/tasks/{id}/plan", api("GET", "/api/tasks/"+id+"/plan", nil), 200, 200, 200, 404, false},
		{"GET /api/tasks/{id}/workspace", api("GET", "/api/tasks/"+id+"/workspace", nil), 200, 200, 200, 404, false},
		{"PUT /api/tasks/{id}/workspace", api("PUT", "/api/tasks/"+id+"/workspace", func() any {
			return map[string]any{"mode": "shared", "revision": revision(), "request_key": next()}
		}), 200, 403, 403, 404, true},
		{"GET /projects/{id}/tasks", page("/projects/"+w.ProjectID+"/tasks", false), 200, 200, 200, 404, false},
		{"GET /projects/{id}/tasks (htmx)", page("/projects/"+w.ProjectID+"/tasks", true), 200, 200, 200, 404, false},
		{"POST /projects/{id}/tasks", form("/projects/"+w.ProjectID+"/tasks", taskForm), 303, 403, 403, 404, true},
		{"GET /tasks/{id}", page("/tasks/"+id, false), 200, 200, 200, 404, false},
		{"GET /tasks/{id}/plan (htmx)", page("/tasks/"+id+"/plan", true), 200, 200, 200, 404, false},
		{"POST /tasks/{id}", form("/tasks/"+id, taskForm), 303, 403, 403, 404, true},
		{"POST /tasks/{id}/workspace", form("/tasks/"+id+"/workspace", func() url.Values {
			return url.Values{"mode": {"isolated"}, "revision": {fmt.Sprint(revision())}, "request_key": {next()}}
		}), 303, 403, 403, 404, true},
	})

	for _, action := range []string{"task.create.denied", "task.update.denied", "task_binding.update.denied"} {
		if n := w.e.count(`SELECT count(*) FROM audit_events WHERE action = $1 AND company_id = $2`, action, w.r.A.ID); n < 2 {
			t.Errorf("%s events = %d, want the viewer's and the admin's", action, n)
		}
	}
	if n := w.e.count(`SELECT count(*) FROM audit_events WHERE action LIKE 'task%denied' AND company_id = $1`, w.r.B.ID); n != 0 {
		t.Errorf("another company's refusals leaked into its own audit trail: %d", n)
	}

	resp := w.e.do(w.e.client(), http.MethodGet, "/tasks/"+id, nil, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" {
		t.Errorf("task page without a session = %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if status, _ := w.e.call(actor{}, http.MethodGet, "/api/tasks/"+id, nil); status != http.StatusUnauthorized {
		t.Errorf("API without credentials = %d", status)
	}
	for _, path := range []string{"/api/tasks/not-a-uuid", "/api/tasks/00000000-0000-0000-0000-000000000000/plan"} {
		if status, _ := w.e.call(w.r.Admin, http.MethodGet, path, nil); status != http.StatusNotFound {
			t.Errorf("%s = %d, want 404", path, status)
		}
	}
}
