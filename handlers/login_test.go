package handlers

import (
	"context"
	"net/http"
	"strings"
	"testing"
)

func TestLoginLogout(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.user("ada@example.com", "correct horse battery", false)
	c := e.client()

	resp := e.do(c, http.MethodGet, "/login", nil, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(readBody(t, resp), `name="password"`) {
		t.Fatalf("GET /login = %d, want the form", resp.StatusCode)
	}

	resp = e.login(c, "ada@example.com", "wrong password!")
	body := readBody(t, resp)
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "Email or password is incorrect.") {
		t.Fatalf("bad password: status %d, body lacks the error", resp.StatusCode)
	}
	if sessionCookie(resp) != nil || e.count(`SELECT count(*) FROM sessions`) != 0 {
		t.Fatal("a failed sign-in created a session")
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE action = 'login.failed' AND details->>'reason' = 'bad_password'`); n != 1 {
		t.Fatalf("login.failed audit events = %d, want 1", n)
	}

	resp = e.login(c, " ADA@example.com ", "correct horse battery")
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Fatalf("good login: %d to %q, want 303 to /", resp.StatusCode, resp.Header.Get("Location"))
	}
	ck := sessionCookie(resp)
	if ck == nil || !ck.HttpOnly || ck.SameSite != http.SameSiteLaxMode || ck.Secure || ck.Name != "berth_session" {
		t.Fatalf("session cookie = %+v, want berth_session HttpOnly SameSite=Lax (not Secure over http)", ck)
	}

	resp = e.do(c, http.MethodGet, "/", nil, nil)
	if body := readBody(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, "ada@example.com") {
		t.Fatalf("dashboard after login = %d", resp.StatusCode)
	}

	resp = e.do(c, http.MethodPost, "/logout", nil, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" {
		t.Fatalf("logout = %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if n := e.count(`SELECT count(*) FROM sessions`); n != 0 {
		t.Fatalf("sessions after logout = %d, want 0", n)
	}
	// The old cookie, replayed by hand, no longer signs anyone in.
	replay := e.client()
	resp = e.do(replay, http.MethodGet, "/", nil, map[string]string{"Cookie": ck.Name + "=" + ck.Value})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" {
		t.Fatalf("replayed cookie after logout = %d, want a redirect to /login", resp.StatusCode)
	}
}

func TestLoginRenewsSessionToken(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.user("a@example.com", "password-a-123", false)
	e.user("b@example.com", "password-b-123", false)
	c := e.client()

	first := sessionCookie(e.login(c, "a@example.com", "password-a-123"))
	if first == nil {
		t.Fatal("no session cookie after login")
	}
	// Signing in again on the same browser (the fixation scenario: a known token before login)
	// must issue a new token and retire the old one.
	second := sessionCookie(e.login(c, "b@example.com", "password-b-123"))
	if second == nil || second.Value == first.Value {
		t.Fatal("login did not renew the session token")
	}
	if n := e.count(`SELECT count(*) FROM sessions WHERE token = $1`, first.Value); n != 0 {
		t.Fatal("the pre-login session token still exists")
	}
	resp := e.do(e.client(), http.MethodGet, "/api/me", nil, map[string]string{"Cookie": first.Name + "=" + first.Value})
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("old token after renewal: /api/me = %d, want 401", resp.StatusCode)
	}
}

func TestLoginRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.user("ada@example.com", "correct horse battery", false)
	disabled := e.user("gone@example.com", "correct horse battery", false)
	if _, err := e.pool.Exec(context.Background(), `UPDATE users SET disabled_at = now() WHERE id = $1`, disabled.ID); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, email, password string
		status                int
		reason                string
	}{
		{"unknown email", "nobody@example.com", "correct horse battery", http.StatusUnauthorized, "unknown_email"},
		{"disabled user", "gone@example.com", "correct horse battery", http.StatusUnauthorized, "disabled"},
		{"empty password", "ada@example.com", "", http.StatusBadRequest, ""},
		{"overlong email", strings.Repeat("a", 300) + "@example.com", "x", http.StatusBadRequest, ""},
	}
	for _, tc := range cases {
		resp := e.login(e.client(), tc.email, tc.password)
		if resp.StatusCode != tc.status || sessionCookie(resp) != nil {
			t.Errorf("%s: status %d (cookie %v), want %d and no session", tc.name, resp.StatusCode, sessionCookie(resp) != nil, tc.status)
		}
		if tc.reason != "" {
			if n := e.count(`SELECT count(*) FROM audit_events WHERE action = 'login.failed' AND details->>'reason' = $1`, tc.reason); n != 1 {
				t.Errorf("%s: audit events with reason %s = %d, want 1", tc.name, tc.reason, n)
			}
		}
	}
	if n := e.count(`SELECT count(*) FROM sessions`); n != 0 {
		t.Fatalf("refused logins left %d sessions", n)
	}
}

func TestPagesNeedSession(t *testing.T) {
	t.Parallel()
	e := setup(t)
	resp := e.do(e.client(), http.MethodGet, "/", nil, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" {
		t.Fatalf("GET / without session = %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	resp = e.do(e.client(), http.MethodGet, "/", nil, map[string]string{"HX-Request": "true"})
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("HX-Redirect") != "/login" {
		t.Fatalf("htmx GET / without session = %d, HX-Redirect %q", resp.StatusCode, resp.Header.Get("HX-Redirect"))
	}
}

func TestSecureCookieOverHTTPS(t *testing.T) {
	t.Parallel()
	e := setup(t, func(d *Deps) { d.BaseURL.Scheme = "https" })
	e.user("ada@example.com", "correct horse battery", false)
	// A non-browser POST (no Origin, no Sec-Fetch-Site) is not cross-site.
	resp := e.login(e.client(), "ada@example.com", "correct horse battery")
	ck := sessionCookie(resp)
	if ck == nil || ck.Name != "__Host-berth_session" || !ck.Secure || !ck.HttpOnly || ck.Path != "/" || ck.Domain != "" {
		t.Fatalf("https session cookie = %+v, want __Host-berth_session, Secure, HttpOnly, Path=/, no Domain", ck)
	}
	if hsts := resp.Header.Get("Strict-Transport-Security"); hsts == "" {
		t.Fatal("no HSTS header over https")
	}
}
