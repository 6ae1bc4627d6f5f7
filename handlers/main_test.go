package handlers

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/db/dbtest"
	"berth/static"
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
	d := Deps{Pool: pool, Assets: assets, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), BaseURL: base, Version: "test"}
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
