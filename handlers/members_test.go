package handlers

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"berth/db"
)

func TestMembersAPIRoleMatrix(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	who := sectionActors(r)
	carol := e.user("carol@example.com", "correct horse battery", false)
	dave := e.user("dave@example.com", "correct horse battery", false)
	e.member(r.A.ID, dave.ID, "viewer")
	base := "/api/companies/" + r.A.ID + "/members"

	cases := []struct {
		name   string
		method string
		path   string
		body   any
		want   map[string]int
	}{
		{"list", http.MethodGet, base, nil, map[string]int{"viewer": 200, "admin": 200, "other": 404, "board": 200}},
		{"add", http.MethodPost, base, map[string]any{"email": carol.Email, "role": "viewer"},
			map[string]int{"viewer": 403, "admin": 403, "other": 404, "board": 201}},
		{"change role", http.MethodPatch, base + "/" + dave.ID, map[string]any{"role": "board"},
			map[string]int{"viewer": 403, "admin": 403, "other": 404, "board": 200}},
		{"remove", http.MethodDelete, base + "/" + carol.ID, nil,
			map[string]int{"viewer": 403, "admin": 403, "other": 404, "board": 204}},
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
	if n := e.count(`SELECT count(*) FROM memberships WHERE company_id = $1 AND user_id = $2 AND role = 'board'`, r.A.ID, dave.ID); n != 1 {
		t.Error("the board member's role change did not apply")
	}
	if n := e.count(`SELECT count(*) FROM memberships WHERE user_id = $1`, carol.ID); n != 0 {
		t.Error("the board member's removal did not apply")
	}
	for _, action := range []string{"membership.create.denied", "membership.update.denied", "membership.delete.denied"} {
		if n := e.count(`SELECT count(*) FROM audit_events WHERE company_id = $1 AND action = $2`, r.A.ID, action); n != 2 {
			t.Errorf("%s events = %d, want 2 (viewer and admin)", action, n)
		}
	}
	for _, action := range []string{"membership.created", "membership.updated", "membership.deleted"} {
		if n := e.count(`SELECT count(*) FROM audit_events WHERE company_id = $1 AND action = $2 AND actor_id = $3`, r.A.ID, action, r.Board.User.ID); n != 1 {
			t.Errorf("%s events = %d, want 1", action, n)
		}
	}

	// Another company's member, a missing user and a malformed id are the same 404.
	for _, id := range []string{r.Other.User.ID, "00000000-0000-0000-0000-000000000000", "nope"} {
		before := e.digests()
		if status, _ := e.call(r.Board, http.MethodPatch, base+"/"+id, map[string]any{"role": "viewer"}); status != 404 {
			t.Errorf("PATCH member %s = %d, want 404", id, status)
		}
		if status, _ := e.call(r.Board, http.MethodDelete, base+"/"+id, nil); status != 404 {
			t.Errorf("DELETE member %s = %d, want 404", id, status)
		}
		if e.digests() != before {
			t.Errorf("refused calls on member %s changed the data", id)
		}
	}
}

func TestMembersListShape(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	status, body := e.call(r.Viewer, http.MethodGet, "/api/companies/"+r.A.ID+"/members?limit=1", nil)
	items, _ := body["items"].([]any)
	if status != 200 || len(items) != 1 || body["next_cursor"] == "" {
		t.Fatalf("first page = %d %v", status, body)
	}
	first := items[0].(map[string]any)
	if first["email"] != "board@acme.test" || first["role"] != "board" || first["user_id"] != r.Board.User.ID || first["company_id"] != r.A.ID {
		t.Fatalf("first member = %v", first)
	}
	status, body = e.call(r.Viewer, http.MethodGet, "/api/companies/"+r.A.ID+"/members?limit=1&cursor="+url.QueryEscape(body["next_cursor"].(string)), nil)
	items, _ = body["items"].([]any)
	if status != 200 || len(items) != 1 || items[0].(map[string]any)["email"] != "viewer@acme.test" || body["next_cursor"] != "" {
		t.Fatalf("second page = %d %v", status, body)
	}
}

func TestAddMemberRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	e.user("carol@example.com", "correct horse battery", false)
	path := "/api/companies/" + r.A.ID + "/members"
	cases := []struct {
		name   string
		body   any
		status int
		code   string
		field  string
	}{
		{"unknown user", map[string]any{"email": "nobody@example.com", "role": "viewer"}, 422, "validation_failed", "email"},
		{"empty email", map[string]any{"email": "", "role": "viewer"}, 422, "validation_failed", "email"},
		{"bad role", map[string]any{"email": "carol@example.com", "role": "owner"}, 422, "validation_failed", "role"},
		{"missing role", map[string]any{"email": "carol@example.com"}, 422, "validation_failed", "role"},
		{"already a member", map[string]any{"email": "VIEWER@acme.test", "role": "board"}, 409, "already_member", "email"},
		{"unknown field", map[string]any{"email": "carol@example.com", "role": "viewer", "admin": true}, 400, "bad_json", ""},
		{"company_id in body", map[string]any{"email": "carol@example.com", "role": "viewer", "company_id": r.A.ID}, 400, "bad_json", ""},
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
		if tc.name == "unknown user" && !strings.Contains(apiFieldErr(body, "email"), "berth user add") {
			t.Errorf("unknown user: the message does not say how to create one: %q", apiFieldErr(body, "email"))
		}
	}
	if status, code := e.rawAPI(r.Board, http.MethodPost, path, "application/x-www-form-urlencoded", []byte("email=carol%40example.com&role=viewer")); status != 415 || code != "unsupported_media_type" {
		t.Errorf("form body = %d %s, want 415", status, code)
	}
	big := []byte(`{"email":"carol@example.com","role":"viewer","x":"` + strings.Repeat("x", 1<<20) + `"}`)
	if status, code := e.rawAPI(r.Board, http.MethodPost, path, "application/json", big); status != 413 || code != "body_too_large" {
		t.Errorf("large body = %d %s, want 413", status, code)
	}
	if status, body := e.call(r.Board, http.MethodPatch, path+"/"+r.Viewer.User.ID, map[string]any{"role": "admin"}); status != 422 || apiFieldErr(body, "role") == "" {
		t.Errorf("PATCH bad role = %d %v, want 422", status, body)
	}
	if status, body := e.call(r.Board, http.MethodPatch, path+"/"+r.Viewer.User.ID, map[string]any{"role": "board", "email": "x@y.z"}); status != 400 {
		t.Errorf("PATCH with an unknown field = %d %v, want 400", status, body)
	}
	if e.digests() != before {
		t.Fatal("refused calls changed the data")
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE action LIKE 'membership.%' AND action NOT LIKE '%.denied'`); n != 0 {
		t.Fatalf("refused calls wrote %d membership events", n)
	}
}

func TestLastBoardMember(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	path := "/api/companies/" + r.A.ID + "/members/"
	before := e.digests()
	if status, body := e.call(r.Board, http.MethodPatch, path+r.Board.User.ID, map[string]any{"role": "viewer"}); status != 409 || apiErrCode(body) != "last_board_member" {
		t.Fatalf("demoting the only board member = %d %v, want 409 last_board_member", status, body)
	}
	if status, body := e.call(r.Board, http.MethodDelete, path+r.Board.User.ID, nil); status != 409 || apiErrCode(body) != "last_board_member" {
		t.Fatalf("removing the only board member = %d %v, want 409 last_board_member", status, body)
	}
	if e.digests() != before {
		t.Fatal("refused last-board-member changes changed the data")
	}
	// Setting the role it already has is not a change: 200, nothing recorded.
	if status, _ := e.call(r.Board, http.MethodPatch, path+r.Board.User.ID, map[string]any{"role": "board"}); status != 200 {
		t.Fatalf("a no-op role change = %d, want 200", status)
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE action = 'membership.updated'`); n != 0 {
		t.Fatal("a no-op role change was audited")
	}

	// With two board members, one may step down; then the other is the last one.
	if status, _ := e.call(r.Board, http.MethodPatch, path+r.Viewer.User.ID, map[string]any{"role": "board"}); status != 200 {
		t.Fatal("promoting the viewer failed")
	}
	if status, _ := e.call(r.Board, http.MethodDelete, path+r.Board.User.ID, nil); status != 204 {
		t.Fatal("a board member could not leave while another remains")
	}
	if status, body := e.call(r.Viewer, http.MethodPatch, path+r.Viewer.User.ID, map[string]any{"role": "viewer"}); status != 409 || apiErrCode(body) != "last_board_member" {
		t.Fatalf("demoting the new last board member = %d %v", status, body)
	}
}

// TestLastBoardMemberConcurrent demotes both board members in two overlapping transactions: the
// second waits for the first's membership lock, then sees it is the last board member.
func TestLastBoardMemberConcurrent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	second := e.actorWith("second@acme.test", false, r.A.ID, "board")
	ctx := context.Background()

	tx1, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(ctx) //nolint:errcheck // no-op after commit
	if _, _, err := db.ChangeMemberRole(ctx, tx1, r.A.ID, r.Board.User.ID, "viewer"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- db.InTx(ctx, e.pool, func(tx pgx.Tx) error {
			_, _, err := db.ChangeMemberRole(ctx, tx, r.A.ID, second.User.ID, "viewer")
			return err
		})
	}()
	// The second transaction must be waiting on the lock the first holds.
	deadline := time.Now().Add(10 * time.Second)
	for e.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the second demotion did not wait for the first")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, db.ErrLastBoardMember) {
			t.Fatalf("second demotion: %v, want ErrLastBoardMember", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second demotion did not finish")
	}
	if boards := e.count(`SELECT count(*) FROM memberships WHERE company_id = $1 AND role = 'board'`, r.A.ID); boards != 1 {
		t.Fatalf("%d board members after concurrent demotions, want 1", boards)
	}
}

func TestMembersPage(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	e.user("carol@example.com", "correct horse battery", false)
	evil := e.user(`<script>alert(1)</script>@evil.test`, "correct horse battery", false)
	e.member(r.A.ID, evil.ID, "viewer")
	page := "/companies/" + r.A.ID + "/members"
	board := e.browser(r.Board)

	status, body := e.getPage(board, page, nil)
	if status != 200 || !strings.Contains(body, "Add a member") || !strings.Contains(body, `data-confirm="Remove viewer@acme.test from this company?"`) {
		t.Fatalf("board member's members page = %d, want the add and remove forms", status)
	}
	if strings.Contains(body, "<script>alert(1)</script>") || !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;@evil.test") {
		t.Fatal("a member's email is not escaped")
	}
	for _, a := range []actor{r.Viewer, r.Admin} {
		status, body := e.getPage(e.browser(a), page, nil)
		if status != 200 || !strings.Contains(body, "viewer@acme.test") || strings.Contains(body, "Add a member") || strings.Contains(body, "/remove") {
			t.Errorf("%s: members page = %d, want the list without forms", a.User.Email, status)
		}
	}
	if status, _ := e.getPage(e.browser(r.Other), page, nil); status != 404 {
		t.Errorf("another company's member: members page = %d, want 404", status)
	}

	// Adding through the form: htmx gets the refreshed section.
	resp, body := e.sendForm(board, page, url.Values{"email": {"Carol@Example.com"}, "role": {"viewer"}}, "members-section")
	if resp.StatusCode != 200 || !strings.Contains(body, "carol@example.com") || strings.Contains(body, "<html") {
		t.Fatalf("htmx add = %d, want the section with carol", resp.StatusCode)
	}
	// A refused add comes back with its message and status, and changes nothing.
	before := e.digests()
	resp, body = e.sendForm(board, page, url.Values{"email": {"nobody@example.com"}, "role": {"viewer"}}, "")
	if resp.StatusCode != 422 || !strings.Contains(body, "berth user add --email nobody@example.com") || !strings.Contains(body, `value="nobody@example.com"`) {
		t.Fatalf("unknown email form = %d, want 422 with the message", resp.StatusCode)
	}
	resp, body = e.sendForm(board, page+"/"+r.Board.User.ID+"/remove", nil, "members-section")
	if resp.StatusCode != 409 || !strings.Contains(body, "at least one board member") {
		t.Fatalf("removing the last board member by form = %d, want 409 with the message", resp.StatusCode)
	}
	// Refusals by role and by company.
	if resp, _ := e.sendForm(e.browser(r.Viewer), page, url.Values{"email": {"carol@example.com"}, "role": {"board"}}, ""); resp.StatusCode != 403 {
		t.Errorf("viewer's add form = %d, want 403", resp.StatusCode)
	}
	if resp, _ := e.sendForm(e.browser(r.Other), page+"/"+r.Viewer.User.ID+"/remove", nil, ""); resp.StatusCode != 404 {
		t.Errorf("another company's member's remove form = %d, want 404", resp.StatusCode)
	}
	if resp, _ := e.sendForm(board, page+"/"+r.Other.User.ID+"/role", url.Values{"role": {"board"}}, ""); resp.StatusCode != 404 {
		t.Errorf("role form for another company's member = %d, want 404", resp.StatusCode)
	}
	if e.digests() != before {
		t.Fatal("refused forms changed the data")
	}

	// Changing a role without JavaScript redirects back to the page.
	resp, _ = e.sendForm(board, page+"/"+r.Viewer.User.ID+"/role", url.Values{"role": {"board"}}, "")
	if resp.StatusCode != 303 || resp.Header.Get("Location") != page {
		t.Fatalf("role form = %d to %q, want 303 to the page", resp.StatusCode, resp.Header.Get("Location"))
	}
	// A board member who removes themselves leaves for the dashboard.
	resp, _ = e.sendForm(board, page+"/"+r.Board.User.ID+"/remove", nil, "members-section")
	if resp.StatusCode != 200 || resp.Header.Get("HX-Redirect") != "/" {
		t.Fatalf("self-removal = %d, HX-Redirect %q, want the dashboard", resp.StatusCode, resp.Header.Get("HX-Redirect"))
	}
	if status, _ := e.getPage(board, page, nil); status != 404 {
		t.Fatalf("members page after leaving = %d, want 404", status)
	}
}
