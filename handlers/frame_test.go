package handlers

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"berth/db"
)

func TestCrossSiteRefused(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.user("ada@example.com", "correct horse battery", false)
	c := e.client()
	if resp := e.login(c, "ada@example.com", "correct horse battery"); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login = %d", resp.StatusCode)
	}
	cases := []struct {
		name    string
		headers map[string]string
	}{
		{"sec-fetch-site cross-site", map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}},
		{"origin only", map[string]string{"Sec-Fetch-Site": "", "Origin": "https://evil.example"}},
		{"same-site sibling", map[string]string{"Sec-Fetch-Site": "same-site", "Origin": "http://sub.localhost"}},
	}
	for _, tc := range cases {
		resp := e.do(c, http.MethodPost, "/logout", nil, tc.headers)
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: POST /logout = %d, want 403", tc.name, resp.StatusCode)
		}
		resp = e.do(e.client(), http.MethodPost, "/login", strings.NewReader("email=ada%40example.com&password=correct+horse+battery"),
			mergeHeaders(tc.headers, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}))
		if resp.StatusCode != http.StatusForbidden || sessionCookie(resp) != nil {
			t.Errorf("%s: POST /login = %d, want 403 and no session", tc.name, resp.StatusCode)
		}
	}
	// The session survived every refused logout.
	if resp := e.do(c, http.MethodGet, "/api/me", nil, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("session after refused cross-site logouts: /api/me = %d", resp.StatusCode)
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE action = 'request.cross_origin_refused'`); n != 2*len(cases) {
		t.Fatalf("cross-origin audit events = %d, want %d", n, 2*len(cases))
	}
}

func mergeHeaders(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

var (
	inlineScript = regexp.MustCompile(`(?i)<script(\s[^>]*)?>`)
	styleAttr    = regexp.MustCompile(`(?i)\sstyle=`)
	handlerAttr  = regexp.MustCompile(`(?i)\son[a-z]+=`)
)

func TestSecurityHeadersAndNoInlineScript(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.user("ada@example.com", "correct horse battery", false)
	c := e.client()
	e.login(c, "ada@example.com", "correct horse battery")
	for _, path := range []string{"/login", "/", "/api/health", "/nope"} {
		resp := e.do(c, http.MethodGet, path, nil, nil)
		h := resp.Header
		csp := h.Get("Content-Security-Policy")
		if !strings.Contains(csp, "default-src 'self'") || strings.Contains(csp, "unsafe-inline") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("%s: CSP = %q", path, csp)
		}
		if h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Referrer-Policy") != "same-origin" || h.Get("X-Frame-Options") != "DENY" {
			t.Errorf("%s: headers %v", path, h)
		}
		body := readBody(t, resp)
		if !strings.HasPrefix(h.Get("Content-Type"), "text/html") {
			continue
		}
		for _, m := range inlineScript.FindAllString(body, -1) {
			if !strings.Contains(m, "src=") {
				t.Errorf("%s: inline script %q", path, m)
			}
		}
		if styleAttr.MatchString(body) || handlerAttr.MatchString(body) {
			t.Errorf("%s: inline style or event handler attribute in the page", path)
		}
	}
}

func TestStaticAssetsLinkedAndCached(t *testing.T) {
	t.Parallel()
	e := setup(t)
	body := readBody(t, e.do(e.client(), http.MethodGet, "/login", nil, nil))
	links := regexp.MustCompile(`(?:href|src)="(/static/[^"]+)"`).FindAllStringSubmatch(body, -1)
	if len(links) < 3 {
		t.Fatalf("login page links %d static files, want css, htmx and app js", len(links))
	}
	for _, l := range links {
		resp := e.do(e.client(), http.MethodGet, l[1], nil, nil)
		if resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Cache-Control"), "immutable") {
			t.Errorf("%s = %d, Cache-Control %q", l[1], resp.StatusCode, resp.Header.Get("Cache-Control"))
		}
	}
}

func TestErrorAdapter(t *testing.T) {
	t.Parallel()
	var logBuf bytes.Buffer
	e := setup(t, func(d *Deps) { d.Log = slog.New(slog.NewTextHandler(&logBuf, nil)) })
	secret := "password=hunter2 at /var/lib/berth/secret.key"
	cases := []struct {
		name    string
		err     error
		path    string
		accept  string
		status  int
		code    string
		leakOK  bool
		htmlHas string
	}{
		{"typed error keeps its code", &httpError{Status: 409, Code: "stale_revision", Message: "Reload and try again."}, "/api/x", "", 409, "stale_revision", false, ""},
		{"not found from db", fmt.Errorf("load task: %w", db.ErrNotFound), "/api/x", "", 404, "not_found", false, ""},
		{"conflict from db", fmt.Errorf("create: %w", db.ErrConflict), "/api/x", "", 409, "conflict", false, ""},
		{"unexpected error hides detail", errors.New(secret), "/api/x", "", 500, "internal", false, ""},
		{"html page for browsers", errors.New(secret), "/projects/x", "text/html", 500, "", false, "Something went wrong"},
		{"html 404", db.ErrNotFound, "/projects/x", "text/html", 404, "", false, "Not found."},
	}
	for _, tc := range cases {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, tc.path, nil)
		if tc.accept != "" {
			req.Header.Set("Accept", tc.accept)
		}
		e.srv.handle(func(http.ResponseWriter, *http.Request) error { return tc.err }).ServeHTTP(rec, req)
		if rec.Code != tc.status {
			t.Errorf("%s: status %d, want %d", tc.name, rec.Code, tc.status)
		}
		if strings.Contains(rec.Body.String(), "hunter2") || strings.Contains(rec.Body.String(), "/var/lib") {
			t.Errorf("%s: response leaks the error detail: %s", tc.name, rec.Body.String())
		}
		if tc.code != "" {
			resp := rec.Result()
			if code, _ := decodeError(t, resp); code != tc.code {
				t.Errorf("%s: code %q, want %q", tc.name, code, tc.code)
			}
		}
		if tc.htmlHas != "" && !strings.Contains(rec.Body.String(), tc.htmlHas) {
			t.Errorf("%s: HTML lacks %q", tc.name, tc.htmlHas)
		}
	}
	if !strings.Contains(logBuf.String(), "request failed") {
		t.Error("unexpected errors were not logged")
	}

	// A panic becomes a logged 500; the server keeps serving.
	rec := httptest.NewRecorder()
	e.srv.recoverPanics(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom " + secret) })).
		ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/x", nil))
	if rec.Code != http.StatusInternalServerError || strings.Contains(rec.Body.String(), "hunter2") {
		t.Fatalf("panic: %d %s", rec.Code, rec.Body.String())
	}
	resp := e.do(e.client(), http.MethodGet, "/api/nope", nil, nil)
	if code, _ := decodeError(t, resp); resp.StatusCode != 404 || code != "not_found" {
		t.Fatalf("unknown API route = %d %q", resp.StatusCode, code)
	}
}

func TestRequestLogHasNoSecrets(t *testing.T) {
	t.Parallel()
	var logBuf bytes.Buffer
	e := setup(t, func(d *Deps) { d.Log = slog.New(slog.NewTextHandler(&logBuf, nil)) })
	u := e.user("ada@example.com", "correct horse battery", false)
	tok := e.token(u.ID)
	c := e.client()
	e.login(c, "ada@example.com", "correct horse battery")
	e.do(c, http.MethodGet, "/api/me?secret=querysecret", nil, nil)
	e.do(e.client(), http.MethodGet, "/api/me", nil, map[string]string{"Authorization": "Bearer " + tok})
	log := logBuf.String()
	for _, s := range []string{"correct horse battery", tok, "querysecret", "berth_session="} {
		if strings.Contains(log, s) {
			t.Errorf("request log contains %q", s)
		}
	}
	if !strings.Contains(log, "path=/api/me") {
		t.Error("request log has no line for /api/me")
	}
}

func TestDecodeJSON(t *testing.T) {
	t.Parallel()
	type body struct {
		Name string `json:"name"`
	}
	cases := []struct {
		name, contentType, body string
		status                  int
	}{
		{"ok", "application/json", `{"name":"x"}`, 200},
		{"charset ok", "application/json; charset=utf-8", `{"name":"x"}`, 200},
		{"unknown field", "application/json", `{"name":"x","extra":1}`, 400},
		{"not json", "text/plain", `{"name":"x"}`, 415},
		{"form", "application/x-www-form-urlencoded", `name=x`, 415},
		{"two objects", "application/json", `{"name":"x"}{"name":"y"}`, 400},
		{"malformed", "application/json", `{"name":`, 400},
		{"too big", "application/json", `{"name":"` + strings.Repeat("x", maxJSONBody) + `"}`, 413},
		{"empty", "", ``, 400},
	}
	s := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, tc := range cases {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/api/x", strings.NewReader(tc.body))
		if tc.contentType != "" {
			req.Header.Set("Content-Type", tc.contentType)
		}
		s.handle(func(w http.ResponseWriter, r *http.Request) error {
			var b body
			if err := decodeJSON(w, r, &b); err != nil {
				return err
			}
			writeJSON(w, 200, b)
			return nil
		}).ServeHTTP(rec, req)
		if rec.Code != tc.status {
			t.Errorf("%s: status %d, want %d (%s)", tc.name, rec.Code, tc.status, rec.Body.String())
		}
	}
}
