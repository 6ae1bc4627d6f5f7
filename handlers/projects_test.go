package handlers

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// projT is the fixture of the projects and project workspaces tests: a server, the standard
// cast of roles, and a browser session for each of them.
type projT struct {
	t *testing.T
	e *testEnv
	roles
	browsers map[string]*http.Client // by actor email
}

// newProjT starts a server with the standard cast of roles.
func newProjT(t *testing.T) *projT {
	t.Helper()
	e := setup(t)
	return &projT{t: t, e: e, roles: e.roles(), browsers: map[string]*http.Client{}}
}

// project creates a project in company A through the API as the board member.
func (f *projT) project(key string, extra map[string]any) map[string]any {
	f.t.Helper()
	body := map[string]any{"name": "Project " + key, "key": key}
	for k, v := range extra {
		body[k] = v
	}
	status, out := f.e.call(f.Board, http.MethodPost, "/api/companies/"+f.A.ID+"/projects", body)
	if status != http.StatusCreated {
		f.t.Fatalf("create project %s = %d %v", key, status, out)
	}
	return out
}

// environment inserts an environment for a company and returns its id.
func (f *projT) environment(companyID, name, status string) string {
	f.t.Helper()
	var id string
	err := f.e.pool.QueryRow(context.Background(), `INSERT INTO environments (company_id, name, driver, status)
		VALUES ($1, $2, 'local', $3) RETURNING id`, companyID, name, status).Scan(&id)
	if err != nil {
		f.t.Fatal(err)
	}
	return id
}

// browser is a's signed-in browser, made once.
func (f *projT) browser(a actor) *http.Client {
	f.t.Helper()
	if c, ok := f.browsers[a.User.Email]; ok {
		return c
	}
	c := f.e.browser(a)
	f.browsers[a.User.Email] = c
	return c
}

// post submits a urlencoded form as a's browser, as htmx when hx is set.
func (f *projT) post(a actor, path string, form url.Values, hx bool) (*http.Response, string) {
	f.t.Helper()
	headers := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
	if hx {
		headers["HX-Request"] = "true"
	}
	resp := f.e.do(f.browser(a), http.MethodPost, path, strings.NewReader(form.Encode()), headers)
	return resp, readBody(f.t, resp)
}

// get loads a page as a's browser.
func (f *projT) get(a actor, path string) (*http.Response, string) {
	f.t.Helper()
	resp := f.e.do(f.browser(a), http.MethodGet, path, nil, nil)
	return resp, readBody(f.t, resp)
}

// raw sends a request with a's token and explicit headers, returning status and body.
func (f *projT) raw(a actor, method, path, contentType string, body string) (int, string) {
	f.t.Helper()
	headers := map[string]string{"Authorization": "Bearer " + a.Token, "Content-Type": contentType}
	resp := f.e.do(f.e.client(), method, path, strings.NewReader(body), headers)
	return resp.StatusCode, readBody(f.t, resp)
}

// projErrCode returns the code of a JSON error body.
func projErrCode(out map[string]any) string {
	e, _ := out["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

// projErrFields returns the field messages of a JSON error body.
func projErrFields(out map[string]any) map[string]any {
	e, _ := out["error"].(map[string]any)
	fields, _ := e["fields"].(map[string]any)
	return fields
}

// audits counts audit events with an action.
func (f *projT) audits(action string) int {
	f.t.Helper()
	return f.e.count(`SELECT count(*) FROM audit_events WHERE action = $1`, action)
}

func TestProjectRoleMatrix(t *testing.T) {
	t.Parallel()
	f := newProjT(t)
	p := f.project("WEB", nil)
	id := p["id"].(string)
	cid := f.A.ID
	projects := func() int { return f.e.count(`SELECT count(*) FROM projects`) }
	name := func() string {
		var n string
		if err := f.e.pool.QueryRow(context.Background(), `SELECT name FROM projects WHERE id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Reads: every member and the instance admin; another company's board sees nothing.
	for _, tc := range []struct {
		who  actor
		want int
	}{{f.Board, 200}, {f.Viewer, 200}, {f.Admin, 200}, {f.Other, 404}} {
		for _, path := range []string{"/api/companies/" + cid + "/projects", "/api/projects/" + id} {
			if status, out := f.e.call(tc.who, http.MethodGet, path, nil); status != tc.want {
				t.Errorf("%s GET %s = %d %v, want %d", tc.who.User.Email, path, status, out, tc.want)
			}
		}
		for _, path := range []string{"/companies/" + cid, "/projects/" + id} {
			if resp, _ := f.get(tc.who, path); resp.StatusCode != tc.want {
				t.Errorf("%s page %s = %d, want %d", tc.who.User.Email, path, resp.StatusCode, tc.want)
			}
		}
	}

	// Writes: only the board member; viewer and non-member admin 403 (audited), other company 404.
	for _, tc := range []struct {
		who     actor
		want    int
		audited bool // a 403 is audited; a 404 reveals nothing and records nothing in company A
	}{{f.Viewer, 403, true}, {f.Admin, 403, true}, {f.Other, 404, false}} {
		before, deniedBefore := projects(), f.e.count(`SELECT count(*) FROM audit_events WHERE action LIKE '%.denied'`)
		writes := []struct {
			method, path string
			body         any
		}{
			{http.MethodPost, "/api/companies/" + cid + "/projects", map[string]any{"name": "X", "key": "XX"}},
			{http.MethodPatch, "/api/projects/" + id, map[string]any{"name": "Hijacked"}},
			{http.MethodPatch, "/api/projects/" + id, map[string]any{"status": "archived"}},
		}
		for _, w := range writes {
			if status, out := f.e.call(tc.who, w.method, w.path, w.body); status != tc.want {
				t.Errorf("%s %s %s = %d %v, want %d", tc.who.User.Email, w.method, w.path, status, out, tc.want)
			}
		}
		forms := []struct {
			path string
			form url.Values
		}{
			{"/companies/" + cid + "/projects", url.Values{"name": {"X"}, "key": {"XX"}}},
			{"/projects/" + id, url.Values{"name": {"Hijacked"}}},
			{"/projects/" + id + "/archive", nil},
			{"/projects/" + id + "/unarchive", nil},
		}
		for _, fm := range forms {
			if resp, _ := f.post(tc.who, fm.path, fm.form, false); resp.StatusCode != tc.want {
				t.Errorf("%s POST %s = %d, want %d", tc.who.User.Email, fm.path, resp.StatusCode, tc.want)
			}
		}
		if projects() != before || name() != "Project WEB" {
			t.Errorf("%s changed something: %d projects (was %d), name %q", tc.who.User.Email, projects(), before, name())
		}
		denied := f.e.count(`SELECT count(*) FROM audit_events WHERE action LIKE '%.denied'`) - deniedBefore
		wantDenied := 0
		if tc.audited {
			wantDenied = len(writes) + len(forms)
		}
		if denied != wantDenied {
			t.Errorf("%s: %d denial audit events, want %d", tc.who.User.Email, denied, wantDenied)
		}
	}
	if f.audits("project.update.denied") == 0 || f.audits("project.create.denied") == 0 || f.audits("project.archive.denied") == 0 {
		t.Error("denials are not audited under their action names")
	}

	// The board member may do all of it.
	if status, out := f.e.call(f.Board, http.MethodPatch, "/api/projects/"+id, map[string]any{"name": "Renamed"}); status != 200 || out["name"] != "Renamed" {
		t.Fatalf("board PATCH = %d %v", status, out)
	}
	if resp, _ := f.post(f.Board, "/projects/"+id+"/archive", nil, false); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("board archive form = %d", resp.StatusCode)
	}
	if resp, _ := f.post(f.Board, "/projects/"+id+"/unarchive", nil, false); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("board unarchive form = %d", resp.StatusCode)
	}
	if f.audits("project.archived") != 1 || f.audits("project.unarchived") != 1 || f.audits("project.updated") != 1 || f.audits("project.created") != 1 {
		t.Fatal("changes are not audited once each")
	}
	// Malformed and unknown ids are the same 404 as another company's.
	for _, path := range []string{"/api/projects/not-a-uuid", "/api/projects/00000000-0000-0000-0000-000000000000", "/api/companies/nope/projects"} {
		if status, _ := f.e.call(f.Board, http.MethodGet, path, nil); status != 404 {
			t.Errorf("GET %s = %d, want 404", path, status)
		}
	}
}

func TestProjectKeyValidation(t *testing.T) {
	t.Parallel()
	f := newProjT(t)
	cases := []struct {
		key  string
		want int
	}{
		{"AB", 201}, {"A1", 201}, {"ABCDEFGHIJ", 201}, {"Z9Z9Z9", 201},
		{"", 422}, {"A", 422}, {"ABCDEFGHIJK", 422}, {"1AB", 422}, {"ab", 422}, {"Ab", 422},
		{"A-B", 422}, {"A B", 422}, {"ÄB", 422}, {"A_B", 422},
		{"AB", 409}, // already taken by the first case
	}
	for _, tc := range cases {
		before := f.e.count(`SELECT count(*) FROM projects`)
		status, out := f.e.call(f.Board, http.MethodPost, "/api/companies/"+f.A.ID+"/projects",
			map[string]any{"name": "P", "key": tc.key})
		if status != tc.want {
			t.Errorf("key %q = %d %v, want %d", tc.key, status, out, tc.want)
			continue
		}
		after := f.e.count(`SELECT count(*) FROM projects`)
		switch tc.want {
		case 201:
			if out["key"] != tc.key || after != before+1 {
				t.Errorf("key %q: created %v, count %d→%d", tc.key, out["key"], before, after)
			}
		case 422:
			if projErrFields(out)["key"] == nil || after != before {
				t.Errorf("key %q: fields %v, count %d→%d", tc.key, projErrFields(out), before, after)
			}
		case 409:
			if projErrCode(out) != "key_taken" || after != before {
				t.Errorf("key %q: %v, count %d→%d", tc.key, out, before, after)
			}
		}
	}
	// Keys are unique per company, not across companies.
	if status, out := f.e.call(f.Other, http.MethodPost, "/api/companies/"+f.B.ID+"/projects", map[string]any{"name": "P", "key": "AB"}); status != 201 {
		t.Fatalf("same key in another company = %d %v", status, out)
	}
	// Other fields are validated in the same response.
	status, out := f.e.call(f.Board, http.MethodPost, "/api/companies/"+f.A.ID+"/projects",
		map[string]any{"name": "", "key": "x", "description": strings.Repeat("d", 10001)})
	fields := projErrFields(out)
	if status != 422 || fields["name"] == nil || fields["key"] == nil || fields["description"] == nil {
		t.Fatalf("several bad fields = %d %v", status, out)
	}
}

func TestProjectPolicyValidation(t *testing.T) {
	t.Parallel()
	f := newProjT(t)
	own := f.environment(f.A.ID, "local", "active")
	archived := f.environment(f.A.ID, "old", "archived")
	foreign := f.environment(f.B.ID, "theirs", "active")
	cases := []struct {
		name   string
		policy map[string]any
		field  string // "" = accepted
	}{
		{"empty takes defaults", map[string]any{}, ""},
		{"own environment", map[string]any{"environment_id": own, "default_mode": "isolated", "strategy": "copy"}, ""},
		{"own environment in capitals", map[string]any{"environment_id": strings.ToUpper(own)}, ""},
		{"null environment", map[string]any{"environment_id": nil}, ""},
		{"custom template", map[string]any{"branch_template": "work/{task_key}"}, ""},
		{"bad mode", map[string]any{"default_mode": "reuse"}, "execution_policy.default_mode"},
		{"bad strategy", map[string]any{"strategy": "rsync"}, "execution_policy.strategy"},
		{"template without key", map[string]any{"branch_template": "work/fixed"}, "execution_policy.branch_template"},
		{"template with space", map[string]any{"branch_template": "work {task_key}"}, "execution_policy.branch_template"},
		{"template with ..", map[string]any{"branch_template": "a..b/{task_key}"}, "execution_policy.branch_template"},
		{"another company's environment", map[string]any{"environment_id": foreign}, "execution_policy.environment_id"},
		{"unknown environment", map[string]any{"environment_id": "00000000-0000-0000-0000-000000000001"}, "execution_policy.environment_id"},
		{"malformed environment", map[string]any{"environment_id": "local"}, "execution_policy.environment_id"},
		{"archived environment", map[string]any{"environment_id": archived}, "execution_policy.environment_id"},
	}
	var foreignMsg, unknownMsg any
	for i, tc := range cases {
		before := f.e.count(`SELECT count(*) FROM projects`)
		key := fmt.Sprintf("P%d", i)
		status, out := f.e.call(f.Board, http.MethodPost, "/api/companies/"+f.A.ID+"/projects",
			map[string]any{"name": tc.name, "key": key, "execution_policy": tc.policy})
		if tc.field == "" {
			if status != 201 {
				t.Errorf("%s = %d %v, want 201", tc.name, status, out)
			}
			continue
		}
		fields := projErrFields(out)
		if status != 422 || fields[tc.field] == nil || f.e.count(`SELECT count(*) FROM projects`) != before {
			t.Errorf("%s = %d %v, want 422 on %s and nothing created", tc.name, status, out, tc.field)
		}
		switch tc.name {
		case "another company's environment":
			foreignMsg = fields[tc.field]
		case "unknown environment":
			unknownMsg = fields[tc.field]
		}
	}
	if foreignMsg == nil || foreignMsg != unknownMsg {
		t.Errorf("another company's environment reads %q, an unknown one %q: they must be the same", foreignMsg, unknownMsg)
	}

	// The stored policy is normalized: every default filled, no environment as null.
	var stored map[string]any
	if err := f.e.pool.QueryRow(context.Background(), `SELECT execution_policy FROM projects WHERE key = 'P0'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"default_mode": "shared", "allow_task_override": false, "environment_id": nil,
		"strategy": "git_worktree", "branch_template": "berth/{task_key}"}
	if fmt.Sprint(stored) != fmt.Sprint(want) {
		t.Fatalf("stored policy = %v, want %v", stored, want)
	}
	// Ids are stored in their canonical form.
	if n := f.e.count(`SELECT count(*) FROM projects WHERE execution_policy->>'environment_id' = $1`, own); n != 2 {
		t.Fatalf("%d projects name the environment in canonical form, want 2", n)
	}
	// Unknown members of the policy are refused like unknown top-level fields.
	status, _ := f.e.call(f.Board, http.MethodPost, "/api/companies/"+f.A.ID+"/projects",
		map[string]any{"name": "x", "key": "UNK", "execution_policy": map[string]any{"mode": "shared"}})
	if status != 400 {
		t.Fatalf("unknown policy member = %d, want 400", status)
	}
}

func TestProjectPatch(t *testing.T) {
	t.Parallel()
	f := newProjT(t)
	env := f.environment(f.A.ID, "local", "active")
	p := f.project("API", map[string]any{"description": "first", "execution_policy": map[string]any{
		"default_mode": "isolated", "allow_task_override": true, "environment_id": env, "strategy": "copy"}})
	path := "/api/projects/" + p["id"].(string)
	if p["status"] != "active" || p["description"] != "first" {
		t.Fatalf("created = %v", p)
	}

	// Named members replace; others stay.
	status, out := f.e.call(f.Board, http.MethodPatch, path, map[string]any{"name": "Renamed"})
	pol, _ := out["execution_policy"].(map[string]any)
	if status != 200 || out["name"] != "Renamed" || out["description"] != "first" || pol["environment_id"] != env {
		t.Fatalf("PATCH name = %d %v", status, out)
	}
	// execution_policy is replaced as a whole: omitted members go back to their defaults.
	status, out = f.e.call(f.Board, http.MethodPatch, path, map[string]any{"execution_policy": map[string]any{"strategy": "copy"}})
	pol, _ = out["execution_policy"].(map[string]any)
	if status != 200 || pol["default_mode"] != "shared" || pol["environment_id"] != nil || pol["allow_task_override"] != false {
		t.Fatalf("PATCH policy = %d %v", status, out)
	}
	// Refusals that change nothing.
	for _, tc := range []struct {
		body any
		want int
		code string
	}{
		{map[string]any{"key": "NEW"}, 400, "key_immutable"},
		{map[string]any{"key": "API"}, 400, "key_immutable"},
		{map[string]any{"company_id": f.B.ID}, 400, "server_owned_field"},
		{map[string]any{"id": "x"}, 400, "bad_json"},
		{map[string]any{"created_at": "2020-01-01T00:00:00Z"}, 400, "bad_json"},
		{map[string]any{"name": ""}, 422, "validation_failed"},
		{map[string]any{"name": nil}, 422, "validation_failed"},
		{map[string]any{"status": "deleted"}, 422, "validation_failed"},
		{map[string]any{"execution_policy": map[string]any{"strategy": "rsync"}}, 422, "validation_failed"},
		{map[string]any{"name": "Bad", "execution_policy": map[string]any{"default_mode": "x"}}, 422, "validation_failed"},
	} {
		updated := f.e.count(`SELECT count(*) FROM audit_events WHERE action LIKE 'project.%'`)
		status, out := f.e.call(f.Board, http.MethodPatch, path, tc.body)
		if status != tc.want || projErrCode(out) != tc.code {
			t.Errorf("PATCH %v = %d %v, want %d %s", tc.body, status, out, tc.want, tc.code)
		}
		if _, now := f.e.call(f.Board, http.MethodGet, path, nil); now["name"] != "Renamed" ||
			f.e.count(`SELECT count(*) FROM audit_events WHERE action LIKE 'project.%'`) != updated {
			t.Errorf("PATCH %v changed the project: %v", tc.body, now)
		}
	}

	// Archive: reads still work, changes are refused until unarchived.
	if status, out := f.e.call(f.Board, http.MethodPatch, path, map[string]any{"status": "archived"}); status != 200 || out["status"] != "archived" {
		t.Fatalf("archive = %d %v", status, out)
	}
	if status, out := f.e.call(f.Board, http.MethodPatch, path, map[string]any{"name": "While archived"}); status != 409 || projErrCode(out) != "project_archived" {
		t.Fatalf("PATCH archived = %d %v, want 409 project_archived", status, out)
	}
	if status, _ := f.e.call(f.Viewer, http.MethodGet, path, nil); status != 200 {
		t.Fatalf("GET archived = %d", status)
	}
	// Archiving twice is a no-op, not a second event.
	if status, _ := f.e.call(f.Board, http.MethodPatch, path, map[string]any{"status": "archived"}); status != 200 || f.audits("project.archived") != 1 {
		t.Fatalf("archive again = %d, %d archive events", status, f.audits("project.archived"))
	}
	status, out = f.e.call(f.Board, http.MethodPatch, path, map[string]any{"status": "active", "name": "Back"})
	if status != 200 || out["status"] != "active" || out["name"] != "Back" || f.audits("project.unarchived") != 1 {
		t.Fatalf("unarchive with rename = %d %v", status, out)
	}
	// The list filters by status.
	_, list := f.e.call(f.Viewer, http.MethodGet, "/api/companies/"+f.A.ID+"/projects?status=archived", nil)
	if items, _ := list["items"].([]any); len(items) != 0 {
		t.Fatalf("archived filter = %v", list)
	}
	if status, _ := f.e.call(f.Viewer, http.MethodGet, "/api/companies/"+f.A.ID+"/projects?status=gone", nil); status != 400 {
		t.Fatalf("bad status filter = %d", status)
	}
}

func TestProjectAPIHygiene(t *testing.T) {
	t.Parallel()
	f := newProjT(t)
	p := f.project("HYG", nil)
	create := "/api/companies/" + f.A.ID + "/projects"
	patch := "/api/projects/" + p["id"].(string)
	big := `{"name":"` + strings.Repeat("a", 1<<20) + `","key":"BIG"}`
	for _, tc := range []struct {
		method, path, ctype, body string
		want                      int
	}{
		{http.MethodPost, create, "text/plain", `{"name":"x","key":"TXT"}`, 415},
		{http.MethodPost, create, "application/x-www-form-urlencoded", `name=x&key=FRM`, 415},
		{http.MethodPost, create, "application/json", big, 413},
		{http.MethodPost, create, "application/json", `{"name":"x","key":"UNK","owner":"me"}`, 400},
		{http.MethodPost, create, "application/json", `{"name":"x","key":"ST","status":"archived"}`, 400},
		{http.MethodPost, create, "application/json", `{"name":"x","key":"CID","company_id":"` + f.A.ID + `"}`, 400},
		{http.MethodPost, create, "application/json", `{"name":"x",`, 400},
		{http.MethodPost, create, "application/json", `{"name":"x","key":"TWO"}{}`, 400},
		{http.MethodPost, create, "application/json", `{"name":5,"key":"TYP"}`, 400},
		{http.MethodPost, create, "", ``, 400},
		{http.MethodPatch, patch, "text/plain", `{"name":"x"}`, 415},
		{http.MethodPatch, patch, "application/json", big, 413},
		{http.MethodPatch, patch, "application/json", `{"execution_policy":{"strategy":"copy","extra":1}}`, 400},
	} {
		before := f.e.count(`SELECT count(*) FROM projects`)
		status, body := f.raw(f.Board, tc.method, tc.path, tc.ctype, tc.body)
		if status != tc.want || !strings.Contains(body, `"error"`) {
			t.Errorf("%s %s (%s) = %d %.200s, want %d", tc.method, tc.path, tc.ctype, status, body, tc.want)
		}
		if f.e.count(`SELECT count(*) FROM projects`) != before {
			t.Errorf("%s %s (%s) created a project", tc.method, tc.path, tc.ctype)
		}
	}
	if _, out := f.e.call(f.Board, http.MethodGet, patch, nil); out["name"] != "Project HYG" {
		t.Fatalf("refused PATCHes changed the project: %v", out)
	}
	// Without credentials the API answers 401, pages redirect to the sign-in page.
	if status, _ := f.e.call(actor{}, http.MethodGet, create, nil); status != 401 {
		t.Fatalf("anonymous API = %d", status)
	}
	if resp := f.e.do(f.e.client(), http.MethodGet, "/companies/"+f.A.ID, nil, nil); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" {
		t.Fatalf("anonymous page = %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
}

func TestProjectListPagination(t *testing.T) {
	t.Parallel()
	f := newProjT(t)
	keys := []string{"EEE", "AAA", "DDD", "BBB", "CCC"}
	for _, k := range keys {
		f.project(k, nil)
	}
	if _, err := f.e.pool.Exec(context.Background(), `INSERT INTO projects (company_id, name, key) VALUES ($1, 'Theirs', 'ABC')`, f.B.ID); err != nil {
		t.Fatal(err)
	}
	var got []string
	cursor := ""
	for page := 0; page < 5; page++ {
		path := "/api/companies/" + f.A.ID + "/projects?limit=2"
		if cursor != "" {
			path += "&cursor=" + url.QueryEscape(cursor)
		}
		status, out := f.e.call(f.Viewer, http.MethodGet, path, nil)
		if status != 200 {
			t.Fatalf("page %d = %d %v", page, status, out)
		}
		items := out["items"].([]any)
		if len(items) > 2 {
			t.Fatalf("page %d has %d items", page, len(items))
		}
		for _, it := range items {
			got = append(got, it.(map[string]any)["key"].(string))
		}
		cursor, _ = out["next_cursor"].(string)
		if cursor == "" {
			break
		}
	}
	if strings.Join(got, ",") != "AAA,BBB,CCC,DDD,EEE" {
		t.Fatalf("paged keys = %v", got)
	}
	for _, q := range []string{"limit=0", "limit=201", "limit=x", "cursor=!!!", "cursor=bm90LWpzb24"} {
		if status, _ := f.e.call(f.Viewer, http.MethodGet, "/api/companies/"+f.A.ID+"/projects?"+q, nil); status != 400 {
			t.Errorf("?%s = %d, want 400", q, status)
		}
	}
	// The page pages the same way.
	resp, body := f.get(f.Viewer, "/companies/"+f.A.ID+"?limit=2")
	if resp.StatusCode != 200 || !strings.Contains(body, "Next page") || strings.Contains(body, "CCC") || !strings.Contains(body, "BBB") {
		t.Fatalf("first page = %d, next link %v", resp.StatusCode, strings.Contains(body, "Next page"))
	}
}

func TestProjectHTMLEscaping(t *testing.T) {
	t.Parallel()
	f := newProjT(t)
	evil := `<script>alert("x")</script>`
	p := f.project("XSS", map[string]any{"name": evil, "description": `<img src=x onerror=alert(1)>`,
		"execution_policy": map[string]any{"branch_template": `b/{task_key}/"><b>`}})
	if p["name"] != evil {
		t.Fatalf("name stored as %v", p["name"])
	}
	for _, path := range []string{"/companies/" + f.A.ID, "/projects/" + p["id"].(string)} {
		resp, body := f.get(f.Viewer, path)
		if resp.StatusCode != 200 {
			t.Fatalf("%s = %d", path, resp.StatusCode)
		}
		if strings.Contains(body, evil) || strings.Contains(body, "<img src=x") || strings.Contains(body, `"><b>`) {
			t.Fatalf("%s renders user text unescaped", path)
		}
		if !strings.Contains(body, "&lt;script&gt;") {
			t.Fatalf("%s does not show the escaped name", path)
		}
	}
	// The form re-rendered after a refusal escapes what was typed, too.
	_, body := f.post(f.Board, "/companies/"+f.A.ID+"/projects", url.Values{"name": {evil}, "key": {"bad key"}}, true)
	if strings.Contains(body, evil) || !strings.Contains(body, "&lt;script&gt;") {
		t.Fatal("the refused form echoes the name unescaped")
	}
}

func TestProjectForms(t *testing.T) {
	t.Parallel()
	f := newProjT(t)
	env := f.environment(f.A.ID, "local", "active")
	cid := f.A.ID
	form := url.Values{"name": {"Website"}, "key": {"WEB"}, "description": {"line one\r\nline two"},
		"default_mode": {"isolated"}, "allow_task_override": {"true"}, "environment_id": {env},
		"strategy": {"git_worktree"}, "branch_template": {""}}

	// A refused form changes nothing and re-renders with the message: a whole page without htmx,
	// the form alone with it.
	bad := url.Values{"name": {"Website"}, "key": {"web"}, "default_mode": {"shared"}, "strategy": {"git_worktree"}}
	resp, body := f.post(f.Board, "/companies/"+cid+"/projects", bad, false)
	if resp.StatusCode != 422 || !strings.Contains(body, "capital letters") || !strings.Contains(body, "<html") {
		t.Fatalf("bad form = %d", resp.StatusCode)
	}
	resp, body = f.post(f.Board, "/companies/"+cid+"/projects", bad, true)
	if resp.StatusCode != 422 || !strings.Contains(body, `id="new-project"`) || strings.Contains(body, "<html") {
		t.Fatalf("bad htmx form = %d %.300s", resp.StatusCode, body)
	}
	if n := f.e.count(`SELECT count(*) FROM projects`); n != 0 {
		t.Fatalf("refused forms created %d projects", n)
	}

	// Success: 303 to the project without htmx, HX-Redirect with it.
	resp, _ = f.post(f.Board, "/companies/"+cid+"/projects", form, false)
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/projects/") {
		t.Fatalf("create form = %d %s", resp.StatusCode, loc)
	}
	id := strings.TrimPrefix(loc, "/projects/")
	_, p := f.e.call(f.Board, http.MethodGet, "/api/projects/"+id, nil)
	pol := p["execution_policy"].(map[string]any)
	if p["description"] != "line one\nline two" || pol["default_mode"] != "isolated" || pol["allow_task_override"] != true ||
		pol["environment_id"] != env || pol["branch_template"] != "berth/{task_key}" {
		t.Fatalf("created by form = %v", p)
	}
	form.Set("key", "WEB2")
	resp, _ = f.post(f.Board, "/companies/"+cid+"/projects", form, true)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("HX-Redirect"), "/projects/") {
		t.Fatalf("htmx create = %d %q", resp.StatusCode, resp.Header.Get("HX-Redirect"))
	}
	// A taken key is a 409 shown on the key field.
	resp, body = f.post(f.Board, "/companies/"+cid+"/projects", form, false)
	if resp.StatusCode != 409 || !strings.Contains(body, "already used") {
		t.Fatalf("taken key form = %d", resp.StatusCode)
	}

	// Edit: the policy form replaces the policy; a refused edit changes nothing.
	edit := url.Values{"name": {"Site"}, "description": {""}, "default_mode": {"shared"}, "strategy": {"copy"}, "branch_template": {"x/{task_key}"}}
	resp, _ = f.post(f.Board, "/projects/"+id, edit, false)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("edit form = %d", resp.StatusCode)
	}
	_, p = f.e.call(f.Board, http.MethodGet, "/api/projects/"+id, nil)
	pol = p["execution_policy"].(map[string]any)
	if p["name"] != "Site" || p["key"] != "WEB" || pol["strategy"] != "copy" || pol["environment_id"] != nil || pol["allow_task_override"] != false {
		t.Fatalf("edited = %v", p)
	}
	edit.Set("branch_template", "fixed")
	resp, body = f.post(f.Board, "/projects/"+id, edit, true)
	if resp.StatusCode != 422 || !strings.Contains(body, `id="edit-project"`) || !strings.Contains(body, "{task_key}") {
		t.Fatalf("bad edit = %d", resp.StatusCode)
	}
	if _, now := f.e.call(f.Board, http.MethodGet, "/api/projects/"+id, nil); now["execution_policy"].(map[string]any)["branch_template"] != "x/{task_key}" {
		t.Fatal("a refused edit changed the policy")
	}
	// Archived: the page says so, offers no edit form, and the edit form route refuses.
	if resp, _ := f.post(f.Board, "/projects/"+id+"/archive", nil, false); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("archive = %d", resp.StatusCode)
	}
	_, body = f.get(f.Board, "/projects/"+id)
	if !strings.Contains(body, "archived") || strings.Contains(body, `id="edit-project"`) || !strings.Contains(body, "Unarchive") {
		t.Fatal("archived project page still offers editing")
	}
	if resp, _ := f.post(f.Board, "/projects/"+id, edit, false); resp.StatusCode != 409 {
		t.Fatalf("edit archived = %d, want 409", resp.StatusCode)
	}
}

func TestProjectPages(t *testing.T) {
	t.Parallel()
	f := newProjT(t)
	// Empty company: the board is told what to do first, including the missing environment.
	_, body := f.get(f.Board, "/companies/"+f.A.ID)
	for _, want := range []string{"No projects yet", "Create the first project", "/companies/" + f.A.ID + "/environments", `id="new-project"`} {
		if !strings.Contains(body, want) {
			t.Errorf("board's empty projects page lacks %q", want)
		}
	}
	_, body = f.get(f.Viewer, "/companies/"+f.A.ID)
	if !strings.Contains(body, "A board member") || strings.Contains(body, `id="new-project"`) {
		t.Error("viewer's empty projects page offers the form or no hint")
	}
	_, body = f.get(f.Admin, "/companies/"+f.A.ID)
	if strings.Contains(body, `id="new-project"`) {
		t.Error("non-member instance admin is offered the new-project form")
	}

	env := f.environment(f.A.ID, "laptop", "active")
	f.environment(f.A.ID, "retired", "archived")
	p := f.project("DOC", map[string]any{"execution_policy": map[string]any{"environment_id": env}})
	id := p["id"].(string)
	_, body = f.get(f.Board, "/companies/"+f.A.ID)
	if strings.Contains(body, "no active environment") || !strings.Contains(body, "DOC") || strings.Contains(body, "retired") {
		t.Error("projects page: environment hint shown with an environment, project missing, or archived environment offered")
	}
	_, body = f.get(f.Board, "/projects/"+id)
	for _, want := range []string{
		`hx-get="/projects/` + id + `/tasks"`, `hx-trigger="load"`, `href="/projects/` + id + `/tasks"`,
		"laptop", "No workspace yet", `id="new-workspace"`, `data-confirm=`, "berth/{task_key}",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("project page lacks %q", want)
		}
	}
	_, body = f.get(f.Viewer, "/projects/"+id)
	if strings.Contains(body, `id="new-workspace"`) || strings.Contains(body, `id="edit-project"`) || strings.Contains(body, "/archive") {
		t.Error("viewer is offered forms on the project page")
	}
	// An environment archived after it was chosen is flagged on the page.
	if _, err := f.e.pool.Exec(context.Background(), `UPDATE environments SET status = 'archived' WHERE id = $1`, env); err != nil {
		t.Fatal(err)
	}
	_, body = f.get(f.Board, "/projects/"+id)
	if !strings.Contains(body, "Runs are blocked") {
		t.Error("project page does not flag its archived environment")
	}
	// Still, an unrelated change to the project passes with the archived environment kept.
	pol := p["execution_policy"].(map[string]any)
	if status, out := f.e.call(f.Board, http.MethodPatch, "/api/projects/"+id, map[string]any{"execution_policy": pol}); status != 200 {
		t.Fatalf("re-sending the policy with its archived environment = %d %v", status, out)
	}
	raw, _ := json.Marshal(pol)
	if !strings.Contains(string(raw), env) {
		t.Fatal("policy lost its environment")
	}
}
