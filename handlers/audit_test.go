package handlers

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
)

// auditActions lists the actions of a page of GET …/audit-events.
func auditActions(body map[string]any) []string {
	items, _ := body["items"].([]any)
	var out []string
	for _, it := range items {
		out = append(out, it.(map[string]any)["action"].(string))
	}
	return out
}

// auditPages walks every page of an audit query and returns the events in order.
func (e *testEnv) auditPages(a actor, path string) []map[string]any {
	e.t.Helper()
	var all []map[string]any
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 50 {
			e.t.Fatal("audit pagination does not end")
		}
		p := path
		if cursor != "" {
			p += "&cursor=" + url.QueryEscape(cursor)
		}
		status, body := e.call(a, http.MethodGet, p, nil)
		if status != http.StatusOK {
			e.t.Fatalf("GET %s = %d %v", p, status, body)
		}
		items, _ := body["items"].([]any)
		for _, it := range items {
			all = append(all, it.(map[string]any))
		}
		cursor, _ = body["next_cursor"].(string)
		if cursor == "" {
			return all
		}
	}
}

func TestAuditAPIRoleMatrix(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	who := sectionActors(r)
	e.call(r.Board, http.MethodPost, "/api/companies/"+r.A.ID+"/agents", map[string]any{"name": "a-bot"})
	e.call(r.Other, http.MethodPost, "/api/companies/"+r.B.ID+"/agents", map[string]any{"name": "b-bot"})
	path := "/api/companies/" + r.A.ID + "/audit-events"
	for name, want := range map[string]int{"viewer": 200, "board": 200, "admin": 200, "other": 404} {
		status, body := e.call(who[name], http.MethodGet, path, nil)
		if status != want {
			t.Errorf("%s: GET audit-events = %d, want %d", name, status, want)
		}
		if want == 200 && fmt.Sprint(auditActions(body)) != "[agent.created]" {
			t.Errorf("%s: A's audit trail = %v, want only A's agent.created", name, auditActions(body))
		}
	}
	_, body := e.call(r.Viewer, http.MethodGet, path, nil)
	ev := body["items"].([]any)[0].(map[string]any)
	if ev["actor_id"] != r.Board.User.ID || ev["actor_label"] != "board@acme.test" || ev["actor_type"] != "user" ||
		ev["target_type"] != "agent" || ev["company_id"] != r.A.ID || ev["details"].(map[string]any)["name"] != "a-bot" {
		t.Errorf("event = %v", ev)
	}
	if at, _ := ev["at"].(string); !strings.HasSuffix(at, "Z") {
		t.Errorf("event time %q is not RFC 3339 UTC", at)
	}
	for _, q := range []string{"limit=0", "limit=500", "cursor=bad", "actor=" + strings.Repeat("a", 255)} {
		if status, _ := e.call(r.Board, http.MethodGet, path+"?"+q, nil); status != http.StatusBadRequest {
			t.Errorf("GET audit-events?%s = %d, want 400", q[:min(len(q), 20)], status)
		}
	}
}

func TestAuditFiltersAndPagination(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	agents := "/api/companies/" + r.A.ID + "/agents"
	var ids []string
	for i := range 7 {
		status, body := e.call(r.Board, http.MethodPost, agents, map[string]any{"name": fmt.Sprintf("bot-%d", i)})
		if status != http.StatusCreated {
			t.Fatalf("create agent = %d", status)
		}
		ids = append(ids, body["id"].(string))
	}
	e.call(r.Board, http.MethodPost, "/api/agents/"+ids[0]+"/disable", nil)
	e.call(r.Viewer, http.MethodPost, agents, map[string]any{"name": "nope"}) // denied, and audited
	carol := e.user("carol@example.com", "correct horse battery", false)
	e.call(r.Board, http.MethodPost, "/api/companies/"+r.A.ID+"/members", map[string]any{"email": "carol@example.com", "role": "viewer"})
	e.call(r.Other, http.MethodPost, "/api/companies/"+r.B.ID+"/agents", map[string]any{"name": "bot-0"}) // company B

	base := "/api/companies/" + r.A.ID + "/audit-events?limit=3"
	all := e.auditPages(r.Viewer, base)
	if len(all) != 10 {
		t.Fatalf("paged through %d events, want 10 (7 created, 1 disabled, 1 denied, 1 membership)", len(all))
	}
	seen := map[float64]bool{}
	for i, ev := range all {
		id := ev["id"].(float64)
		if seen[id] {
			t.Fatalf("event %v appears twice", id)
		}
		seen[id] = true
		if i > 0 {
			prev := all[i-1]
			if ev["at"].(string) > prev["at"].(string) || ev["at"] == prev["at"] && id > prev["id"].(float64) {
				t.Fatalf("events out of order at %d: %v after %v", i, ev, prev)
			}
		}
	}
	if all[0]["action"] != "membership.created" || all[len(all)-1]["target_id"] != ids[0] {
		t.Fatalf("newest %v, oldest %v", all[0]["action"], all[len(all)-1])
	}

	cases := []struct {
		query string
		want  int
	}{
		{"actor=board@acme.test", 9},
		{"actor=BOARD@ACME.TEST", 9},
		{"actor=" + r.Viewer.User.ID, 1},
		{"actor=nobody@acme.test", 0},
		{"action=agent.created", 7},
		{"action=agent.", 9},
		{"action=agent.*", 9},
		{"action=agent", 0},
		{"action=agent.create.denied", 1},
		{"action=membership.", 1},
		{"target=" + ids[0], 2},
		{"target=agent", 9},
		{"target=" + carol.ID, 1},
		{"actor=board@acme.test&action=agent.&target=" + ids[0], 2},
	}
	for _, tc := range cases {
		got := e.auditPages(r.Board, base+"&"+tc.query)
		if len(got) != tc.want {
			t.Errorf("%s: %d events, want %d", tc.query, len(got), tc.want)
		}
	}
}

func TestAuditPage(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	for i := range 4 {
		e.call(r.Board, http.MethodPost, "/api/companies/"+r.A.ID+"/agents", map[string]any{"name": fmt.Sprintf("bot-%d", i)})
	}
	e.call(r.Board, http.MethodPost, "/api/companies/"+r.A.ID+"/agents", map[string]any{"name": "<script>alert(1)</script>"})
	page := "/companies/" + r.A.ID + "/audit"

	status, body := e.getPage(e.browser(r.Viewer), page, nil)
	if status != 200 || !strings.Contains(body, `name="actor"`) || !strings.Contains(body, "agent.created") {
		t.Fatalf("audit page = %d, want the filter form and events", status)
	}
	if strings.Contains(body, "<script>alert(1)</script>") || !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Fatal("event details are not escaped")
	}
	if strings.Contains(body, `\u003c`) {
		t.Error("event details are shown JSON-escaped instead of readable")
	}
	for _, a := range []actor{r.Board, r.Admin} {
		if status, _ := e.getPage(e.browser(a), page, nil); status != 200 {
			t.Errorf("%s: audit page = %d, want 200", a.User.Email, status)
		}
	}
	if status, _ := e.getPage(e.browser(r.Other), page, nil); status != 404 {
		t.Errorf("another company: audit page = %d, want 404", status)
	}

	// Filters and the Next link keep each other; htmx aimed at the results gets the results only.
	board := e.browser(r.Board)
	_, body = e.getPage(board, page+"?action=agent.&limit=2", nil)
	if !strings.Contains(body, `value="agent."`) || strings.Count(body, "<tr>") != 3 {
		t.Fatalf("filtered page: the filter is not kept or the page is not 2 rows")
	}
	next := firstSubmatch(t, body, `href="(/companies/[^"]+cursor=[^"]+)"`)
	next = strings.ReplaceAll(next, "&amp;", "&")
	if !strings.Contains(next, "action=agent.") || !strings.Contains(next, "limit=2") {
		t.Fatalf("Next link %q drops the filters", next)
	}
	status, body = e.getPage(board, next, map[string]string{"HX-Request": "true", "HX-Target": "audit-view"})
	if status != 200 || strings.Contains(body, "<html") || !strings.Contains(body, `id="audit-view"`) ||
		!strings.Contains(body, `value="agent."`) || strings.Count(body, "<tr>") != 3 {
		t.Fatalf("htmx Next = %d, want the view fragment with the filter and 2 rows", status)
	}
	// A history restore asks for the whole page even though it comes from htmx.
	_, body = e.getPage(board, next, map[string]string{"HX-Request": "true", "HX-Target": "audit-view", "HX-History-Restore-Request": "true"})
	if !strings.Contains(body, "<html") {
		t.Fatal("a history restore got a fragment instead of the page")
	}
	_, body = e.getPage(board, page+"?actor=nobody", nil)
	if !strings.Contains(body, "No events match") {
		t.Error("an empty filtered result does not say so")
	}
}

// firstSubmatch returns the first submatch of pattern in s.
func firstSubmatch(t *testing.T, s, pattern string) string {
	t.Helper()
	m := regexp.MustCompile(pattern).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no match for %s", pattern)
	}
	return m[1]
}
