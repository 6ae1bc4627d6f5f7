package handlers

import (
	"context"
	"encoding/json"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
)

// holdPool takes every connection of the pool until the returned release is called.
func holdPool(t *testing.T, pool *pgxpool.Pool) (release func()) {
	t.Helper()
	var held []*pgxpool.Conn
	for range int(pool.Config().MaxConns) {
		c, err := pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	released := false
	release = func() {
		if !released {
			released = true
			for _, c := range held {
				c.Release()
			}
		}
	}
	t.Cleanup(release)
	return release
}

func healthStatus(t *testing.T, e *testEnv, headers map[string]string) (int, map[string]any) {
	t.Helper()
	resp := e.do(http.DefaultClient, http.MethodGet, "/api/health", nil, headers)
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

// TestPoolExhausted is F10: with every pooled connection held by long transactions, an API call
// and a page each answer 503 database_busy (with Retry-After) once the acquire deadline passed,
// /api/health still answers 200 over its own connection (with a session cookie too: it is
// answered before the session is loaded), and everything recovers once the connections are
// back, without leaking the waiting goroutines.
func TestPoolExhausted(t *testing.T) {
	t.Parallel()
	e := setup(t)
	u := e.user("busy@example.com", "a long password", false)
	tok := e.token(u.ID)
	c := e.client()
	if resp := e.login(c, "busy@example.com", "a long password"); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login = %d", resp.StatusCode)
	}
	bearer := map[string]string{"Authorization": "Bearer " + tok}
	if resp := e.do(http.DefaultClient, http.MethodGet, "/api/me", nil, bearer); resp.StatusCode != http.StatusOK {
		t.Fatalf("/api/me before = %d", resp.StatusCode)
	}

	release := holdPool(t, e.pool)
	began := time.Now()
	resp := e.do(http.DefaultClient, http.MethodGet, "/api/me", nil, bearer)
	waited := time.Since(began)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("/api/me with the pool exhausted = %d (Retry-After %q): %s", resp.StatusCode, resp.Header.Get("Retry-After"), readBody(t, resp))
	}
	if code, _ := decodeError(t, resp); code != "database_busy" {
		t.Fatalf("error code = %s, want database_busy", code)
	}
	if waited < db.AcquireTimeout/2 {
		t.Fatalf("answered after %s, before the acquire deadline", waited)
	}

	page := e.do(c, http.MethodGet, "/", nil, nil)
	body := readBody(t, page)
	if page.StatusCode != http.StatusServiceUnavailable || !strings.Contains(page.Header.Get("Content-Type"), "text/html") ||
		!strings.Contains(body, "database connection stayed busy") || page.Header.Get("Retry-After") == "" {
		t.Fatalf("page with the pool exhausted = %d %s: %.300s", page.StatusCode, page.Header.Get("Content-Type"), body)
	}

	for _, h := range []map[string]string{nil, {"Cookie": sessionCookieHeader(t, c, e)}} {
		// The health check's own deadline (healthTimeout, under 1 s) is far below the acquire
		// deadline: a 200 here proves it did not wait for the pool.
		if code, b := healthStatus(t, e, h); code != http.StatusOK || b["status"] != "ok" {
			t.Fatalf("health with the pool exhausted (headers %v) = %d %v", h, code, b)
		}
	}

	release()
	if resp := e.do(http.DefaultClient, http.MethodGet, "/api/me", nil, bearer); resp.StatusCode != http.StatusOK {
		t.Fatalf("/api/me after the release = %d", resp.StatusCode)
	}
	if page := e.do(c, http.MethodGet, "/", nil, nil); page.StatusCode != http.StatusOK {
		t.Fatalf("page after the release = %d", page.StatusCode)
	}
	// No request is left waiting for a connection (other tests of the package run in parallel,
	// so the process's goroutine count says nothing; the waiters' stacks do).
	deadline := time.Now().Add(10 * time.Second)
	for acquireWaiters() > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := acquireWaiters(); n > 0 {
		t.Fatalf("%d goroutines still wait in a pool acquire after the release", n)
	}
	if st := e.pool.Stat(); st.AcquiredConns() != 0 {
		t.Fatalf("%d connections still acquired after the release", st.AcquiredConns())
	}
}

// acquireWaiters counts the goroutines blocked in a pgxpool acquire.
func acquireWaiters() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "pgxpool.(*Pool).Acquire") && strings.Contains(g, "puddle") {
			n++
		}
	}
	return n
}

// sessionCookieHeader is the Cookie header the client would send to the server.
func sessionCookieHeader(t *testing.T, c *http.Client, e *testEnv) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.ts.URL+"/", nil)
	var parts []string
	for _, ck := range c.Jar.Cookies(req.URL) {
		parts = append(parts, ck.Name+"="+ck.Value)
	}
	if len(parts) == 0 {
		t.Fatal("no session cookie")
	}
	return strings.Join(parts, "; ")
}

// TestDatabaseUnavailable: a server whose database does not answer (nothing listens on its
// socket) answers every API call 503 database_unavailable with Retry-After, pages with a 503
// page, never 500, and reports degraded health.
func TestDatabaseUnavailable(t *testing.T) {
	t.Parallel()
	live := setup(t)
	u := live.user("down@example.com", "a long password", false)
	tok := live.token(u.ID)

	e := setup(t, func(d *Deps) {
		cfg := d.Pool.Config().Copy()
		cfg.ConnConfig.Host, cfg.ConnConfig.Port = "/nonexistent-berth-socket-dir", 5432
		dead, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(dead.Close)
		d.Pool = dead
	})
	bearer := map[string]string{"Authorization": "Bearer " + tok, "Content-Type": "application/json"}
	for _, rq := range []struct{ method, path, body string }{
		{http.MethodGet, "/api/me", ""},
		{http.MethodGet, "/api/companies", ""},
		{http.MethodPost, "/api/companies", `{"name":"X","slug":"x"}`},
	} {
		resp := e.do(http.DefaultClient, rq.method, rq.path, strings.NewReader(rq.body), bearer)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "5" {
			t.Fatalf("%s %s = %d (Retry-After %q): %s", rq.method, rq.path, resp.StatusCode, resp.Header.Get("Retry-After"), readBody(t, resp))
		}
		if code, _ := decodeError(t, resp); code != "database_unavailable" {
			t.Fatalf("%s %s: code %s", rq.method, rq.path, code)
		}
	}

	page := e.do(http.DefaultClient, http.MethodGet, "/", nil, map[string]string{"Cookie": "berth_session=someone-s-session"})
	body := readBody(t, page)
	if page.StatusCode != http.StatusServiceUnavailable || !strings.Contains(page.Header.Get("Content-Type"), "text/html") ||
		!strings.Contains(body, "database is not answering") {
		t.Fatalf("page with the database down = %d %s: %.300s", page.StatusCode, page.Header.Get("Content-Type"), body)
	}
	if code, b := healthStatus(t, e, nil); code != http.StatusServiceUnavailable || b["status"] != "degraded" {
		t.Fatalf("health with the database down = %d %v", code, b)
	}
	if code, b := healthStatus(t, live, nil); code != http.StatusOK || b["status"] != "ok" {
		t.Fatalf("health of the live server = %d %v", code, b)
	}
}
