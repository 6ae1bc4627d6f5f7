package handlers

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

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
