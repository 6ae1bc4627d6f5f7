package handlers

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestSourceRootRequests: a board member's local source outside the roots is refused with an
// offer to ask; the request (audited in the company) shows on the admin's page and nowhere for
// others; approving it makes the directory a root, and the same source is accepted; a second
// answer is a 409; a dismissed request adds nothing. Admin pages are 404 for everyone else.
func TestSourceRootRequests(t *testing.T) {
	t.Parallel()
	e := setup(t, func(d *Deps) { d.SourceRoots = []string{"/var/tmp"} })
	r := e.roles()
	code, proj := e.call(r.Board, http.MethodPost, "/api/companies/"+r.A.ID+"/projects", map[string]any{"name": "P", "key": "SRC"})
	if code != http.StatusCreated {
		t.Fatalf("create project = %d %v", code, proj)
	}
	pid := proj["id"].(string)
	dir := t.TempDir() // outside /var/tmp
	board := e.browser(r.Board)

	// The form's refusal offers the request; the API's names the path.
	resp, body := e.sendForm(board, "/projects/"+pid+"/workspaces", url.Values{"name": {"w"}, "source_type": {"directory"}, "source": {dir}}, "workspaces")
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, `id="source-root-request"`) || !strings.Contains(body, `value="`+dir+`"`) {
		t.Fatalf("refusal = %d without the request form:\n%s", resp.StatusCode, body)
	}
	code, out := e.call(r.Board, http.MethodPost, "/api/projects/"+pid+"/workspaces", map[string]any{"name": "w", "source_type": "directory", "source": dir})
	if errObj, _ := out["error"].(map[string]any); code != 422 || errObj["code"] != "source_outside_roots" || errObj["path"] != dir {
		t.Fatalf("API refusal = %d %v", code, out)
	}
	// Viewers may not ask; board members of another company cannot see the project.
	if code, _ := e.call(r.Viewer, http.MethodPost, "/api/projects/"+pid+"/source-root-requests", map[string]any{"path": dir}); code != http.StatusForbidden {
		t.Errorf("viewer request = %d, want 403", code)
	}
	if code, _ := e.call(r.Other, http.MethodPost, "/api/projects/"+pid+"/source-root-requests", map[string]any{"path": dir}); code != http.StatusNotFound {
		t.Errorf("other company request = %d, want 404", code)
	}
	if code, _ := e.call(r.Board, http.MethodPost, "/api/projects/"+pid+"/source-root-requests", map[string]any{"path": "relative/dir"}); code != 422 {
		t.Errorf("relative path request = %d, want 422", code)
	}
	if n := e.count(`SELECT count(*) FROM source_root_requests`); n != 0 {
		t.Fatalf("refused requests stored %d rows", n)
	}
	resp, _ = e.sendForm(board, "/projects/"+pid+"/source-root-requests", url.Values{"path": {dir}}, "")
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(resp.Header.Get("Location"), "flash=request_sent") {
		t.Fatalf("request form = %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if code, _ := e.call(r.Board, http.MethodPost, "/api/projects/"+pid+"/source-root-requests", map[string]any{"path": dir}); code != http.StatusOK {
		t.Errorf("asking twice = %d, want 200 with the open request", code)
	}
	if n := e.count(`SELECT count(*) FROM source_root_requests WHERE status = 'open'`); n != 1 {
		t.Fatalf("%d open requests, want 1", n)
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE action = 'source_root_request.opened' AND company_id = $1`, r.A.ID); n != 1 {
		t.Errorf("request audited %d times in the company", n)
	}

	// Only instance admins see and answer.
	for _, a := range []actor{r.Board, r.Viewer, r.Other} {
		if code, _ := e.getPage(e.browser(a), "/admin/source-roots", nil); code != http.StatusNotFound {
			t.Errorf("%s: admin page = %d, want 404", a.User.Email, code)
		}
		if code, _ := e.call(a, http.MethodGet, "/api/source-roots", nil); code != http.StatusNotFound {
			t.Errorf("%s: roots API = %d, want 404", a.User.Email, code)
		}
	}
	admin := e.browser(r.Admin)
	code, page := e.getPage(admin, "/admin/source-roots", nil)
	if code != 200 || !strings.Contains(page, dir) || !strings.Contains(page, "/var/tmp") {
		t.Fatalf("admin page = %d:\n%s", code, page)
	}
	if _, dash := e.getPage(admin, "/", nil); !strings.Contains(dash, `id="source-requests-waiting"`) {
		t.Error("the admin's dashboard does not say a request waits")
	}
	var reqID string
	if err := e.pool.QueryRow(t.Context(), `SELECT id FROM source_root_requests`).Scan(&reqID); err != nil {
		t.Fatal(err)
	}
	if resp, _ := e.sendForm(board, "/admin/source-root-requests/"+reqID+"/approve", url.Values{}, ""); resp.StatusCode != http.StatusNotFound {
		t.Errorf("board member approving = %d, want 404", resp.StatusCode)
	}
	if resp, _ := e.sendForm(admin, "/admin/source-root-requests/"+reqID+"/approve", url.Values{}, ""); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("approve = %d", resp.StatusCode)
	}
	if resp, _ := e.sendForm(admin, "/admin/source-root-requests/"+reqID+"/dismiss", url.Values{}, ""); resp.StatusCode != http.StatusConflict {
		t.Errorf("answering twice = %d, want 409", resp.StatusCode)
	}
	if code, out := e.call(r.Board, http.MethodPost, "/api/projects/"+pid+"/workspaces", map[string]any{"name": "w", "source_type": "directory", "source": dir}); code != http.StatusCreated {
		t.Fatalf("after approval the source = %d %v", code, out)
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE action = 'source_root_request.approved' AND company_id = $1`, r.A.ID); n != 1 {
		t.Errorf("approval audited %d times in the company", n)
	}

	// Admin adds and removes roots directly (audited); bad paths are refused, nothing stored.
	for _, bad := range []string{"", "relative", "/"} {
		if resp, _ := e.sendForm(admin, "/admin/source-roots", url.Values{"path": {bad}}, ""); resp.StatusCode != 422 {
			t.Errorf("root %q = %d, want 422", bad, resp.StatusCode)
		}
	}
	if resp, _ := e.sendForm(admin, "/admin/source-roots", url.Values{"path": {dir}}, ""); resp.StatusCode != 409 {
		t.Errorf("the same root twice = %d, want 409", resp.StatusCode)
	}
	other := t.TempDir()
	if resp, _ := e.sendForm(admin, "/admin/source-roots", url.Values{"path": {other + "/"}, "note": {"x"}}, ""); resp.StatusCode != 303 {
		t.Fatalf("add root = %d", resp.StatusCode)
	}
	var rootID string
	if err := e.pool.QueryRow(t.Context(), `SELECT id FROM source_roots WHERE path = $1`, other).Scan(&rootID); err != nil {
		t.Fatalf("the root is not stored cleaned: %v", err)
	}
	if resp, _ := e.sendForm(admin, "/admin/source-roots/"+rootID+"/remove", url.Values{}, ""); resp.StatusCode != 303 {
		t.Fatalf("remove root = %d", resp.StatusCode)
	}
	if code, _ := e.call(r.Board, http.MethodPost, "/api/projects/"+pid+"/workspaces", map[string]any{"name": "w2", "source_type": "directory", "source": other}); code != 422 {
		t.Errorf("a source in a removed root = %d, want 422", code)
	}
	for _, action := range []string{"source_root.added", "source_root.removed"} {
		if n := e.count(`SELECT count(*) FROM audit_events WHERE action = $1`, action); n != 1 {
			t.Errorf("%s audited %d times", action, n)
		}
	}
	// A dismissed request adds no root.
	third := t.TempDir()
	code, req := e.call(r.Board, http.MethodPost, "/api/projects/"+pid+"/source-root-requests", map[string]any{"path": third})
	if code != http.StatusCreated {
		t.Fatalf("third request = %d %v", code, req)
	}
	if resp, _ := e.sendForm(admin, "/admin/source-root-requests/"+req["id"].(string)+"/dismiss", url.Values{}, ""); resp.StatusCode != 303 {
		t.Fatalf("dismiss = %d", resp.StatusCode)
	}
	if n := e.count(`SELECT count(*) FROM source_roots WHERE path = $1`, third); n != 0 {
		t.Errorf("a dismissed request added its root")
	}
}
