package handlers

import (
	"net/http"
	"testing"
)

// TestStateChangesRefuseGET (catalog #37): a state-changing route reached with GET or HEAD is
// refused (405 from the method pattern, or the catch-all 404) and changes nothing: GET /logout
// leaves the session signed in, a GET on a run's cancel route cancels nothing. The same routes
// with their own method are reached (the negative control).
func TestStateChangesRefuseGET(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	browser := e.browser(r.Board)
	for _, m := range []string{http.MethodGet, http.MethodHead} {
		req, _ := http.NewRequest(m, e.ts.URL+"/logout", nil)
		resp, err := browser.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed && resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s /logout = %d, want 405 or 404", m, resp.StatusCode)
		}
	}
	resp, err := browser.Get(e.ts.URL + "/api/me")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after GET /logout the session is gone: /api/me = %d", resp.StatusCode)
	}
	cancel := "/api/runs/00000000-0000-0000-0000-000000000000/cancel"
	for _, m := range []string{http.MethodGet, http.MethodHead} {
		code, _ := e.call(r.Admin, m, cancel, nil)
		if code != http.StatusMethodNotAllowed && code != http.StatusNotFound {
			t.Errorf("%s %s = %d, want 405 or 404", m, cancel, code)
		}
	}
	// Negative control: POST reaches the handler, which knows no such run.
	if code, out := e.call(r.Admin, http.MethodPost, cancel, nil); code != http.StatusNotFound || out["error"] == nil {
		t.Fatalf("POST %s = %d %v, want the handler's 404", cancel, code, out)
	}
	req, _ := http.NewRequest(http.MethodPost, e.ts.URL+"/logout", nil)
	req.Header.Set("Origin", e.ts.URL)
	resp, err = browser.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp, err = browser.Get(e.ts.URL + "/api/me"); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("after POST /logout: /api/me = %d, want 401", resp.StatusCode)
	}
}
