package handlers

import (
	"net/http"
	"strings"
	"testing"
)

func TestCookieOnlyPostNeedsOrigin(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a := e.actorWith("ada@example.com", true, "", "")
	c := e.client()
	if resp := e.login(c, "ada@example.com", "correct horse battery"); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login = %d", resp.StatusCode)
	}
	noHeaders := map[string]string{"Origin": "", "Sec-Fetch-Site": ""}

	// Cookie only, neither header: refused and audited, the session survives.
	resp := e.do(c, http.MethodPost, "/logout", nil, mergeHeaders(noHeaders, map[string]string{"Accept": "application/json"}))
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(readBody(t, resp), `"cross_origin"`) {
		t.Fatalf("cookie-only POST without Origin or Sec-Fetch-Site = %d, want 403 cross_origin", resp.StatusCode)
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE action = 'request.cross_origin_refused'`); n != 1 {
		t.Fatalf("cross-origin audit events = %d, want 1", n)
	}
	if resp := e.do(c, http.MethodGet, "/api/me", nil, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("session after the refused logout: /api/me = %d", resp.StatusCode)
	}

	// A bearer token with neither header is a script, not a browser: unaffected.
	if st, body := e.call(a, http.MethodPost, "/api/companies", map[string]any{"name": "Acme", "slug": "acme"}); st != http.StatusCreated {
		t.Fatalf("bearer POST without origin headers = %d %v, want 201", st, body)
	}
	// No cookie and no token: not cookie-authenticated, so the origin rule does not apply (the
	// handler's own authentication does).
	if resp := e.do(e.client(), http.MethodPost, "/api/companies", strings.NewReader(`{}`), noHeaders); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("anonymous POST = %d, want 401", resp.StatusCode)
	}

	// Either header alone, same-origin, is enough.
	for _, h := range []map[string]string{{"Origin": ""}, {"Sec-Fetch-Site": ""}} {
		c := e.client()
		e.login(c, "ada@example.com", "correct horse battery")
		if resp := e.do(c, http.MethodPost, "/logout", nil, h); resp.StatusCode != http.StatusSeeOther {
			t.Errorf("logout with %v removed = %d, want 303", h, resp.StatusCode)
		}
	}
}

func TestHostMustMatchBaseURL(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, port, _ := strings.Cut(e.srv.baseURL.Host, ":")
	get := func(host, path string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, e.ts.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := e.client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	cases := []struct {
		host, path string
		want       int
	}{
		{"127.0.0.1:" + port, "/login", http.StatusOK},
		{"localhost:" + port, "/login", http.StatusOK},
		{"[::1]:" + port, "/login", http.StatusOK},
		{"LOCALHOST:" + port, "/login", http.StatusOK},
		{"rebound.evil.example:" + port, "/login", http.StatusMisdirectedRequest},
		{"rebound.evil.example", "/api/me", http.StatusMisdirectedRequest},
		{"127.0.0.1.nip.io:" + port, "/login", http.StatusMisdirectedRequest},
		{"10.9.8.7:" + port, "/api/health", http.StatusOK}, // load balancers probe by address
	}
	for _, tc := range cases {
		resp := get(tc.host, tc.path)
		if resp.StatusCode != tc.want {
			t.Errorf("Host %s %s = %d, want %d", tc.host, tc.path, resp.StatusCode, tc.want)
		}
		if tc.want == http.StatusMisdirectedRequest && tc.path == "/api/me" && !strings.Contains(readBody(t, resp), "misdirected_request") {
			t.Errorf("Host %s: no misdirected_request code", tc.host)
		}
	}
}

func TestAllowedHosts(t *testing.T) {
	t.Parallel()
	cases := []struct {
		base    string
		in, out []string
	}{
		{"berth.example.com", []string{"berth.example.com", "Berth.Example.COM:443", "berth.example.com."}, []string{"127.0.0.1", "evil.example", "berth.example.com.evil.example", ""}},
		{"[::1]", []string{"localhost:8080", "127.0.0.1", "[::1]:8080"}, []string{"10.0.0.1:8080", "localhost.evil.example"}},
		{"10.0.0.5", []string{"10.0.0.5:8080"}, []string{"localhost", "10.0.0.6"}},
	}
	for _, tc := range cases {
		got := allowedHosts(tc.base)
		for _, h := range tc.in {
			if !got[requestHostname(h)] {
				t.Errorf("base %s: Host %q refused", tc.base, h)
			}
		}
		for _, h := range tc.out {
			if got[requestHostname(h)] {
				t.Errorf("base %s: Host %q allowed", tc.base, h)
			}
		}
	}
}
