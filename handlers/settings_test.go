package handlers

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"berth/db"
)

// TestSettingsPassword: a wrong current password is refused in place (422, audited, nothing
// changed); a valid change replaces the password, ends the user's other sessions and keeps this
// one (under a new token).
func TestSettingsPassword(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	here, there := e.browser(r.Board), e.browser(r.Board)
	if n := e.count(`SELECT count(*) FROM sessions WHERE user_id = $1`, r.Board.User.ID); n != 2 {
		t.Fatalf("the store recorded %d sessions of the user, want 2", n)
	}
	hash := func() string {
		var h string
		if err := e.pool.QueryRow(t.Context(), `SELECT password_hash FROM users WHERE id = $1`, r.Board.User.ID).Scan(&h); err != nil {
			t.Fatal(err)
		}
		return h
	}
	old := hash()
	for name, form := range map[string]url.Values{
		"wrong current": {"current_password": {"not it at all"}, "new_password": {"a brand new password"}, "confirm_password": {"a brand new password"}},
		"too short":     {"current_password": {"correct horse battery"}, "new_password": {"short"}, "confirm_password": {"short"}},
		"mismatch":      {"current_password": {"correct horse battery"}, "new_password": {"a brand new password"}, "confirm_password": {"another new password"}},
	} {
		resp, body := e.sendForm(here, "/settings/password", form, "")
		if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, `class="field-error"`) {
			t.Errorf("%s: %d, want 422 with a field error", name, resp.StatusCode)
		}
		if hash() != old {
			t.Fatalf("%s: the password changed", name)
		}
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE action = 'user.password_change.denied' AND actor_id = $1`, r.Board.User.ID); n != 1 {
		t.Errorf("wrong current password audited %d times, want 1", n)
	}
	resp, _ := e.sendForm(here, "/settings/password", url.Values{"current_password": {"correct horse battery"},
		"new_password": {"a brand new password"}, "confirm_password": {"a brand new password"}}, "")
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(resp.Header.Get("Location"), "flash=password_changed") {
		t.Fatalf("change = %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if err := db.CheckPassword(hash(), "a brand new password"); err != nil {
		t.Fatalf("the new password does not check: %v", err)
	}
	if code, _ := e.getPage(here, "/settings", nil); code != 200 {
		t.Errorf("this session after the change: /settings = %d, want 200", code)
	}
	if code, _ := e.getPage(there, "/settings", nil); code != http.StatusSeeOther {
		t.Errorf("the other session after the change: /settings = %d, want the sign-in redirect", code)
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE action = 'user.password_changed' AND actor_id = $1`, r.Board.User.ID); n != 1 {
		t.Errorf("password change audited %d times", n)
	}
}

// TestSettingsSessions: the page lists the user's sessions (this one marked) and never another
// user's; "sign out other sessions" ends the others and keeps this one.
func TestSettingsSessions(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	here, there := e.browser(r.Board), e.browser(r.Board)
	stranger := e.browser(r.Viewer)
	code, body := e.getPage(here, "/settings", nil)
	if code != 200 || strings.Count(body, "this session") != 1 || strings.Count(body, "<tr>") < 2 {
		t.Fatalf("settings = %d; sessions listed:\n%s", code, body)
	}
	if n := strings.Count(body[strings.Index(body, `id="session-list"`):], "<tr>"); n != 3 { // header + 2 sessions
		t.Errorf("session table has %d rows, want a header and the user's 2 sessions", n)
	}
	resp, _ := e.sendForm(here, "/settings/sessions/sign-out-others", url.Values{}, "")
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign out others = %d", resp.StatusCode)
	}
	if code, _ := e.getPage(there, "/settings", nil); code != http.StatusSeeOther {
		t.Errorf("the other session = %d, want signed out", code)
	}
	if code, _ := e.getPage(here, "/settings", nil); code != 200 {
		t.Errorf("this session = %d, want kept", code)
	}
	if code, _ := e.getPage(stranger, "/settings", nil); code != 200 {
		t.Errorf("another user's session = %d, want untouched", code)
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE action = 'user.sessions_revoked' AND actor_id = $1`, r.Board.User.ID); n != 1 {
		t.Errorf("sign out others audited %d times", n)
	}
}

// TestSettingsTokens: a token made on the page is shown once, works on the API and is listed
// without its value; revoking it stops it at once; another user's token cannot be revoked (404,
// nothing changed); the API routes do the same and refuse run tokens.
func TestSettingsTokens(t *testing.T) {
	t.Parallel()
	w := newRunTokenWorld(t)
	e, r := w.e, w.r
	c := e.browser(r.Board)
	for name, form := range map[string]url.Values{"no name": {"name": {""}, "expires": {"90"}}, "odd expiry": {"name": {"x"}, "expires": {"7"}}} {
		resp, _ := e.sendForm(c, "/settings/tokens", form, "")
		if resp.StatusCode != http.StatusUnprocessableEntity {
			t.Errorf("%s: %d, want 422", name, resp.StatusCode)
		}
	}
	before := e.count(`SELECT count(*) FROM api_tokens WHERE user_id = $1`, r.Board.User.ID)
	resp, body := e.sendForm(c, "/settings/tokens", url.Values{"name": {"CI <script>"}, "expires": {"30"}}, "")
	if resp.StatusCode != 200 {
		t.Fatalf("create token = %d", resp.StatusCode)
	}
	m := regexp.MustCompile(`id="new-token-value">([^<]+)<`).FindStringSubmatch(body)
	if m == nil || strings.Contains(body, "CI <script>") {
		t.Fatalf("the new token is not shown (or its name is not escaped):\n%s", body)
	}
	token := m[1]
	if n := e.count(`SELECT count(*) FROM api_tokens WHERE user_id = $1`, r.Board.User.ID); n != before+1 {
		t.Fatalf("tokens %d → %d", before, n)
	}
	if code, me := e.call(actor{Token: token}, http.MethodGet, "/api/me", nil); code != 200 || me["email"] != r.Board.User.Email {
		t.Fatalf("the new token on /api/me = %d %v", code, me)
	}
	if _, again := e.getPage(c, "/settings", nil); strings.Contains(again, token) {
		t.Fatal("the token is shown again after its creation")
	}
	var id string
	if err := e.pool.QueryRow(t.Context(), `SELECT id FROM api_tokens WHERE user_id = $1 AND name = 'CI <script>'`, r.Board.User.ID).Scan(&id); err != nil {
		t.Fatal(err)
	}
	// Someone else's token: the same 404 as a missing one, nothing revoked.
	other := e.browser(r.Viewer)
	if resp, _ := e.sendForm(other, "/settings/tokens/"+id+"/revoke", url.Values{}, ""); resp.StatusCode != http.StatusNotFound {
		t.Errorf("another user revoking = %d, want 404", resp.StatusCode)
	}
	if code, _ := e.call(r.Viewer, http.MethodPost, "/api/me/tokens/"+id+"/revoke", nil); code != http.StatusNotFound {
		t.Errorf("another user revoking by API = %d, want 404", code)
	}
	if code, _ := e.call(actor{Token: token}, http.MethodGet, "/api/me", nil); code != 200 {
		t.Fatal("a refused revoke stopped the token")
	}
	if resp, _ := e.sendForm(c, "/settings/tokens/"+id+"/revoke", url.Values{}, ""); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("revoke = %d", resp.StatusCode)
	}
	if code, _ := e.call(actor{Token: token}, http.MethodGet, "/api/me", nil); code != http.StatusUnauthorized {
		t.Errorf("a revoked token = %d, want 401", code)
	}
	for _, action := range []string{"api_token.created", "api_token.revoked"} {
		if n := e.count(`SELECT count(*) FROM audit_events WHERE action = $1 AND actor_id = $2`, action, r.Board.User.ID); n != 1 {
			t.Errorf("%s audited %d times", action, n)
		}
	}

	// The API: create (201, shown once), list (no values), revoke; run tokens are refused.
	code, made := e.call(r.Board, http.MethodPost, "/api/me/tokens", map[string]any{"name": "script", "expires_in_days": 0})
	if code != http.StatusCreated || made["token"] == nil || made["expires_at"] != nil {
		t.Fatalf("API create = %d %v", code, made)
	}
	code, list := e.call(r.Board, http.MethodGet, "/api/me/tokens", nil)
	if code != 200 || strings.Contains(strings.Join(func() []string {
		var s []string
		for _, it := range list["items"].([]any) {
			for k := range it.(map[string]any) {
				s = append(s, k)
			}
		}
		return s
	}(), ","), "token") {
		t.Fatalf("API list = %d %v", code, list)
	}
	if code, _ := e.call(w.Run2, http.MethodGet, "/api/me/tokens", nil); code != http.StatusForbidden {
		t.Errorf("a run token listing tokens = %d, want 403", code)
	}
	if code, _ := e.call(w.Run2, http.MethodPost, "/api/me/tokens", map[string]any{"name": "x"}); code != http.StatusForbidden {
		t.Errorf("a run token creating a token = %d, want 403", code)
	}
	if code, out := e.call(r.Board, http.MethodPost, "/api/me/tokens/"+made["id"].(string)+"/revoke", nil); code != 200 || out["revoked_at"] == nil {
		t.Errorf("API revoke = %d %v", code, out)
	}
}
