package handlers

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"berth/db/dbtest"
	"berth/jobs"
)

// TestAdminJobsUI: the River UI answers instance admins only; members get a 404 and anonymous
// browsers go to the sign-in page.
func TestAdminJobsUI(t *testing.T) {
	t.Parallel()
	e := setup(t, func(d *Deps) {
		client, err := jobs.NewClient(jobs.Deps{Pool: d.Pool, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, jobs.ClientOptions{})
		if err != nil {
			t.Fatal(err)
		}
		d.Jobs = client
		if d.JobsUI, err = NewJobsUI(t.Context(), client, d.Log); err != nil {
			t.Fatal(err)
		}
	})
	r := e.roles()
	admin, board := e.browser(r.Admin), e.browser(r.Board)

	resp := e.do(admin, http.MethodGet, "/admin/jobs/", nil, nil)
	if body := readBody(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, "<title>River</title>") {
		t.Fatalf("admin: /admin/jobs/ = %d", resp.StatusCode)
	}
	resp = e.do(admin, http.MethodGet, "/admin/jobs/api/jobs?state=available&limit=5", nil, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("admin: jobs API = %d", resp.StatusCode)
	}
	for _, path := range []string{"/admin/jobs/", "/admin/jobs/api/jobs?state=available"} {
		if resp := e.do(board, http.MethodGet, path, nil, nil); resp.StatusCode != http.StatusNotFound {
			t.Errorf("board member: %s = %d, want 404", path, resp.StatusCode)
		}
		resp := e.do(e.client(), http.MethodGet, path, nil, nil)
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" {
			t.Errorf("anonymous: %s = %d, want a redirect to /login", path, resp.StatusCode)
		}
	}
}

// TestUnmanagedPage: instance admins see each node's latest report of unowned workspace
// directories (names only); members get a 404.
func TestUnmanagedPage(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO audit_events (actor_type, action, target_type, target_id, details, at) VALUES
		('system', 'workspace.unmanaged_reported', 'node', 'node-a', '{"unmanaged":["ws-old"],"unrecorded":[]}', now() - interval '1 hour'),
		('system', 'workspace.unmanaged_reported', 'node', 'node-a', '{"unmanaged":["stray-<dir>"],"unrecorded":["ws-0123456789abcdef0123456789abcdef"]}', now())`); err != nil {
		t.Fatal(err)
	}
	resp := e.do(e.browser(r.Admin), http.MethodGet, "/admin/workspaces", nil, nil)
	body := readBody(t, resp)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "stray-&lt;dir&gt;") || strings.Contains(body, "ws-old") ||
		!strings.Contains(body, "ws-0123456789abcdef0123456789abcdef") {
		t.Fatalf("admin page = %d:\n%s", resp.StatusCode, body)
	}
	if resp := e.do(e.browser(r.Board), http.MethodGet, "/admin/workspaces", nil, nil); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("board member = %d, want 404", resp.StatusCode)
	}
}

// TestJobsUIServicesRunWhileUsed: the River UI's background services are not running until the
// UI is asked for, run while it is used, stop after the idle time, and start again on the next
// request.
func TestJobsUIServicesRunWhileUsed(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	client, err := jobs.NewClient(jobs.Deps{Pool: pool, Log: slog.New(slog.DiscardHandler)}, jobs.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewJobsUI(t.Context(), client, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ui := h.(*jobsUI)
	ui.idle = 300 * time.Millisecond
	running := func() bool { ui.mu.Lock(); defer ui.mu.Unlock(); return ui.stop != nil }
	if running() {
		t.Fatal("the services run before anyone asked for the UI")
	}
	get := func() {
		rec := httptest.NewRecorder()
		ui.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, adminJobsPrefix+"/api/jobs?state=available&limit=1", nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("jobs API = %d", rec.Code)
		}
	}
	for round := range 2 {
		get()
		if !running() {
			t.Fatalf("round %d: a request did not start the services", round)
		}
		deadline := time.Now().Add(10 * time.Second)
		for running() && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if running() {
			t.Fatalf("round %d: the services still run after the idle time", round)
		}
		time.Sleep(100 * time.Millisecond) // let the stop finish before the next start
	}
}
