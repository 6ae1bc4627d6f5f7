package handlers

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"berth/environment/jail"
	"berth/environment/jail/jailtest"
	"berth/jobs"

	"berth/environment/datadir"
)

// withInsertOnlyJobs gives the server a River client that enqueues but works nothing, so tests
// can see the jobs a request enqueued.
func withInsertOnlyJobs(t *testing.T) func(*Deps) {
	return func(d *Deps) {
		client, err := jobs.NewClient(jobs.Deps{Pool: d.Pool, Log: slog.New(slog.NewTextHandler(io.Discard, nil))},
			jobs.ClientOptions{Work: false})
		if err != nil {
			t.Fatal(err)
		}
		d.Jobs = client
	}
}

// withProbeWorkers gives the server a working River client whose drivers run in this host's
// bubblewrap jail, as in production.
func withProbeWorkers(t *testing.T) func(*Deps) {
	return func(d *Deps) {
		dataDir := jailtest.Dir(t) // commands run in the jail, which hides /tmp
		host, err := jail.Detect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		client, err := jobs.NewClient(jobs.Deps{Pool: d.Pool, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			NodeID: "test", Secrets: d.Secrets, ReceiptKey: d.ReceiptKey, HomeDir: filepath.Join(dataDir, "homes"), Jail: &host, Data: datadir.At(dataDir)},
			jobs.ClientOptions{Work: true, MaxWorkers: 2})
		if err != nil {
			t.Fatal(err)
		}
		if err := client.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = client.Stop(ctx)
		})
		d.Jobs = client
	}
}

func TestEnvironmentProbeRoleMatrix(t *testing.T) {
	t.Parallel()
	e := setup(t, withInsertOnlyJobs(t))
	r := e.roles()
	id := e.envCreate(r.Admin, r.A.ID, map[string]any{"name": "build", "driver": "local"})["id"].(string)
	probe := "/api/environments/" + id + "/probe"
	probeJobs := func() int {
		return e.count(`SELECT count(*) FROM river_job WHERE kind = 'probe_environment' AND args->>'environment_id' = $1`, id)
	}

	before := e.envRow(id)
	for _, tc := range []struct {
		who  string
		a    actor
		want int
	}{{"board", r.Board, 403}, {"viewer", r.Viewer, 403}, {"other company", r.Other, 404}} {
		if code, out := e.call(tc.a, http.MethodPost, probe, nil); code != tc.want {
			t.Errorf("%s: POST probe = %d %v, want %d", tc.who, code, out, tc.want)
		}
	}
	if code, _ := e.call(r.Admin, http.MethodPost, "/api/environments/not-a-uuid/probe", nil); code != 404 {
		t.Errorf("malformed id = %d, want 404", code)
	}
	if code, _ := e.call(r.Admin, http.MethodPost, "/api/environments/6f0d3a52-7a0f-4e47-9d43-00000000ffff/probe", nil); code != 404 {
		t.Errorf("missing id = %d, want 404", code)
	}
	// A body other than an empty object is refused; a client cannot hand in a qualification.
	if code, out := e.call(r.Admin, http.MethodPost, probe, map[string]any{"qualification": map[string]any{"ok": true}}); code != 400 || envErrorCode(out) != "server_owned_field" {
		t.Errorf("POST probe with a qualification = %d %v, want 400 server_owned_field", code, out)
	}
	if code, out := e.call(r.Admin, http.MethodPost, probe, map[string]any{"force": true}); code != 400 || envErrorCode(out) != "bad_json" {
		t.Errorf("POST probe with an unknown member = %d %v, want 400 bad_json", code, out)
	}
	if code, out := e.call(r.Admin, http.MethodPost, probe, "not json"); code != 400 || envErrorCode(out) != "bad_json" {
		t.Errorf("POST probe with a bad body = %d %v, want 400 bad_json", code, out)
	}
	if resp := e.do(http.DefaultClient, http.MethodPost, probe, strings.NewReader("{}"),
		map[string]string{"Authorization": "Bearer " + r.Admin.Token, "Content-Type": "text/plain"}); resp.StatusCode != 415 {
		t.Errorf("POST probe as text/plain = %d, want 415", resp.StatusCode)
	}
	if code, out := e.call(r.Admin, http.MethodPatch, "/api/environments/"+id, map[string]any{"qualification": map[string]any{"ok": true}}); code != 400 || envErrorCode(out) != "server_owned_field" {
		t.Errorf("PATCH with a qualification = %d %v, want 400 server_owned_field", code, out)
	}
	if n := probeJobs(); n != 0 || e.envRow(id) != before {
		t.Fatalf("refused probes enqueued %d jobs or changed the row", n)
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE company_id = $1 AND action = 'environment.probe.denied'`, r.A.ID); n != 2 {
		t.Errorf("denials audited = %d, want 2 (board and viewer)", n)
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE actor_id = $1`, r.Other.User.ID); n != 0 {
		t.Errorf("another company's probe was audited in a company: %d", n)
	}

	// The instance admin (not a member) gets 202 with the object, one job and one audit event.
	code, out := e.call(r.Admin, http.MethodPost, probe, nil)
	if code != http.StatusAccepted || out["id"] != id || out["qualification"] != nil {
		t.Fatalf("admin POST probe = %d %v, want 202 with the environment", code, out)
	}
	if code, out := e.call(r.Admin, http.MethodPost, probe, map[string]any{}); code != http.StatusAccepted {
		t.Fatalf("admin POST probe with {} = %d %v", code, out)
	}
	if n := probeJobs(); n != 2 {
		t.Fatalf("probe jobs = %d, want 2", n)
	}
	if n := e.count(`SELECT count(*) FROM river_job WHERE kind = 'probe_environment' AND args->>'company_id' = $1`, r.A.ID); n != 2 {
		t.Fatalf("probe jobs of company A = %d, want 2", n)
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE target_id = $1 AND action = 'environment.probe_requested' AND actor_id = $2`,
		id, r.Admin.User.ID); n != 2 {
		t.Fatalf("probe requests audited = %d, want 2", n)
	}

	// The page: the button for instance admins only; the form as the API.
	detail := "/environments/" + id
	browsers := map[string]*http.Client{"board": e.browser(r.Board), "viewer": e.browser(r.Viewer),
		"admin": e.browser(r.Admin), "other": e.browser(r.Other)}
	for who, c := range browsers {
		code, body := e.envGet(c, detail)
		if who == "other" {
			if code != 404 {
				t.Errorf("other: page = %d, want 404", code)
			}
			continue
		}
		if hasButton := strings.Contains(body, `action="`+detail+`/probe"`); code != 200 || hasButton != (who == "admin") {
			t.Errorf("%s: page = %d, probe button shown = %v", who, code, hasButton)
		}
	}
	for who, want := range map[string]int{"board": 403, "viewer": 403, "other": 404} {
		if resp, _ := e.envForm(browsers[who], detail+"/probe", nil, false); resp.StatusCode != want {
			t.Errorf("%s: probe form = %d, want %d", who, resp.StatusCode, want)
		}
	}
	if resp, _ := e.envForm(browsers["admin"], detail+"/probe", url.Values{"qualification": {"ok"}}, false); resp.StatusCode != 400 {
		t.Errorf("admin probe form with a qualification = %d, want 400", resp.StatusCode)
	}
	resp, _ := e.envForm(browsers["admin"], detail+"/probe", nil, false)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != detail {
		t.Fatalf("admin probe form = %d %s, want 303 to the page", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp, _ := e.envForm(browsers["admin"], detail+"/probe", nil, true); resp.StatusCode != 200 || resp.Header.Get("HX-Redirect") != detail {
		t.Fatalf("admin probe form (htmx) = %d %q", resp.StatusCode, resp.Header.Get("HX-Redirect"))
	}
	if n := probeJobs(); n != 4 {
		t.Fatalf("probe jobs after the forms = %d, want 4", n)
	}
}

func TestEnvironmentProbeWithoutJobs(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	id := e.envCreate(r.Admin, r.A.ID, map[string]any{"name": "build", "driver": "local"})["id"].(string)
	if code, out := e.call(r.Admin, http.MethodPost, "/api/environments/"+id+"/probe", nil); code != 503 || envErrorCode(out) != "jobs_unavailable" {
		t.Fatalf("probe without a job client = %d %v, want 503", code, out)
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE action = 'environment.probe_requested'`); n != 0 {
		t.Fatalf("an unqueued probe was audited %d times", n)
	}
	if _, body := e.envGet(e.browser(r.Admin), "/environments/"+id); strings.Contains(body, `/probe"`) {
		t.Fatal("the page offers a probe this server cannot queue")
	}
}

// TestEnvironmentProbeLocal probes a local environment through the real job: the local driver runs
// a command in the bubblewrap jail, and the qualification the job writes is ok, with its checks and
// the fingerprint of the configuration it was earned for. The page then shows it.
func TestEnvironmentProbeLocal(t *testing.T) {
	t.Parallel()
	e := setup(t, withProbeWorkers(t))
	r := e.roles()
	id := e.envCreate(r.Admin, r.A.ID, map[string]any{"name": "here", "driver": "local"})["id"].(string)
	if code, out := e.call(r.Admin, http.MethodPost, "/api/environments/"+id+"/probe", nil); code != http.StatusAccepted {
		t.Fatalf("POST probe = %d %v", code, out)
	}
	var q map[string]any
	deadline := time.Now().Add(90 * time.Second)
	for q == nil {
		if time.Now().After(deadline) {
			t.Fatal("no qualification within 90 s of the probe request")
		}
		time.Sleep(100 * time.Millisecond)
		_, out := e.call(r.Viewer, http.MethodGet, "/api/environments/"+id, nil)
		q, _ = out["qualification"].(map[string]any)
	}
	if q["ok"] != true {
		t.Fatalf("qualification = %v, want ok", q)
	}
	fp, _ := q["config_fingerprint"].(string)
	if !strings.HasPrefix(fp, "sha256:") || q["image_digest"] != "" || q["summary"] == "" {
		t.Fatalf("qualification = %v, want a config fingerprint, no image, a summary", q)
	}
	if _, ok := q["fingerprint"]; ok {
		t.Fatalf("a local qualification carries a host key fingerprint: %v", q)
	}
	if _, err := time.Parse(time.RFC3339, q["probed_at"].(string)); err != nil {
		t.Fatalf("probed_at = %v: %v", q["probed_at"], err)
	}
	checks, _ := q["checks"].([]any)
	shellPassed := false
	for _, c := range checks {
		c := c.(map[string]any)
		shellPassed = shellPassed || c["name"] == "shell" && c["status"] == "pass"
	}
	if !shellPassed {
		t.Fatalf("checks = %v, want a passing shell check", checks)
	}
	_, body := e.envGet(e.browser(r.Viewer), "/environments/"+id)
	if !strings.Contains(body, "qualified") || !strings.Contains(body, "/bin/sh runs commands") || !strings.Contains(body, fp) {
		t.Fatal("the page does not show the qualification, its checks and fingerprint")
	}

	// A change of the configuration clears it; a client still cannot write one.
	if code, out := e.call(r.Admin, http.MethodPatch, "/api/environments/"+id, map[string]any{"qualification": q}); code != 400 {
		t.Fatalf("PATCH with a qualification = %d %v, want 400", code, out)
	}
	code, out := e.call(r.Admin, http.MethodPatch, "/api/environments/"+id,
		map[string]any{"config": map[string]any{"env": []map[string]any{{"name": "MODE", "value": "ci"}}}})
	if code != 200 || out["qualification"] != nil {
		t.Fatalf("PATCH config = %d %v, want the qualification cleared", code, out)
	}
}
