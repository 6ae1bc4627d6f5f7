package handlers

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// searchTitles is what GET /api/search?q= finds for a, as "kind:title" lines.
func searchTitles(t *testing.T, e *testEnv, a actor, q string) []string {
	t.Helper()
	code, out := e.call(a, http.MethodGet, "/api/search?q="+url.QueryEscape(q), nil)
	if code != http.StatusOK {
		t.Fatalf("search %q as %s = %d %v", q, a.User.Email, code, out)
	}
	var got []string
	for _, it := range out["items"].([]any) {
		h := it.(map[string]any)
		got = append(got, h["kind"].(string)+":"+h["title"].(string))
	}
	return got
}

func containsPrefix(list []string, prefix string) bool {
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

// TestSearchIsCompanyScoped: the palette's search finds projects, tasks (by key and by title),
// workspaces, runs and environments of the caller's companies, and nothing of another company,
// whatever the query; an instance admin finds every company's; exact keys come first; LIKE
// wildcards in the query are literal.
func TestSearchIsCompanyScoped(t *testing.T) {
	t.Parallel()
	w := newTaskWorld(t)
	e, r := w.e, w.r
	own := w.createTask(r.Board, w.ProjectID, map[string]any{"title": "Calibrate the gripper", "command": "true"})["id"].(string)
	w.createTask(r.Board, w.ProjectID, map[string]any{"title": "Gripper 100% done_now", "command": "true"})
	other := w.addProject(r.B.ID, "OTH", `{"default_mode":"shared"}`)
	w.createTask(r.Other, other, map[string]any{"title": "Calibrate the gripper elsewhere", "command": "true"})
	w.addEnvironment(r.B.ID, "gripper-box", "local", "active", "")
	ws := w.addExecWorkspace(r.A.ID, w.ProjectID, "standard", "ready")
	w.exec(`UPDATE execution_workspaces SET source_task_id = $1, branch = 'berth/PRJ-1' WHERE id = $2`, own, ws)
	w.exec(`INSERT INTO runs (company_id, task_id, status, command) VALUES ($1, $2, 'succeeded', 'true')`, r.A.ID, own)

	board := searchTitles(t, e, r.Board, "gripper")
	for _, want := range []string{"task:PRJ-1 · Calibrate the gripper", "task:PRJ-2 · Gripper", "run:PRJ-1 · Calibrate"} {
		if !containsPrefix(board, want) {
			t.Errorf("board member's search lacks %q: %v", want, board)
		}
	}
	if containsPrefix(board, "task:OTH-") || containsPrefix(board, "environment:gripper-box") {
		t.Errorf("board member of A finds company B's objects: %v", board)
	}
	viewer := searchTitles(t, e, r.Viewer, "prj-1")
	if len(viewer) == 0 || viewer[0] != "task:PRJ-1 · Calibrate the gripper" {
		t.Errorf("an exact key is not the first hit for a viewer: %v", viewer)
	}
	for _, want := range []string{"workspace:PRJ-1 · berth/PRJ-1", "run:PRJ-1"} {
		if !containsPrefix(viewer, want) {
			t.Errorf("viewer's search for the key lacks %q: %v", want, viewer)
		}
	}
	if got := searchTitles(t, e, r.Board, "project prj"); !containsPrefix(got, "project:Project PRJ (PRJ)") {
		t.Errorf("project by name: %v", got)
	}
	if got := searchTitles(t, e, r.Board, "local"); !containsPrefix(got, "environment:local") {
		t.Errorf("environment by name: %v", got)
	}
	// Company B's member sees B's, never A's.
	other2 := searchTitles(t, e, r.Other, "gripper")
	if !containsPrefix(other2, "task:OTH-1") || !containsPrefix(other2, "environment:gripper-box") || containsPrefix(other2, "task:PRJ-") {
		t.Errorf("company B's search = %v", other2)
	}
	// An instance admin reads every company.
	admin := searchTitles(t, e, r.Admin, "gripper")
	if !containsPrefix(admin, "task:OTH-1") || !containsPrefix(admin, "task:PRJ-1") {
		t.Errorf("instance admin's search = %v", admin)
	}
	// Wildcards are literal: "%" matches only a title with a percent sign.
	if got := searchTitles(t, e, r.Board, "%"); len(got) != 1 || !containsPrefix(got, "task:PRJ-2") {
		t.Errorf("search for %% = %v, want only the task whose title has one", got)
	}
	if got := searchTitles(t, e, r.Board, "_"); len(got) != 1 || !containsPrefix(got, "task:PRJ-2") {
		t.Errorf("search for _ = %v, want only the task whose title has one", got)
	}
	if got := searchTitles(t, e, r.Board, "   "); len(got) != 0 {
		t.Errorf("a blank search found %v", got)
	}
	// The run's id prefix finds it.
	var runID string
	if err := e.pool.QueryRow(t.Context(), `SELECT id::text FROM runs LIMIT 1`).Scan(&runID); err != nil {
		t.Fatal(err)
	}
	if got := searchTitles(t, e, r.Board, runID[:8]); !containsPrefix(got, "run:") {
		t.Errorf("run id prefix = %v", got)
	}
	if got := searchTitles(t, e, r.Other, runID[:8]); containsPrefix(got, "run:") {
		t.Errorf("another company finds the run by its id: %v", got)
	}

	// The palette's fragment: links, escaped titles, no frame; the page without JavaScript.
	w.createTask(r.Board, w.ProjectID, map[string]any{"title": "<script>alert(1)</script> gripper", "command": "true"})
	c := e.browser(r.Board)
	code, body := e.getPage(c, "/search?q=gripper", map[string]string{"HX-Request": "true", "HX-Target": "palette-results"})
	if code != 200 || strings.Contains(body, "<html") || !strings.Contains(body, `href="/tasks/`+own+`"`) {
		t.Fatalf("palette fragment = %d:\n%s", code, body)
	}
	if strings.Contains(body, "<script>alert") || !strings.Contains(body, "&lt;script&gt;") {
		t.Errorf("a title is not escaped in the palette:\n%s", body)
	}
	if strings.Contains(body, "OTH-1") {
		t.Errorf("palette shows another company's task")
	}
	if code, body := e.getPage(c, "/search?q=gripper", nil); code != 200 || !strings.Contains(body, `id="search-q"`) || !strings.Contains(body, "PRJ-1") {
		t.Errorf("search page = %d", code)
	}
	// Without a session: the page redirects to sign-in, the API is 401; a run token is refused.
	if code, _ := e.call(actor{}, http.MethodGet, "/api/search?q=x", nil); code != http.StatusUnauthorized {
		t.Errorf("anonymous API search = %d, want 401", code)
	}
}
