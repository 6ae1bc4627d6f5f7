package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/db/dbtest"
	"berth/environment/seal"
	"berth/static"
	"berth/workspace/receipt"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// testEnv is one server on its own database, reachable over loopback.
type testEnv struct {
	t    testing.TB
	pool *pgxpool.Pool
	srv  *Server
	ts   *httptest.Server
}

// setup starts a server; opts may adjust its dependencies before it is built.
func setup(t testing.TB, opts ...func(*Deps)) *testEnv {
	t.Helper()
	pool := dbtest.New(t)
	assets, err := static.New()
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(nil)
	base, _ := url.Parse("http://" + ts.Listener.Addr().String())
	secret := bytes.Repeat([]byte{7}, 32)
	sealer, err := seal.New(secret)
	if err != nil {
		t.Fatal(err)
	}
	d := Deps{Pool: pool, Assets: assets, Secrets: sealer, ReceiptKey: receipt.DeriveKey(secret), SourceRoots: []string{os.TempDir(), "/var/tmp"}, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), BaseURL: base, Version: "test"}
	for _, o := range opts {
		o(&d)
	}
	srv, err := New(d)
	if err != nil {
		t.Fatal(err)
	}
	ts.Config.Handler = srv
	ts.Start()
	t.Cleanup(func() { ts.Close(); srv.Close() })
	return &testEnv{t: t, pool: pool, srv: srv, ts: ts}
}

// user creates a user with a password.
func (e *testEnv) user(email, password string, admin bool) db.User {
	e.t.Helper()
	hash, err := db.HashPassword(password)
	if err != nil {
		e.t.Fatal(err)
	}
	u, err := db.CreateUser(context.Background(), e.pool, email, hash, admin)
	if err != nil {
		e.t.Fatal(err)
	}
	return u
}

// client is a browser-like client: a cookie jar, no redirect following.
func (e *testEnv) client() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// do sends a request with same-origin browser headers unless headers override them.
func (e *testEnv) do(c *http.Client, method, path string, body io.Reader, headers map[string]string) *http.Response {
	e.t.Helper()
	req, err := http.NewRequest(method, e.ts.URL+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if method == http.MethodPost {
		req.Header.Set("Origin", e.ts.URL)
		req.Header.Set("Sec-Fetch-Site", "same-origin")
	}
	for k, v := range headers {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := c.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// login posts the sign-in form.
func (e *testEnv) login(c *http.Client, email, password string) *http.Response {
	e.t.Helper()
	form := url.Values{"email": {email}, "password": {password}}
	return e.do(c, http.MethodPost, "/login", strings.NewReader(form.Encode()),
		map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
}

func readBody(t testing.TB, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// count runs a count query.
func (e *testEnv) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func sessionCookie(resp *http.Response) *http.Cookie {
	for _, c := range resp.Cookies() {
		if strings.HasSuffix(c.Name, "berth_session") {
			return c
		}
	}
	return nil
}

// company creates a company.
func (e *testEnv) company(name, slug string) db.Company {
	e.t.Helper()
	c, err := db.CreateCompany(context.Background(), e.pool, name, slug)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// member gives a user a role in a company.
func (e *testEnv) member(companyID, userID, role string) {
	e.t.Helper()
	if err := db.PutMembership(context.Background(), e.pool, companyID, userID, role); err != nil {
		e.t.Fatal(err)
	}
}

// actor is a user with an API token, for API tests.
type actor struct {
	User  db.User
	Token string
}

// actorWith creates a user (instance admin or not) with a token and, when companyID is set, a role.
func (e *testEnv) actorWith(email string, admin bool, companyID, role string) actor {
	e.t.Helper()
	u := e.user(email, "correct horse battery", admin)
	if companyID != "" && role != "" {
		e.member(companyID, u.ID, role)
	}
	return actor{User: u, Token: e.token(u.ID)}
}

// roles is the standard cast for role-matrix tests: a board member, a viewer and an instance
// admin of company A, and a board member of company B.
type roles struct {
	A, B                        db.Company
	Board, Viewer, Admin, Other actor
}

func (e *testEnv) roles() roles {
	e.t.Helper()
	r := roles{A: e.company("Acme", "acme"), B: e.company("Beta", "beta")}
	r.Board = e.actorWith("board@acme.test", false, r.A.ID, "board")
	r.Viewer = e.actorWith("viewer@acme.test", false, r.A.ID, "viewer")
	r.Admin = e.actorWith("admin@instance.test", true, "", "")
	r.Other = e.actorWith("board@beta.test", false, r.B.ID, "board")
	return r
}

// call sends a JSON API request as a with an optional body (marshalled to JSON unless it is a
// string, sent as-is) and decodes the JSON response into a map (nil for an empty body).
func (e *testEnv) call(a actor, method, path string, body any) (int, map[string]any) {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		buf, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, e.ts.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if a.Token != "" {
		req.Header.Set("Authorization", "Bearer "+a.Token)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if len(bytes.TrimSpace(raw)) == 0 {
		return resp.StatusCode, nil
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		e.t.Fatalf("%s %s: response is not a JSON object: %s", method, path, raw)
	}
	return resp.StatusCode, out
}

// browser is a signed-in browser session for a (who must have the standard password).
func (e *testEnv) browser(a actor) *http.Client {
	e.t.Helper()
	c := e.client()
	if resp := e.login(c, a.User.Email, "correct horse battery"); resp.StatusCode != http.StatusSeeOther {
		e.t.Fatalf("browser login for %s = %d", a.User.Email, resp.StatusCode)
	}
	return c
}
