package handlers

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

const testMetricsToken = "metrics-token-0123456789abcdef"

// scrape reads GET /metrics with the given headers and returns the status, content type and body.
func (e *testEnv) scrape(c *http.Client, headers map[string]string) (int, string, string) {
	e.t.Helper()
	resp := e.do(c, http.MethodGet, "/metrics", nil, headers)
	return resp.StatusCode, resp.Header.Get("Content-Type"), readBody(e.t, resp)
}

// TestMetricsAccess: instance admins (session or API token) and the metrics token read the
// exposition; board members, run-less anonymous callers and wrong tokens get the same 404.
func TestMetricsAccess(t *testing.T) {
	t.Parallel()
	e := setup(t, func(d *Deps) { d.MetricsToken = testMetricsToken })
	r := e.roles()
	bearer := func(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }
	cases := []struct {
		name    string
		client  *http.Client
		headers map[string]string
		want    int
	}{
		{"admin session", e.browser(r.Admin), nil, http.StatusOK},
		{"admin API token", e.client(), bearer(r.Admin.Token), http.StatusOK},
		{"metrics token", e.client(), bearer(testMetricsToken), http.StatusOK},
		{"board session", e.browser(r.Board), nil, http.StatusNotFound},
		{"board API token", e.client(), bearer(r.Board.Token), http.StatusNotFound},
		{"no auth", e.client(), nil, http.StatusNotFound},
		{"wrong token", e.client(), bearer(testMetricsToken + "x"), http.StatusNotFound},
		{"token prefix", e.client(), bearer(testMetricsToken[:len(testMetricsToken)-1]), http.StatusNotFound},
		{"not a bearer", e.client(), map[string]string{"Authorization": "Basic " + testMetricsToken}, http.StatusNotFound},
		// A board member's session does not become an admin by adding a wrong bearer token.
		{"board session, wrong token", e.browser(r.Board), bearer("nope"), http.StatusNotFound},
	}
	for _, c := range cases {
		code, ctype, body := e.scrape(c.client, c.headers)
		if code != c.want {
			t.Errorf("%s: GET /metrics = %d, want %d", c.name, code, c.want)
			continue
		}
		if code == http.StatusOK {
			if !strings.HasPrefix(ctype, "text/plain") || !strings.Contains(body, "# TYPE berth_http_request_duration_seconds histogram") {
				t.Errorf("%s: content type %q, body %.200q", c.name, ctype, body)
			}
		} else if strings.Contains(body, "berth_") {
			t.Errorf("%s: a refusal shows metrics: %.200q", c.name, body)
		}
	}
}

// TestMetricsWithoutToken: with no BERTH_METRICS_TOKEN configured, no bearer value reads
// metrics, the empty one included.
func TestMetricsWithoutToken(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, h := range []string{"Bearer ", "Bearer  ", "Bearer " + testMetricsToken} {
		if code, _, _ := e.scrape(e.client(), map[string]string{"Authorization": h}); code != http.StatusNotFound {
			t.Errorf("Authorization %q: GET /metrics = %d, want 404", h, code)
		}
	}
}

// TestMetricsExposition: after one real run, every documented series is in the exposition, the
// database gauges count it, and request durations are labelled by route pattern, never by path.
func TestMetricsExposition(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	task := re.task(`echo metrics`)
	id := re.start(task.ID, nil)
	run := re.waitRun(id, "the end", ended)
	if run["status"] != "succeeded" {
		t.Fatalf("run = %v", run)
	}
	re.settled(run)
	re.call(re.r.Board, http.MethodGet, "/api/me", nil)
	re.call(re.r.Board, http.MethodGet, "/api/no-such-thing/"+id, nil)

	want := []string{
		`berth_runs{status="succeeded"} 1`,
		`berth_runs{status="queued"} 0`,
		`berth_leases{status="released"} 1`,
		`berth_leases{status="active"} 0`,
		`berth_lease_heartbeat_age_seconds 0`,
		`berth_jobs{kind="execute_run",state="completed"} 1`,
		`berth_metrics_db_up 1`,
		`berth_terminal_sessions 0`,
	}
	// River records a job's completion shortly after its worker returns: scrape until it shows.
	var body string
	var missing []string
	for deadline := time.Now().Add(20 * time.Second); ; {
		code, _, b := re.scrape(re.client(), map[string]string{"Authorization": "Bearer " + re.r.Admin.Token})
		if code != http.StatusOK {
			t.Fatalf("GET /metrics = %d", code)
		}
		body, missing = b, nil
		for _, line := range want {
			if !strings.Contains(body, line+"\n") {
				missing = append(missing, line)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, line := range missing {
		t.Errorf("exposition lacks the line %q", line)
	}
	for _, name := range []string{
		"berth_http_request_duration_seconds", "berth_runs", "berth_run_admission_to_start_seconds",
		"berth_leases", "berth_lease_heartbeat_age_seconds", "berth_jobs", "berth_runtime_services",
		"berth_terminal_sessions", "berth_metrics_db_up",
		"berth_db_pool_acquired_conns", "berth_db_pool_idle_conns", "berth_db_pool_constructing_conns",
		"berth_db_pool_total_conns", "berth_db_pool_max_conns", "berth_db_pool_acquires_total",
		"berth_db_pool_acquire_duration_seconds_total", "berth_db_pool_empty_acquires_total",
		"berth_db_pool_canceled_acquires_total",
		"go_goroutines", "process_resident_memory_bytes",
	} {
		if !strings.Contains(body, "# TYPE "+name+" ") {
			t.Errorf("exposition lacks %s", name)
		}
	}
	for _, route := range []string{`route="GET /api/me"`, `route="POST /api/tasks/{id}/runs"`, `route="GET /api/runs/{id}"`, `route="unmatched"`} {
		if !regexp.MustCompile(`berth_http_request_duration_seconds_count\{code="\d+",method="[A-Z]+",` + regexp.QuoteMeta(route) + `\} [1-9]`).MatchString(body) {
			t.Errorf("no request counted under %s", route)
		}
	}
	if strings.Contains(body, id) {
		t.Errorf("a raw path (run id %s) is in the exposition", id)
	}
}

// TestMetricsRunToken: a live run's token is not an admin: /metrics is the usual 404.
func TestMetricsRunToken(t *testing.T) {
	t.Parallel()
	w := newRunTokenWorld(t)
	if code, _, _ := w.e.scrape(w.e.client(), map[string]string{"Authorization": "Bearer " + w.Run2.Token}); code != http.StatusNotFound {
		t.Fatalf("GET /metrics with a run token = %d, want 404", code)
	}
	if code, _, _ := w.e.scrape(w.e.client(), map[string]string{"Authorization": "Bearer " + w.r.Admin.Token}); code != http.StatusOK {
		t.Fatalf("GET /metrics as an admin = %d, want 200", code)
	}
}
