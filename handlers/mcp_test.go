package handlers

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"berth/db"
)

// mcpTools is every tool docs/mcp.md documents.
var mcpTools = []string{"attempts_compare", "attempts_select", "attempts_start", "file_delete", "file_edit", "file_read",
	"file_write", "files_list", "plan_get", "receipt_get", "receipt_verify", "run_cancel", "run_log", "run_start",
	"service_start", "service_status", "service_stop", "task_get", "work_product_add", "workspace_readiness"}

// TestMCPEndpointAuth: /mcp needs a bearer token (none, a bad one or a session cookie → 401
// with WWW-Authenticate); the SDK's client lists exactly the documented tools; a session opened
// with one token is refused (403) with another.
func TestMCPEndpointAuth(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	post := func(c *http.Client, headers map[string]string, body string) *http.Response {
		h := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream", "Origin": "", "Sec-Fetch-Site": ""}
		for k, v := range headers {
			h[k] = v
		}
		return e.do(c, http.MethodPost, "/mcp", strings.NewReader(body), h)
	}
	for name, h := range map[string]map[string]string{
		"no token":   {},
		"bad token":  {"Authorization": "Bearer berth_nonsense"},
		"not bearer": {"Authorization": "Basic eDp5"},
	} {
		resp := post(e.client(), h, init)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s: POST /mcp = %d %s", name, resp.StatusCode, readBody(t, resp))
		}
		if code, _ := decodeError(t, resp); code != "unauthorized" {
			t.Fatalf("%s: error code %q", name, code)
		}
	}
	if resp := post(e.client(), nil, init); !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
		t.Fatalf("401 without WWW-Authenticate: %v", resp.Header)
	}
	// A signed-in browser's cookie is no credential here (a page of another site could send it).
	resp := post(e.browser(r.Board), map[string]string{"Origin": e.ts.URL, "Sec-Fetch-Site": "same-origin"}, init)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("session cookie on /mcp = %d", resp.StatusCode)
	}

	a := e.mcpAgent(r.Board.Token)
	res, err := a.cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
		if tl.Description == "" || tl.InputSchema == nil {
			t.Fatalf("tool %s has no description or schema", tl.Name)
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, mcpTools) {
		t.Fatalf("tools = %v, want %v", names, mcpTools)
	}

	// The session is the board member's: the viewer's token cannot use its id.
	resp = post(e.client(), map[string]string{"Authorization": "Bearer " + r.Board.Token}, init)
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || sid == "" {
		t.Fatalf("initialize = %d, session %q", resp.StatusCode, sid)
	}
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
	resp = post(e.client(), map[string]string{"Authorization": "Bearer " + r.Viewer.Token, "Mcp-Session-Id": sid,
		"Mcp-Protocol-Version": "2025-06-18"}, list)
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("another token on the session = %d %s", resp.StatusCode, readBody(t, resp))
	}
	resp = post(e.client(), map[string]string{"Authorization": "Bearer " + r.Board.Token, "Mcp-Session-Id": sid,
		"Mcp-Protocol-Version": "2025-06-18"}, list)
	if body := readBody(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, "file_edit") {
		t.Fatalf("the session's own token = %d %s", resp.StatusCode, body)
	}
}

// TestMCPToolsScopes: each tool succeeds for who may, and is refused with the API's status and
// code for another company's task (404), a run token on another task (403), a viewer's change
// (403), a path escape and a write to .git (403); refusals change nothing on disk.
func TestMCPToolsScopes(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	web := db.ServiceDefinition{Name: "web", Command: `exec python3 -m http.server "$PORT" --bind 127.0.0.1`, PortEnv: "PORT",
		HealthPath: "/", ReadyTimeoutS: 20, StopPolicy: "manual", Lifecycle: "ephemeral"}
	ws, dir := re.serviceWorkspace("standard", map[string]string{"notes.txt": "a\nb\nc\n", "index.html": "hi", ".git/HEAD": "ref: refs/heads/main\n"}, web)
	if err := os.Symlink("/etc/hostname", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	task, sibling, foreign := re.task("true"), re.task("true"), re.foreignTask()
	run, runID := re.runTokenIn(task.ID, ws.ID)
	board, viewer, other, agent := re.mcpAgent(re.r.Board.Token), re.mcpAgent(re.r.Viewer.Token), re.mcpAgent(re.r.Other.Token), re.mcpAgent(run.Token)
	T := func(id string, kv ...any) map[string]any {
		m := map[string]any{"task_id": id}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}

	// plan_get, task_get
	if out := board.ok("plan_get", T(task.ID)); out["trace"] == nil {
		t.Fatalf("plan_get = %v", out)
	}
	agent.ok("plan_get", T(task.ID))
	if out := viewer.ok("task_get", T(task.ID)); out["id"] != task.ID {
		t.Fatalf("task_get = %v", out)
	}
	for _, tool := range []string{"plan_get", "task_get", "files_list", "attempts_compare"} {
		other.refused(tool, T(task.ID), 404, "not_found")
		board.refused(tool, T(foreign.ID), 404, "not_found")
		agent.refused(tool, T(sibling.ID), 403, "forbidden")
	}

	// files_list, file_read (ranges)
	list := board.ok("files_list", T(task.ID))
	var names []string
	for _, it := range list["items"].([]any) {
		names = append(names, it.(map[string]any)["name"].(string))
	}
	if !slices.Contains(names, "notes.txt") || slices.Contains(names, ".git") {
		t.Fatalf("files_list = %v", names)
	}
	if out := board.ok("file_read", T(task.ID, "path", "notes.txt")); out["content"] != "a\nb\nc\n" {
		t.Fatalf("file_read = %v", out)
	}
	if out := viewer.ok("file_read", T(task.ID, "path", "notes.txt", "start_line", 2, "end_line", 2)); out["content"] != "b\n" || out["end_line"] != float64(2) || out["truncated"] != true {
		t.Fatalf("file_read lines = %v", out)
	}
	if out := agent.ok("file_read", T(task.ID, "path", "notes.txt", "offset", 2, "length", 1)); out["content"] != "b" || out["offset"] != float64(2) {
		t.Fatalf("file_read bytes = %v", out)
	}
	board.refused("file_read", T(task.ID, "path", ".git/HEAD"), 403, "path_denied")
	board.refused("file_read", T(task.ID, "path", "../notes.txt"), 403, "path_escape")
	board.refused("file_read", T(task.ID, "path", "link"), 403, "path_escape")
	board.refused("file_read", T(task.ID, "path", "/etc/passwd"), 400, "bad_path")
	board.refused("files_list", T(task.ID, "path", ".."), 403, "path_escape")
	agent.refused("file_read", T(sibling.ID, "path", "notes.txt"), 403, "forbidden")

	// file_write, file_edit, file_delete
	if out := board.ok("file_write", T(task.ID, "path", "new/deep/x.txt", "content", "hello\n", "create_dirs", true)); out["created"] != true || out["size"] != float64(6) {
		t.Fatalf("file_write = %v", out)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "new/deep/x.txt")); err != nil || string(b) != "hello\n" {
		t.Fatalf("written file = %q %v", b, err)
	}
	agent.ok("file_write", T(task.ID, "path", "by-run.txt", "content", "aGk=", "encoding", "base64"))
	if b, _ := os.ReadFile(filepath.Join(dir, "by-run.txt")); string(b) != "hi" {
		t.Fatalf("run's base64 write = %q", b)
	}
	before := snapshot(t, dir)
	viewer.refused("file_write", T(task.ID, "path", "v.txt", "content", "x"), 403, "forbidden")
	board.refused("file_write", T(task.ID, "path", ".git/config", "content", "[core]\n\tfsmonitor = evil\n"), 403, "path_denied")
	board.refused("file_write", T(task.ID, "path", "sub/.git/config", "content", "x", "create_dirs", true), 403, "path_denied")
	board.refused("file_write", T(task.ID, "path", "../escape.txt", "content", "x"), 403, "path_escape")
	board.refused("file_write", T(task.ID, "path", "link", "content", "x"), 403, "not_regular")
	board.refused("file_write", T(task.ID, "path", "missing/x.txt", "content", "x"), 404, "file_not_found")
	other.refused("file_write", T(task.ID, "path", "o.txt", "content", "x"), 404, "not_found")
	agent.refused("file_write", T(sibling.ID, "path", "s.txt", "content", "x"), 403, "forbidden")
	board.refused("file_edit", T(task.ID, "path", "notes.txt", "old_string", "\n", "new_string", ""), 409, "match_count")
	viewer.refused("file_edit", T(task.ID, "path", "notes.txt", "old_string", "b", "new_string", "B"), 403, "forbidden")
	board.refused("file_delete", T(task.ID, "path", ".git/HEAD"), 403, "path_denied")
	viewer.refused("file_delete", T(task.ID, "path", "notes.txt"), 403, "forbidden")
	other.refused("file_delete", T(task.ID, "path", "notes.txt"), 404, "not_found")
	if after := snapshot(t, dir); after != before {
		t.Fatalf("a refused change changed the workspace:\n%s\n---\n%s", before, after)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "escape.txt")); err == nil {
		t.Fatal("a write escaped the workspace")
	}
	_, out, _ := board.call("file_edit", T(task.ID, "path", "notes.txt", "old_string", "\n", "new_string", ""))
	if e := out["error"].(map[string]any); e["matches"] != float64(3) || e["expected"] != float64(1) {
		t.Fatalf("match_count details = %v", e)
	}
	if out := board.ok("file_edit", T(task.ID, "path", "notes.txt", "old_string", "b\n", "new_string", "B\n")); out["replacements"] != float64(1) {
		t.Fatalf("file_edit = %v", out)
	}
	agent.ok("file_edit", T(task.ID, "path", "notes.txt", "old_string", "\n", "new_string", ";", "expected_replacements", 3))
	if b, _ := os.ReadFile(filepath.Join(dir, "notes.txt")); string(b) != "a;B;c;" {
		t.Fatalf("edited file = %q", b)
	}
	board.ok("file_delete", T(task.ID, "path", "new/deep/x.txt"))
	board.refused("file_delete", T(task.ID, "path", "new/deep/x.txt"), 404, "file_not_found")
	if n := re.count(`SELECT count(*) FROM audit_events WHERE action IN ('file_resource.written','file_resource.edited','file_resource.deleted')
		AND company_id = $1 AND details ? 'sha256' = (action <> 'file_resource.deleted')`, re.r.A.ID); n != 5 {
		t.Fatalf("audited file changes = %d, want 5", n)
	}
	if n := re.count(`SELECT count(*) FROM audit_events WHERE action = 'file_resource.write.denied' AND company_id = $1`, re.r.A.ID); n < 3 {
		t.Fatalf("viewer write denials audited = %d", n)
	}

	// run_start, run_log, run_cancel
	board.refused("run_start", T(sibling.ID, "command", "echo other"), 403, "command_override_denied")
	board.refused("run_start", T(task.ID), 409, "run_in_progress")
	viewer.refused("run_start", T(task.ID), 403, "forbidden")
	other.refused("run_start", T(task.ID), 404, "not_found")
	agent.refused("run_start", T(task.ID), 403, "forbidden")
	R := map[string]any{"run_id": runID}
	if out := agent.ok("run_log", R); out["next_offset"] != float64(0) {
		t.Fatalf("run_log = %v", out)
	}
	other.refused("run_log", R, 404, "not_found")
	agent.refused("run_cancel", R, 403, "forbidden")
	viewer.refused("run_cancel", R, 403, "forbidden")
	other.refused("run_cancel", R, 404, "not_found")

	// receipts: none yet for a live run
	agent.refused("receipt_get", R, 404, "no_receipt")
	board.refused("receipt_verify", R, 404, "no_receipt")
	other.refused("receipt_get", R, 404, "not_found")
	other.refused("receipt_verify", R, 404, "not_found")

	// services
	W := map[string]any{"workspace_id": ws.ID, "name": "web"}
	if out := agent.ok("service_status", W); out["status"] != "stopped" || !strings.Contains(out["url"].(string), out["id"].(string)) {
		t.Fatalf("service_status = %v", out)
	}
	viewer.refused("service_start", W, 403, "forbidden")
	other.refused("service_start", W, 404, "not_found")
	other.refused("service_status", W, 404, "not_found")
	board.refused("service_status", map[string]any{"workspace_id": ws.ID, "name": "nope"}, 404, "unknown_service")
	started := board.ok("service_start", map[string]any{"workspace_id": ws.ID, "name": "web", "wait": true, "wait_timeout_s": 60})
	if started["status"] != "running" || started["health"] != "healthy" || started["url"] == "" {
		t.Fatalf("service_start wait = %v", started)
	}
	viewer.refused("service_stop", W, 403, "forbidden")
	agent.ok("service_stop", W)

	// attempts
	viewer.refused("attempts_start", T(task.ID, "count", 3), 403, "forbidden")
	other.refused("attempts_start", T(task.ID, "count", 3), 404, "not_found")
	agent.refused("attempts_start", T(task.ID, "count", 3), 403, "forbidden")
	viewer.refused("attempts_select", T(task.ID, "workspace_id", ws.ID, "generation", 1), 403, "forbidden")
	other.refused("attempts_select", T(task.ID, "workspace_id", ws.ID, "generation", 1), 404, "not_found")

	// work products, readiness
	if out := board.ok("work_product_add", T(task.ID, "kind", "preview_url", "url", "http://127.0.0.1:9/")); out["kind"] != "preview_url" {
		t.Fatalf("work_product_add = %v", out)
	}
	if out := agent.ok("work_product_add", T(task.ID, "kind", "file", "path", "notes.txt")); out["run_id"] != runID || out["execution_workspace_id"] != ws.ID {
		t.Fatalf("run's work_product_add = %v", out)
	}
	board.refused("work_product_add", T(task.ID, "kind", "nonsense"), 422, "validation_failed")
	viewer.refused("work_product_add", T(task.ID, "kind", "file", "path", "x"), 403, "forbidden")
	other.refused("work_product_add", T(task.ID, "kind", "file", "path", "x"), 404, "not_found")
	agent.refused("work_product_add", T(sibling.ID, "kind", "file", "path", "x"), 403, "forbidden")
	if out := board.ok("workspace_readiness", map[string]any{"workspace_id": ws.ID}); out["state"] == nil {
		t.Fatalf("workspace_readiness = %v", out)
	}
	other.refused("workspace_readiness", map[string]any{"workspace_id": ws.ID}, 404, "not_found")
	agent.refused("workspace_readiness", map[string]any{"workspace_id": ws.ID}, 403, "forbidden")

	// The run token's refusals are audited like the API's.
	if n := re.count(`SELECT count(*) FROM audit_events WHERE action = 'run_token.denied' AND target_id = $1`, runID); n < 5 {
		t.Fatalf("run token denials audited = %d", n)
	}
	board.ok("run_cancel", R)
}

// snapshot lists a directory tree with sizes and contents, for "nothing changed" checks.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var b bytes.Buffer
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		b.WriteString(rel + " " + fi.Mode().String())
		if fi.Mode().IsRegular() {
			c, _ := os.ReadFile(p)
			b.WriteString(" " + string(c))
		}
		b.WriteByte('\n')
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
