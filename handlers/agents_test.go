package handlers

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"berth/db"
)

// agentIn creates an agent directly in a company.
func (e *testEnv) agentIn(companyID, name string) db.Agent {
	e.t.Helper()
	ag, err := db.CreateAgent(context.Background(), e.pool, companyID, name, "", "")
	if err != nil {
		e.t.Fatal(err)
	}
	return ag
}

func TestAgentsAPIRoleMatrix(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	who := sectionActors(r)
	existing := e.agentIn(r.A.ID, "deploy-bot")

	cases := []struct {
		name   string
		method string
		path   string
		body   any
		want   map[string]int
	}{
		{"list", http.MethodGet, "/api/companies/" + r.A.ID + "/agents", nil, map[string]int{"viewer": 200, "admin": 200, "other": 404, "board": 200}},
		{"create", http.MethodPost, "/api/companies/" + r.A.ID + "/agents", map[string]any{"name": "ci", "description": "Runs the checks"},
			map[string]int{"viewer": 403, "admin": 403, "other": 404, "board": 201}},
		{"get", http.MethodGet, "/api/agents/" + existing.ID, nil, map[string]int{"viewer": 200, "admin": 200, "other": 404, "board": 200}},
		{"disable", http.MethodPost, "/api/agents/" + existing.ID + "/disable", nil, map[string]int{"viewer": 403, "admin": 403, "other": 404, "board": 200}},
	}
	for _, tc := range cases {
		for _, name := range sectionMatrixOrder {
			before := e.digests()
			status, body := e.call(who[name], tc.method, tc.path, tc.body)
			if status != tc.want[name] {
				t.Errorf("%s as %s: %d %v, want %d", tc.name, name, status, body, tc.want[name])
			}
			if status >= 400 && e.digests() != before {
				t.Errorf("%s as %s: a refused call changed the data", tc.name, name)
			}
		}
	}
	for _, action := range []string{"agent.create.denied", "agent.disable.denied"} {
		if n := e.count(`SELECT count(*) FROM audit_events WHERE company_id = $1 AND action = $2`, r.A.ID, action); n != 2 {
			t.Errorf("%s events = %d, want 2 (viewer and admin)", action, n)
		}
	}

	// The created agent has the documented shape.
	_, body := e.call(r.Viewer, http.MethodGet, "/api/companies/"+r.A.ID+"/agents", nil)
	items, _ := body["items"].([]any)
	if len(items) != 2 {
		t.Fatalf("agents = %v, want ci and deploy-bot", body)
	}
	ci := items[0].(map[string]any)
	if ci["name"] != "ci" || ci["description"] != "Runs the checks" || ci["disabled"] != false || ci["company_id"] != r.A.ID || ci["id"] == "" || ci["created_at"] == "" || len(ci) != 6 {
		t.Errorf("agent object = %v", ci)
	}
	if items[1].(map[string]any)["disabled"] != true {
		t.Errorf("the disabled agent = %v", items[1])
	}

	// Another company's agent is a 404 for reading and for disabling, and stays as it was.
	theirs := e.agentIn(r.B.ID, "their-bot")
	before := e.digests()
	if status, _ := e.call(r.Board, http.MethodGet, "/api/agents/"+theirs.ID, nil); status != 404 {
		t.Errorf("GET another company's agent = %d, want 404", status)
	}
	if status, _ := e.call(r.Board, http.MethodPost, "/api/agents/"+theirs.ID+"/disable", nil); status != 404 {
		t.Errorf("disable another company's agent = %d, want 404", status)
	}
	for _, id := range []string{"nope", "00000000-0000-0000-0000-000000000000"} {
		if status, _ := e.call(r.Admin, http.MethodGet, "/api/agents/"+id, nil); status != 404 {
			t.Errorf("GET /api/agents/%s = %d, want 404", id, status)
		}
	}
	if e.digests() != before {
		t.Fatal("refused calls on another company's agent changed the data")
	}
}

func TestDisableAgentIdempotentAndRevokesTokens(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	ag := e.agentIn(r.A.ID, "deploy-bot")
	_, hash, err := db.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO api_tokens (token_hash, kind, agent_id) VALUES ($1, 'run', $2)`, hash, ag.ID); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		status, body := e.call(r.Board, http.MethodPost, "/api/agents/"+ag.ID+"/disable", nil)
		if status != 200 || body["disabled"] != true || body["id"] != ag.ID {
			t.Fatalf("disable #%d = %d %v", i+1, status, body)
		}
	}
	if status, _ := e.call(r.Board, http.MethodPost, "/api/agents/"+ag.ID+"/disable", map[string]any{}); status != 200 {
		t.Errorf("disable with {} = %d, want 200", status)
	}
	if status, code := e.rawAPI(r.Board, http.MethodPost, "/api/agents/"+ag.ID+"/disable", "text/plain", []byte("please")); status != 415 || code != "unsupported_media_type" {
		t.Errorf("disable with a text body = %d %s, want 415", status, code)
	}
	if status, _ := e.call(r.Board, http.MethodPost, "/api/agents/"+ag.ID+"/disable", map[string]any{"reason": "x"}); status != 400 {
		t.Errorf("disable with an unknown field = %d, want 400", status)
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE action = 'agent.disabled' AND target_id = $1`, ag.ID); n != 1 {
		t.Errorf("agent.disabled events = %d, want 1 however often it is disabled", n)
	}
	if n := e.count(`SELECT count(*) FROM api_tokens WHERE agent_id = $1 AND revoked_at IS NULL`, ag.ID); n != 0 {
		t.Error("disabling the agent left its token live")
	}
}

func TestCreateAgentRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	e.agentIn(r.A.ID, "deploy-bot")
	path := "/api/companies/" + r.A.ID + "/agents"
	cases := []struct {
		name   string
		body   any
		status int
		code   string
		field  string
	}{
		{"empty name", map[string]any{"name": " "}, 422, "validation_failed", "name"},
		{"long name", map[string]any{"name": strings.Repeat("a", 101)}, 422, "validation_failed", "name"},
		{"long description", map[string]any{"name": "ok", "description": strings.Repeat("d", 2001)}, 422, "validation_failed", "description"},
		{"taken name", map[string]any{"name": "deploy-bot"}, 409, "agent_name_taken", "name"},
		{"unknown field", map[string]any{"name": "ok", "password": "x"}, 400, "bad_json", ""},
		{"company_id", map[string]any{"name": "ok", "company_id": r.B.ID}, 400, "bad_json", ""},
		{"disabled", map[string]any{"name": "ok", "disabled": true}, 400, "bad_json", ""},
		{"empty body", "", 400, "empty_body", ""},
	}
	before := e.digests()
	for _, tc := range cases {
		status, body := e.call(r.Board, http.MethodPost, path, tc.body)
		if status != tc.status || apiErrCode(body) != tc.code {
			t.Errorf("%s: %d %v, want %d %s", tc.name, status, body, tc.status, tc.code)
		}
		if tc.field != "" && apiFieldErr(body, tc.field) == "" {
			t.Errorf("%s: no message for %s: %v", tc.name, tc.field, body)
		}
	}
	if status, code := e.rawAPI(r.Board, http.MethodPost, path, "text/plain", []byte(`{"name":"ok"}`)); status != 415 || code != "unsupported_media_type" {
		t.Errorf("text/plain = %d %s, want 415", status, code)
	}
	big := []byte(`{"name":"ok","description":"` + strings.Repeat("d", 1<<20) + `"}`)
	if status, code := e.rawAPI(r.Board, http.MethodPost, path, "application/json", big); status != 413 || code != "body_too_large" {
		t.Errorf("large body = %d %s, want 413", status, code)
	}
	if e.digests() != before {
		t.Fatal("refused creates changed the data")
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE action = 'agent.created'`); n != 0 {
		t.Fatalf("refused creates wrote %d agent.created events", n)
	}
}

func TestAgentsPage(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	page := "/companies/" + r.A.ID + "/agents"
	board := e.browser(r.Board)

	if _, body := e.getPage(board, page, nil); !strings.Contains(body, "No agents yet") || !strings.Contains(body, "Create an agent") {
		t.Fatal("the empty agents page does not say what to do")
	}
	// Creating through the form: htmx gets the section; the name is escaped.
	resp, body := e.sendForm(board, page, url.Values{"name": {"<script>alert(1)</script>"}, "description": {"<b>bold</b>"}}, "agents-section")
	if resp.StatusCode != 200 || strings.Contains(body, "<html") {
		t.Fatalf("htmx create = %d, want the section", resp.StatusCode)
	}
	for _, b := range []string{body, func() string { _, b := e.getPage(e.browser(r.Viewer), page, nil); return b }()} {
		if strings.Contains(b, "<script>alert(1)</script>") || strings.Contains(b, "<b>bold</b>") ||
			!strings.Contains(b, "&lt;script&gt;alert(1)&lt;/script&gt;") || !strings.Contains(b, "&lt;b&gt;bold&lt;/b&gt;") {
			t.Fatal("an agent's name or description is not escaped")
		}
	}
	var id string
	if err := e.pool.QueryRow(context.Background(), `SELECT id FROM agents WHERE company_id = $1`, r.A.ID).Scan(&id); err != nil {
		t.Fatal(err)
	}

	// Viewers and the instance admin read without forms; another company gets 404.
	for _, a := range []actor{r.Viewer, r.Admin} {
		status, body := e.getPage(e.browser(a), page, nil)
		if status != 200 || strings.Contains(body, "Create an agent") || strings.Contains(body, "/disable") {
			t.Errorf("%s: agents page = %d, want the list without forms", a.User.Email, status)
		}
	}
	if status, _ := e.getPage(e.browser(r.Other), page, nil); status != 404 {
		t.Errorf("another company: agents page = %d, want 404", status)
	}

	// Refusals change nothing.
	before := e.digests()
	resp, body = e.sendForm(board, page, url.Values{"name": {"<script>alert(1)</script>"}}, "")
	if resp.StatusCode != 409 || !strings.Contains(body, "An agent with this name exists") {
		t.Fatalf("duplicate name form = %d, want 409 with the message", resp.StatusCode)
	}
	resp, body = e.sendForm(board, page, url.Values{"name": {""}}, "agents-section")
	if resp.StatusCode != 422 || !strings.Contains(body, "Enter a name.") {
		t.Fatalf("empty name form = %d, want 422 with the message", resp.StatusCode)
	}
	if resp, _ := e.sendForm(e.browser(r.Viewer), page+"/"+id+"/disable", nil, ""); resp.StatusCode != 403 {
		t.Errorf("viewer's disable form = %d, want 403", resp.StatusCode)
	}
	if resp, _ := e.sendForm(e.browser(r.Other), page+"/"+id+"/disable", nil, ""); resp.StatusCode != 404 {
		t.Errorf("another company's disable form = %d, want 404", resp.StatusCode)
	}
	if e.digests() != before {
		t.Fatal("refused forms changed the data")
	}
	theirs := e.agentIn(r.B.ID, "their-bot")
	before = e.digests()
	if resp, _ := e.sendForm(board, page+"/"+theirs.ID+"/disable", nil, ""); resp.StatusCode != 404 {
		t.Errorf("disable form for another company's agent = %d, want 404", resp.StatusCode)
	}
	if e.digests() != before {
		t.Fatal("a refused disable of another company's agent changed the data")
	}

	// Disabling without JavaScript redirects back; the page then shows it disabled.
	resp, _ = e.sendForm(board, page+"/"+id+"/disable", nil, "")
	if resp.StatusCode != 303 || resp.Header.Get("Location") != page {
		t.Fatalf("disable form = %d to %q, want 303 to the page", resp.StatusCode, resp.Header.Get("Location"))
	}
	if _, body := e.getPage(board, page, nil); !strings.Contains(body, "badge-err\">disabled") {
		t.Error("the agents page does not show the agent disabled")
	}
}
