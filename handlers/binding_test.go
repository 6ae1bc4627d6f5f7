package handlers

import (
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
)

// putBinding sends PUT /api/tasks/{id}/workspace as the board member and checks the status.
func (w *taskWorld) putBinding(taskID string, body any, want int) map[string]any {
	w.e.t.Helper()
	status, out := w.e.call(w.r.Board, http.MethodPut, "/api/tasks/"+taskID+"/workspace", body)
	if status != want {
		w.e.t.Fatalf("PUT binding %v = %d %v, want %d", body, status, out, want)
	}
	return out
}

// TestBindingRevisionsAndReplays proves the binding contract of docs/api.md "Workspace binding": a
// never-bound task reads as revision 0; an accepted PUT bumps the revision; a stale revision is a
// 409 carrying the current binding; the same key with the same body replays the first answer even
// after the revision moved on; the same key with another body is a 409.
func TestBindingRevisionsAndReplays(t *testing.T) {
	t.Parallel()
	w := newTaskWorld(t)
	id := w.task(map[string]any{})
	path := "/api/tasks/" + id + "/workspace"

	status, got := w.e.call(w.r.Viewer, http.MethodGet, path, nil)
	want := map[string]any{"task_id": id, "mode": "inherit", "execution_workspace_id": nil, "revision": float64(0),
		"request_key": nil, "updated_at": nil}
	if status != http.StatusOK || !reflect.DeepEqual(got, want) {
		t.Fatalf("never-bound GET = %d %v", status, got)
	}

	first := w.putBinding(id, map[string]any{"mode": "isolated", "execution_workspace_id": nil, "revision": 0, "request_key": "k1"}, http.StatusOK)
	if first["revision"] != float64(1) || first["mode"] != "isolated" || first["request_key"] != "k1" || first["updated_at"] == nil {
		t.Fatalf("first PUT = %v", first)
	}
	if _, got := w.e.call(w.r.Viewer, http.MethodGet, path, nil); !reflect.DeepEqual(got, first) {
		t.Fatalf("GET after PUT = %v, want %v", got, first)
	}

	before := w.fingerprint()
	out := w.putBinding(id, map[string]any{"mode": "shared", "revision": 0, "request_key": "k2"}, http.StatusConflict)
	current, _ := out["error"].(map[string]any)["current"].(map[string]any)
	if taskErrorCode(out) != "stale_revision" || !reflect.DeepEqual(current, first) {
		t.Fatalf("stale PUT = %v, want stale_revision with current %v", out, first)
	}
	if w.fingerprint() != before {
		t.Fatal("a stale PUT changed data")
	}

	second := w.putBinding(id, map[string]any{"mode": "shared", "revision": 1, "request_key": "k3"}, http.StatusOK)
	if second["revision"] != float64(2) {
		t.Fatalf("second PUT = %v", second)
	}
	before = w.fingerprint()
	replay := w.putBinding(id, map[string]any{"mode": "isolated", "revision": 0, "request_key": "k1"}, http.StatusOK)
	if !reflect.DeepEqual(replay, first) {
		t.Fatalf("replay = %v, want the first answer %v", replay, first)
	}
	out = w.putBinding(id, map[string]any{"mode": "shared", "revision": 0, "request_key": "k1"}, http.StatusConflict)
	if taskErrorCode(out) != "request_key_reused" {
		t.Fatalf("reused key = %v", out)
	}
	out = w.putBinding(id, map[string]any{"mode": "isolated", "revision": 2, "request_key": "k1"}, http.StatusConflict)
	if taskErrorCode(out) != "request_key_reused" {
		t.Fatalf("reused key with the current revision = %v", out)
	}
	if w.fingerprint() != before {
		t.Fatal("a replay or a reused key changed data")
	}
	if _, got := w.e.call(w.r.Viewer, http.MethodGet, path, nil); !reflect.DeepEqual(got, second) {
		t.Fatalf("binding after replays = %v, want %v", got, second)
	}
	if n := w.e.count(`SELECT count(*) FROM audit_events WHERE action = 'task_binding.updated' AND target_id = $1`, id); n != 2 {
		t.Fatalf("task_binding.updated events = %d, want 2 (replays are not changes)", n)
	}
	if n := w.e.count(`SELECT count(*) FROM audit_events WHERE action = 'task_binding.updated' AND target_id = $1
		AND details->>'from_mode' = 'isolated' AND details->>'to_mode' = 'shared' AND (details->>'revision')::int = 2`, id); n != 1 {
		t.Fatal("the audit event lacks from/to mode and revision")
	}
}

// TestBindingSelectableWorkspaces proves a binding may select only a workspace of the task's
// project, with the task's trust, that is not failed, closing or closed: everything else is a 422
// that changes nothing, and another company's workspace looks like a missing one.
func TestBindingSelectableWorkspaces(t *testing.T) {
	t.Parallel()
	w := newTaskWorld(t)
	id := w.task(map[string]any{})
	other := w.addProject(w.r.A.ID, "OPS", `{}`)
	theirs := w.addProject(w.r.B.ID, "THEM", `{}`)
	ready := w.addExecWorkspace(w.r.A.ID, w.ProjectID, "standard", "ready")
	preparing := w.addExecWorkspace(w.r.A.ID, w.ProjectID, "standard", "preparing")
	body := func(mode string, ws any, key string) map[string]any {
		return map[string]any{"mode": mode, "execution_workspace_id": ws, "revision": 0, "request_key": key}
	}
	refused := []struct {
		name  string
		body  any
		field string
	}{
		{"reuse without a workspace", body("reuse", nil, "a"), "execution_workspace_id"},
		{"malformed workspace id", body("reuse", "ws-1", "b"), "execution_workspace_id"},
		{"missing workspace", body("reuse", "00000000-0000-0000-0000-000000000000", "c"), "execution_workspace_id"},
		{"another project's workspace", body("reuse", w.addExecWorkspace(w.r.A.ID, other, "standard", "ready"), "d"), "execution_workspace_id"},
		{"another company's workspace", body("reuse", w.addExecWorkspace(w.r.B.ID, theirs, "standard", "ready"), "e"), "execution_workspace_id"},
		{"another trust level", body("reuse", w.addExecWorkspace(w.r.A.ID, w.ProjectID, "low", "ready"), "f"), "execution_workspace_id"},
		{"closed", body("reuse", w.addExecWorkspace(w.r.A.ID, w.ProjectID, "standard", "closed"), "g"), "execution_workspace_id"},
		{"closing", body("reuse", w.addExecWorkspace(w.r.A.ID, w.ProjectID, "standard", "closing"), "h"), "execution_workspace_id"},
		{"failed", body("reuse", w.addExecWorkspace(w.r.A.ID, w.ProjectID, "standard", "failed"), "i"), "execution_workspace_id"},
		{"cleanup failed", body("reuse", w.addExecWorkspace(w.r.A.ID, w.ProjectID, "standard", "cleanup_failed"), "j"), "execution_workspace_id"},
		{"workspace without reuse", body("isolated", ready, "k"), "execution_workspace_id"},
		{"bad mode", body("elsewhere", nil, "l"), "mode"},
		{"missing revision", map[string]any{"mode": "shared", "request_key": "m"}, "revision"},
		{"negative revision", map[string]any{"mode": "shared", "revision": -1, "request_key": "n"}, "revision"},
		{"missing request key", map[string]any{"mode": "shared", "revision": 0}, "request_key"},
		{"overlong request key", body("shared", nil, strings.Repeat("k", 201)), "request_key"},
	}
	for _, c := range refused {
		before := w.fingerprint()
		out := w.putBinding(id, c.body, http.StatusUnprocessableEntity)
		if taskErrorFields(out)[c.field] == nil {
			t.Errorf("%s: no message for %s: %v", c.name, c.field, out)
		}
		if w.fingerprint() != before {
			t.Errorf("%s: a refused PUT changed data", c.name)
		}
	}
	if msg := taskErrorFields(w.putBinding(id, body("reuse", w.addExecWorkspace(w.r.B.ID, theirs, "standard", "ready"), "o"), 422))["execution_workspace_id"]; msg != errNoSelectableWorkspace {
		t.Errorf("another company's workspace = %q, want the missing-workspace message", msg)
	}
	for _, bad := range []struct {
		body string
		code string
	}{{`{"mode":"shared","revision":0,"request_key":"p","extra":1}`, "bad_json"}, {`{"mode":`, "bad_json"}, {`{"mode":"shared","revision":"0","request_key":"q"}`, "bad_json"}} {
		if status, out := w.e.call(w.r.Board, http.MethodPut, "/api/tasks/"+id+"/workspace", bad.body); status != http.StatusBadRequest || taskErrorCode(out) != bad.code {
			t.Errorf("%s = %d %v", bad.body, status, out)
		}
	}

	out := w.putBinding(id, body("reuse", strings.ToUpper(preparing), "r"), http.StatusOK)
	if out["execution_workspace_id"] != preparing || out["revision"] != float64(1) {
		t.Fatalf("selecting a preparing workspace = %v", out)
	}
	out = w.putBinding(id, map[string]any{"mode": "reuse", "execution_workspace_id": ready, "revision": 1, "request_key": "s"}, http.StatusOK)
	if out["execution_workspace_id"] != ready || out["revision"] != float64(2) {
		t.Fatalf("selecting a ready workspace = %v", out)
	}

	c := w.e.browser(w.r.Board)
	_, page := w.get(c, "/tasks/"+id, false)
	if !strings.Contains(page, `value="`+ready+`"`) || !strings.Contains(page, `value="`+preparing+`"`) {
		t.Error("the binding form does not offer the selectable workspaces")
	}
	for _, ws := range []string{"closed", "closing", "failed", "cleanup_failed"} {
		if strings.Contains(page, "· "+ws+"</option>") {
			t.Errorf("the binding form offers a %s workspace", ws)
		}
	}
	w.exec(`UPDATE projects SET status = 'archived' WHERE id = $1`, w.ProjectID)
	if out := w.putBinding(id, map[string]any{"mode": "shared", "revision": 2, "request_key": "t"}, http.StatusConflict); taskErrorCode(out) != "project_archived" {
		t.Errorf("PUT in an archived project = %v", out)
	}
}

// TestBindingConcurrentPuts proves the task row lock serializes changes: of concurrent PUTs with
// the same revision and different keys exactly one wins and the others get 409 stale_revision;
// concurrent retries of one request (same key, same body) all get the one answer.
func TestBindingConcurrentPuts(t *testing.T) {
	t.Parallel()
	w := newTaskWorld(t)
	id := w.task(map[string]any{})
	const n = 8
	put := func(body func(i int) string) (statuses []int, outs []map[string]any) {
		var (
			wg sync.WaitGroup
			mu sync.Mutex
		)
		errs := make(chan error, n)
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				status, out, err := taskRawCall(w.e, w.r.Board, http.MethodPut, "/api/tasks/"+id+"/workspace", body(i))
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				statuses, outs = append(statuses, status), append(outs, out)
				mu.Unlock()
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		return statuses, outs
	}
	for round := 0; round < 3; round++ {
		statuses, outs := put(func(i int) string {
			return fmt.Sprintf(`{"mode":"isolated","revision":%d,"request_key":"r%d-%d"}`, round, round, i)
		})
		slices.Sort(statuses)
		if statuses[0] != http.StatusOK || statuses[1] != http.StatusConflict || statuses[n-1] != http.StatusConflict {
			t.Fatalf("round %d statuses = %v, want one 200 and %d 409s", round, statuses, n-1)
		}
		for _, out := range outs {
			if out["error"] != nil && taskErrorCode(out) != "stale_revision" {
				t.Fatalf("round %d loser = %v", round, out)
			}
		}
	}
	if rev := w.e.count(`SELECT revision::int FROM task_workspace_bindings WHERE task_id = $1`, id); rev != 3 {
		t.Fatalf("revision after 3 rounds = %d", rev)
	}
	statuses, outs := put(func(int) string { return `{"mode":"shared","revision":3,"request_key":"same"}` })
	for i, out := range outs {
		if statuses[i] != http.StatusOK || out["revision"] != float64(4) || !reflect.DeepEqual(out, outs[0]) {
			t.Fatalf("concurrent retries of one request = %v %v", statuses, outs)
		}
	}
	if n := w.e.count(`SELECT count(*) FROM audit_events WHERE action = 'task_binding.updated'`); n != 4 {
		t.Fatalf("binding changes audited = %d, want 4", n)
	}
}

// TestBindingForm proves the task page's binding panel: htmx saves swap the panel and signal the
// plan to refresh; a stale form re-renders with the current binding and a message (409, for htmx
// and a plain browser alike); a double submit of one rendered form is one change.
func TestBindingForm(t *testing.T) {
	t.Parallel()
	w := newTaskWorld(t)
	id := w.task(map[string]any{})
	c := w.e.browser(w.r.Board)
	form := url.Values{"mode": {"isolated"}, "execution_workspace_id": {""}, "revision": {"0"}, "request_key": {"form-1"}}

	resp, body := w.postForm(c, "/tasks/"+id+"/workspace", form, true)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("HX-Trigger") != "plan-changed" ||
		!strings.Contains(body, "Saved as revision 1") || strings.Contains(body, "<html") || !strings.Contains(body, `name="revision" value="1"`) {
		t.Fatalf("htmx binding form = %d %q %s", resp.StatusCode, resp.Header.Get("HX-Trigger"), body)
	}
	if strings.Contains(body, `value="form-1"`) {
		t.Error("the re-rendered form reuses the request key it just spent")
	}
	resp, _ = w.postForm(c, "/tasks/"+id+"/workspace", form, false)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("double submit = %d, want the replayed success", resp.StatusCode)
	}
	if rev := w.e.count(`SELECT revision::int FROM task_workspace_bindings WHERE task_id = $1`, id); rev != 1 {
		t.Fatalf("double submit made revision %d", rev)
	}

	stale := url.Values{"mode": {"shared"}, "execution_workspace_id": {""}, "revision": {"0"}, "request_key": {"form-2"}}
	resp, body = w.postForm(c, "/tasks/"+id+"/workspace", stale, true)
	if resp.StatusCode != http.StatusConflict || resp.Header.Get("HX-Trigger") != "" || !strings.Contains(body, "Someone changed the binding") ||
		!strings.Contains(body, `name="revision" value="1"`) {
		t.Fatalf("stale htmx form = %d %s", resp.StatusCode, body)
	}
	resp, body = w.postForm(c, "/tasks/"+id+"/workspace", stale, false)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "<html") || !strings.Contains(body, "Someone changed the binding") {
		t.Fatalf("stale plain form = %d", resp.StatusCode)
	}
	resp, body = w.postForm(c, "/tasks/"+id+"/workspace", url.Values{"mode": {"reuse"}, "revision": {"1"}, "request_key": {"form-3"}}, true)
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, "Reuse needs a workspace") {
		t.Fatalf("invalid htmx form = %d %s", resp.StatusCode, body)
	}
	if rev := w.e.count(`SELECT revision::int FROM task_workspace_bindings WHERE task_id = $1`, id); rev != 1 {
		t.Fatalf("refused forms changed the revision to %d", rev)
	}
	_, page := w.get(c, "/tasks/"+id, false)
	if !strings.Contains(page, "isolated") || !strings.Contains(page, `name="request_key" value="form-`) {
		t.Fatal("the task page does not show the binding and a fresh request key")
	}
	_, viewerPage := w.get(w.e.browser(w.r.Viewer), "/tasks/"+id, false)
	if strings.Contains(viewerPage, "Save binding") || strings.Contains(viewerPage, "Save task") || !strings.Contains(viewerPage, "Workspace binding") {
		t.Fatal("a viewer sees the change forms, or not the binding")
	}
}
