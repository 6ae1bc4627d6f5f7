package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// digest fingerprints the rows of a query, so a test can show a refused call changed nothing.
func (e *testEnv) digest(query string) string {
	e.t.Helper()
	var d string
	if err := e.pool.QueryRow(context.Background(),
		`SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM (`+query+`) t`).Scan(&d); err != nil {
		e.t.Fatal(err)
	}
	return d
}

// digests fingerprints the tables the company sections write (of API tokens, the revocations:
// using a token records when it was last used).
func (e *testEnv) digests() string {
	e.t.Helper()
	return e.digest(`SELECT * FROM companies`) + e.digest(`SELECT * FROM memberships`) +
		e.digest(`SELECT * FROM agents`) + e.digest(`SELECT id, revoked_at FROM api_tokens`)
}

// rawAPI sends body as-is with a content type, as a, and returns the status and error code.
func (e *testEnv) rawAPI(a actor, method, path, contentType string, body []byte) (int, string) {
	e.t.Helper()
	resp := e.do(e.client(), method, path, bytes.NewReader(body),
		map[string]string{"Authorization": "Bearer " + a.Token, "Content-Type": contentType})
	var out struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out.Error.Code
}

// sendForm posts a urlencoded form from a browser session, as htmx when htmxTarget is set, and
// returns the response and its body.
func (e *testEnv) sendForm(c *http.Client, path string, vals url.Values, htmxTarget string) (*http.Response, string) {
	e.t.Helper()
	h := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
	if htmxTarget != "" {
		h["HX-Request"] = "true"
		h["HX-Target"] = htmxTarget
	}
	resp := e.do(c, http.MethodPost, path, strings.NewReader(vals.Encode()), h)
	return resp, readBody(e.t, resp)
}

// getPage fetches a page in a browser session and returns its status and body.
func (e *testEnv) getPage(c *http.Client, path string, headers map[string]string) (int, string) {
	e.t.Helper()
	resp := e.do(c, http.MethodGet, path, nil, headers)
	return resp.StatusCode, readBody(e.t, resp)
}

// apiFieldErr returns error.fields[name] of a JSON error response.
func apiFieldErr(body map[string]any, name string) string {
	errObj, _ := body["error"].(map[string]any)
	fields, _ := errObj["fields"].(map[string]any)
	s, _ := fields[name].(string)
	return s
}

// apiErrCode returns error.code of a JSON error response.
func apiErrCode(body map[string]any) string {
	errObj, _ := body["error"].(map[string]any)
	s, _ := errObj["code"].(string)
	return s
}

// sectionActors names the four actors of the role matrix.
func sectionActors(r roles) map[string]actor {
	return map[string]actor{"viewer": r.Viewer, "board": r.Board, "admin": r.Admin, "other": r.Other}
}

// sectionMatrixOrder runs refusals before the board member's call, which may change the state.
var sectionMatrixOrder = []string{"viewer", "admin", "other", "board"}

func companySlugs(body map[string]any) []string {
	items, _ := body["items"].([]any)
	var out []string
	for _, it := range items {
		out = append(out, it.(map[string]any)["slug"].(string))
	}
	return out
}

func TestCompaniesAPIRoleMatrix(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	who := sectionActors(r)

	// Creating: instance admins only; everyone else 403, audited, nothing created.
	for _, name := range []string{"viewer", "board", "other"} {
		before := e.digests()
		status, body := e.call(who[name], http.MethodPost, "/api/companies", map[string]any{"name": "Gamma", "slug": "gamma"})
		if status != http.StatusForbidden || apiErrCode(body) != "forbidden" {
			t.Errorf("%s: POST /api/companies = %d %v, want 403", name, status, body)
		}
		if e.digests() != before {
			t.Errorf("%s: a refused create changed the data", name)
		}
		if n := e.count(`SELECT count(*) FROM audit_events WHERE action = 'company.create.denied' AND actor_id = $1`, who[name].User.ID); n != 1 {
			t.Errorf("%s: denial audit events = %d, want 1", name, n)
		}
	}
	status, body := e.call(r.Admin, http.MethodPost, "/api/companies", map[string]any{"name": "Gamma", "slug": "gamma"})
	if status != http.StatusCreated || body["slug"] != "gamma" || body["name"] != "Gamma" || body["role"] != "board" {
		t.Fatalf("admin: POST /api/companies = %d %v", status, body)
	}
	gid := body["id"].(string)
	if n := e.count(`SELECT count(*) FROM memberships WHERE company_id = $1 AND user_id = $2 AND role = 'board'`, gid, r.Admin.User.ID); n != 1 {
		t.Fatal("the creating admin is not the new company's board member")
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE company_id = $1 AND action IN ('company.created', 'membership.created')`, gid); n != 2 {
		t.Fatalf("create audit events = %d, want company.created and membership.created", n)
	}

	// Listing: members see their companies, the instance admin sees every company.
	wantList := map[string][]string{"viewer": {"acme"}, "board": {"acme"}, "other": {"beta"}, "admin": {"acme", "beta", "gamma"}}
	for name, want := range wantList {
		status, body := e.call(who[name], http.MethodGet, "/api/companies", nil)
		if got := companySlugs(body); status != http.StatusOK || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: GET /api/companies = %d %v, want %v", name, status, got, want)
		}
	}

	// Reading one: members and the instance admin; another company's member gets 404.
	wantGet := map[string]int{"viewer": 200, "board": 200, "admin": 200, "other": 404}
	for name, want := range wantGet {
		status, body := e.call(who[name], http.MethodGet, "/api/companies/"+r.A.ID, nil)
		if status != want {
			t.Errorf("%s: GET /api/companies/{A} = %d, want %d", name, status, want)
		}
		if want == 200 && body["id"] != r.A.ID {
			t.Errorf("%s: GET /api/companies/{A} = %v", name, body)
		}
	}
	if _, body := e.call(r.Viewer, http.MethodGet, "/api/companies/"+r.A.ID, nil); body["role"] != "viewer" {
		t.Errorf("viewer's company role = %v", body["role"])
	}
	if _, body := e.call(r.Admin, http.MethodGet, "/api/companies/"+r.A.ID, nil); body["role"] != nil {
		t.Errorf("non-member admin's company role = %v, want null", body["role"])
	}
	for _, id := range []string{"not-a-uuid", "00000000-0000-0000-0000-000000000000"} {
		if status, _ := e.call(r.Admin, http.MethodGet, "/api/companies/"+id, nil); status != http.StatusNotFound {
			t.Errorf("GET /api/companies/%s = %d, want 404", id, status)
		}
	}
	if status, _ := e.call(actor{}, http.MethodGet, "/api/companies", nil); status != http.StatusUnauthorized {
		t.Errorf("anonymous GET /api/companies = %d, want 401", status)
	}
}

func TestCreateCompanyRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	cases := []struct {
		name   string
		body   any
		status int
		code   string
		field  string
	}{
		{"empty name", map[string]any{"name": "  ", "slug": "gamma"}, 422, "validation_failed", "name"},
		{"long name", map[string]any{"name": strings.Repeat("n", 201), "slug": "gamma"}, 422, "validation_failed", "name"},
		{"missing slug", map[string]any{"name": "Gamma"}, 422, "validation_failed", "slug"},
		{"uppercase slug", map[string]any{"name": "Gamma", "slug": "Gamma"}, 422, "validation_failed", "slug"},
		{"leading dash", map[string]any{"name": "Gamma", "slug": "-gamma"}, 422, "validation_failed", "slug"},
		{"long slug", map[string]any{"name": "Gamma", "slug": strings.Repeat("g", 64)}, 422, "validation_failed", "slug"},
		{"taken slug", map[string]any{"name": "Another Acme", "slug": "acme"}, 409, "slug_taken", "slug"},
		{"unknown field", map[string]any{"name": "Gamma", "slug": "gamma", "plan": "pro"}, 400, "bad_json", ""},
		{"server-owned id", map[string]any{"name": "Gamma", "slug": "gamma", "id": r.A.ID}, 400, "bad_json", ""},
		{"not an object", `["gamma"]`, 400, "bad_json", ""},
	}
	before := e.digests()
	for _, tc := range cases {
		status, body := e.call(r.Admin, http.MethodPost, "/api/companies", tc.body)
		if status != tc.status || apiErrCode(body) != tc.code {
			t.Errorf("%s: %d %v, want %d %s", tc.name, status, body, tc.status, tc.code)
		}
		if tc.field != "" && apiFieldErr(body, tc.field) == "" {
			t.Errorf("%s: no message for field %s: %v", tc.name, tc.field, body)
		}
	}
	if status, code := e.rawAPI(r.Admin, http.MethodPost, "/api/companies", "text/plain", []byte(`{"name":"Gamma","slug":"gamma"}`)); status != 415 || code != "unsupported_media_type" {
		t.Errorf("text/plain body = %d %s, want 415", status, code)
	}
	big := []byte(`{"name":"` + strings.Repeat("x", 1<<20) + `","slug":"gamma"}`)
	if status, code := e.rawAPI(r.Admin, http.MethodPost, "/api/companies", "application/json", big); status != 413 || code != "body_too_large" {
		t.Errorf("2 MiB body = %d %s, want 413", status, code)
	}
	if e.digests() != before {
		t.Fatal("refused creates changed the data")
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE action = 'company.created'`); n != 0 {
		t.Fatalf("refused creates wrote %d company.created events", n)
	}
}

func TestCompaniesPagination(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	for i := range 5 {
		e.company(fmt.Sprintf("Company %d", i), fmt.Sprintf("c%d", i))
	}
	var seen []string
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("pagination does not end")
		}
		path := "/api/companies?limit=3"
		if cursor != "" {
			path += "&cursor=" + url.QueryEscape(cursor)
		}
		status, body := e.call(r.Admin, http.MethodGet, path, nil)
		if status != http.StatusOK {
			t.Fatalf("GET %s = %d %v", path, status, body)
		}
		slugs := companySlugs(body)
		if len(slugs) > 3 {
			t.Fatalf("page of %d items with limit 3", len(slugs))
		}
		seen = append(seen, slugs...)
		cursor, _ = body["next_cursor"].(string)
		if cursor == "" {
			break
		}
	}
	if want := "[acme beta c0 c1 c2 c3 c4]"; fmt.Sprint(seen) != want {
		t.Fatalf("paged slugs %v, want %s", seen, want)
	}
	for _, q := range []string{"limit=0", "limit=201", "limit=x", "cursor=%25%25"} {
		if status, body := e.call(r.Admin, http.MethodGet, "/api/companies?"+q, nil); status != http.StatusBadRequest {
			t.Errorf("GET /api/companies?%s = %d %v, want 400", q, status, body)
		}
	}
}

func TestCreateCompanyForm(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	admin := e.browser(r.Admin)

	// A name alone is enough: the slug is derived from it.
	resp, _ := e.sendForm(admin, "/companies", url.Values{"name": {"Gamma Rays, Inc."}, "slug": {""}}, "")
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/companies/") {
		t.Fatalf("POST /companies = %d to %q, want 303 to the company", resp.StatusCode, loc)
	}
	if n := e.count(`SELECT count(*) FROM companies WHERE slug = 'gamma-rays-inc' AND id = $1`, strings.TrimPrefix(loc, "/companies/")); n != 1 {
		t.Fatal("the company was not created with the derived slug")
	}

	// htmx gets HX-Redirect instead of a 303.
	resp, _ = e.sendForm(admin, "/companies", url.Values{"name": {"Delta"}, "slug": {"delta"}}, "create-company")
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("HX-Redirect"), "/companies/") {
		t.Fatalf("htmx POST /companies = %d, HX-Redirect %q", resp.StatusCode, resp.Header.Get("HX-Redirect"))
	}

	// Refusals re-render the dashboard with the messages and change nothing.
	before := e.digests()
	resp, body := e.sendForm(admin, "/companies", url.Values{"name": {""}, "slug": {"Bad Slug"}}, "")
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, "Enter a name.") || !strings.Contains(body, `value="Bad Slug"`) {
		t.Fatalf("invalid form = %d, want 422 with messages and the typed slug", resp.StatusCode)
	}
	resp, body = e.sendForm(admin, "/companies", url.Values{"name": {"Acme again"}, "slug": {"acme"}}, "")
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "This slug is taken") {
		t.Fatalf("taken slug form = %d, want 409 with the message", resp.StatusCode)
	}
	for _, a := range []actor{r.Board, r.Viewer, r.Other} {
		resp, _ := e.sendForm(e.browser(a), "/companies", url.Values{"name": {"Sneaky"}, "slug": {"sneaky"}}, "")
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: POST /companies = %d, want 403", a.User.Email, resp.StatusCode)
		}
	}
	if e.digests() != before {
		t.Fatal("refused forms changed the data")
	}

	// Only instance admins see the form.
	if _, body := e.getPage(admin, "/", nil); !strings.Contains(body, `action="/companies"`) {
		t.Error("the admin's dashboard has no create-company form")
	}
	if _, body := e.getPage(e.browser(r.Board), "/", nil); strings.Contains(body, `action="/companies"`) {
		t.Error("a board member's dashboard offers the create-company form")
	}
}

func TestDashboardEscapesAndLinksCompanies(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	evil := e.company("<script>alert(1)</script>", "evil")
	e.member(evil.ID, r.Board.User.ID, "viewer")
	_, body := e.getPage(e.browser(r.Board), "/", nil)
	if strings.Contains(body, "<script>alert(1)</script>") || !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Fatal("a company name is not escaped on the dashboard")
	}
	for _, c := range []string{r.A.ID, evil.ID} {
		if !strings.Contains(body, `href="/companies/`+c+`"`) {
			t.Errorf("the dashboard does not link to /companies/%s", c)
		}
	}
	if strings.Contains(body, r.B.ID) {
		t.Error("the dashboard lists a company the user does not belong to")
	}
}

func TestDashboardEmptyStates(t *testing.T) {
	t.Parallel()
	e := setup(t)
	admin := e.actorWith("admin@instance.test", true, "", "")
	newcomer := e.actorWith("new@example.com", false, "", "")
	if _, body := e.getPage(e.browser(admin), "/", nil); !strings.Contains(body, "Create the first company") {
		t.Error("an admin without companies is not told to create one")
	}
	if _, body := e.getPage(e.browser(newcomer), "/", nil); !strings.Contains(body, "Ask an instance administrator") || strings.Contains(body, `action="/companies"`) {
		t.Error("a newcomer without companies is not told to ask an admin")
	}
}

var dashboardStatPattern = regexp.MustCompile(`<div class="stat-value">(\d+)</div><div class="stat-label">([^<]+)</div>`)

// dashboardStats reads the counts off the dashboard.
func dashboardStats(t *testing.T, body string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, m := range dashboardStatPattern.FindAllStringSubmatch(body, -1) {
		n, _ := strconv.Atoi(m[1])
		out[m[2]] = n
	}
	if len(out) == 0 {
		t.Fatal("no counts on the dashboard")
	}
	return out
}

func TestDashboardCounts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := e.pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	// Company A: two active projects and an archived one, tasks in every state, one active and
	// one archived environment. Company B: one of each, which A's members must not count.
	seed := func(companyID, key string, statuses ...string) {
		var pid string
		if err := e.pool.QueryRow(ctx, `INSERT INTO projects (company_id, name, key) VALUES ($1, $2, $2) RETURNING id`,
			companyID, key).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		for i, st := range statuses {
			exec(`INSERT INTO tasks (company_id, project_id, number, key, title, status) VALUES ($1, $2, $3, $4, 'T', $5)`,
				companyID, pid, i+1, fmt.Sprintf("%s-%d", key, i+1), st)
		}
	}
	seed(r.A.ID, "ALPHA", "todo", "in_progress", "in_review", "done", "done", "cancelled")
	seed(r.A.ID, "BRAVO")
	exec(`INSERT INTO projects (company_id, name, key, status) VALUES ($1, 'Old', 'OLD', 'archived')`, r.A.ID)
	exec(`INSERT INTO environments (company_id, name, driver) VALUES ($1, 'local', 'local')`, r.A.ID)
	exec(`INSERT INTO environments (company_id, name, driver, status) VALUES ($1, 'gone', 'local', 'archived')`, r.A.ID)
	seed(r.B.ID, "BETA", "todo", "done")
	exec(`INSERT INTO environments (company_id, name, driver) VALUES ($1, 'local', 'local')`, r.B.ID)

	_, body := e.getPage(e.browser(r.Board), "/", nil)
	got := dashboardStats(t, body)
	want := map[string]int{"Companies": 1, "Projects": 2, "Open tasks": 3, "Done tasks": 2, "Environments": 1, "Members": 2}
	for label, n := range want {
		if got[label] != n {
			t.Errorf("board of A: %s = %d, want %d (all: %v)", label, got[label], n, got)
		}
	}
	if _, ok := got["Queued jobs"]; ok {
		t.Error("a board member sees the job queue counts")
	}

	_, body = e.getPage(e.browser(r.Admin), "/", nil)
	got = dashboardStats(t, body)
	want = map[string]int{"Companies": 2, "Projects": 3, "Open tasks": 4, "Done tasks": 3, "Environments": 2, "Members": 3}
	for label, n := range want {
		if got[label] != n {
			t.Errorf("admin: %s = %d, want %d (all: %v)", label, got[label], n, got)
		}
	}
	if _, ok := got["Queued jobs"]; !ok {
		t.Error("an instance admin does not see the job queue counts")
	}
}
