package handlers

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"berth/db"
	"berth/environment"
	"berth/environment/jail/jailtest"
	"berth/workspace"
)

// runEnvEnvironment is the local environment setupRuns creates.
const runEnvEnvironment = "6f0d3a52-7a0f-4e47-9d43-000000000001"

// serviceWorkspace makes a ready shared execution workspace (trust as given) over a fresh
// directory outside /tmp holding files, from a project workspace that defines defs. It returns
// the workspace and its directory; every service of it is stopped when the test ends.
func (re *runEnv) serviceWorkspace(trust string, files map[string]string, defs ...db.ServiceDefinition) (db.ExecutionWorkspace, string) {
	re.t.Helper()
	ctx := context.Background()
	src := jailtest.Dir(re.t)
	for name, body := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			re.t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			re.t.Fatal(err)
		}
	}
	pw, err := db.CreateProjectWorkspace(ctx, re.pool, re.r.A.ID, re.project, db.ProjectWorkspaceFields{Name: "svc-" + trust + filepath.Base(src)[len(filepath.Base(src))-6:],
		SourceType: "directory", Source: src, Services: defs})
	if err != nil {
		re.t.Fatal(err)
	}
	res, err := re.srv.workspaces.RealizeShared(ctx, src)
	if err != nil {
		re.t.Fatal(err)
	}
	plan, _ := json.Marshal(workspace.Plan{EnvironmentID: runEnvEnvironment, ServicesAllowed: trust != "low"})
	ws, err := db.CreateExecutionWorkspace(ctx, re.pool, db.NewExecutionWorkspace{CompanyID: re.r.A.ID, ProjectID: re.project,
		ProjectWorkspaceID: pw.ID, Mode: "shared", Strategy: "shared", Trust: trust, Ref: res.Ref, Plan: plan})
	if err != nil {
		re.t.Fatal(err)
	}
	if ws, err = db.MarkExecutionWorkspaceReady(ctx, re.pool, ws.ID, ws.Generation, db.Realized{}); err != nil {
		re.t.Fatal(err)
	}
	re.t.Cleanup(func() {
		rows, _ := db.WorkspaceRuntimeServices(context.Background(), re.pool, ws.CompanyID, ws.ID)
		for _, r := range rows {
			_ = environment.StopService(context.Background(), r.ID, 0, 0, time.Second)
		}
	})
	return ws, src
}

// liveRunToken inserts a running run of a new task in workspace wsID and mints its token.
func (re *runEnv) liveRunToken(wsID string) actor {
	re.t.Helper()
	task := re.task("true")
	var id string
	if err := re.pool.QueryRow(context.Background(), `INSERT INTO runs (company_id, task_id, execution_workspace_id, status, command, started_at)
		VALUES ($1, $2, $3, 'running', 'true', now()) RETURNING id`, re.r.A.ID, task.ID, wsID).Scan(&id); err != nil {
		re.t.Fatal(err)
	}
	token, hash, err := db.NewToken()
	if err != nil {
		re.t.Fatal(err)
	}
	if err := db.CreateRunToken(context.Background(), re.pool, id, hash, time.Now().Add(time.Hour)); err != nil {
		re.t.Fatal(err)
	}
	return actor{Token: token}
}

// services lists workspace wsID's services as a, keyed by name.
func (re *runEnv) services(a actor, wsID string) map[string]map[string]any {
	re.t.Helper()
	code, out := re.call(a, http.MethodGet, "/api/execution-workspaces/"+wsID+"/runtime-services", nil)
	if code != http.StatusOK {
		re.t.Fatalf("list services = %d %v", code, out)
	}
	m := map[string]map[string]any{}
	for _, it := range out["items"].([]any) {
		sv := it.(map[string]any)
		m[sv["name"].(string)] = sv
	}
	return m
}

// waitService polls workspace wsID's service name until cond holds (60 s at most).
func (re *runEnv) waitService(wsID, name, what string, cond func(map[string]any) bool) map[string]any {
	re.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if sv := re.services(re.r.Viewer, wsID)[name]; cond(sv) {
			return sv
		}
		time.Sleep(100 * time.Millisecond)
	}
	re.t.Fatalf("service %s: %s did not happen within 60 s: %v", name, what, re.services(re.r.Viewer, wsID)[name])
	return nil
}

func serviceIs(status, health string) func(map[string]any) bool {
	return func(sv map[string]any) bool {
		return sv["status"] == status && (health == "" || sv["health"] == health)
	}
}

// TestRuntimeServicesAPI: the list has one row per defined service (never started: stopped);
// start, stop and restart answer 202 and are idempotent; a real server becomes running and
// healthy and serves the workspace's files through the proxy; restart keeps id, URL and port.
func TestRuntimeServicesAPI(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	web := db.ServiceDefinition{Name: "web", Command: `exec python3 -m http.server "$PORT" --bind 127.0.0.1`, PortEnv: "PORT",
		HealthPath: "/", ReadyTimeoutS: 20, StopPolicy: "manual", Lifecycle: "ephemeral"}
	idle := db.ServiceDefinition{Name: "docs", Command: "sleep 600", PortEnv: "PORT", HealthPath: "/", ReadyTimeoutS: 5,
		StopPolicy: "manual", Lifecycle: "ephemeral"}
	ws, _ := re.serviceWorkspace("standard", map[string]string{"index.html": "hello from the workspace"}, web, idle)
	base := "/api/execution-workspaces/" + ws.ID + "/runtime-services"

	list := re.services(re.r.Viewer, ws.ID)
	if len(list) != 2 || list["web"]["status"] != "stopped" || list["docs"]["status"] != "stopped" || list["web"]["port"] != nil {
		t.Fatalf("first list = %v", list)
	}
	webID := list["web"]["id"].(string)
	// Not running and never given a port: Berth's own /preview/{id}/, which explains.
	if list["web"]["url"] != re.ts.URL+"/preview/"+webID+"/" || list["web"]["desired_state"] != "stopped" {
		t.Fatalf("web = %v", list["web"])
	}
	// Listing again creates nothing new.
	if again := re.services(re.r.Board, ws.ID); again["web"]["id"] != webID || re.count(`SELECT count(*) FROM runtime_services`) != 2 {
		t.Fatalf("second list = %v", again)
	}

	// Start → 202, and the service reads starting from that moment (never stopped at generation 0);
	// a second start is 202 too and leads to the same single running server.
	for i := range 2 {
		code, out := re.call(re.r.Board, http.MethodPost, base+"/start", map[string]any{"name": "web"})
		if code != http.StatusAccepted || out["id"] != webID || out["desired_state"] != "running" {
			t.Fatalf("start = %d %v", code, out)
		}
		if st := out["status"]; (i == 0 && st != "starting") || st == "stopped" {
			t.Fatalf("start %d answered status %v, want starting", i+1, st)
		}
		if i == 0 {
			if st := re.services(re.r.Viewer, ws.ID)["web"]["status"]; st != "starting" && st != "running" {
				t.Fatalf("the list right after an accepted start = %v", st)
			}
		}
	}
	sv := re.waitService(ws.ID, "web", "running and healthy", serviceIs("running", "healthy"))
	port, gen := sv["port"], sv["generation"]
	if port == nil || sv["started_at"] == nil {
		t.Fatalf("running service = %v", sv)
	}
	previewURL := sv["url"].(string) // absolute, on the service's preview origin
	if !strings.HasPrefix(previewURL, "http://localhost:") {
		t.Fatalf("running service's url = %q, want its preview origin", previewURL)
	}
	if code, body := getWith(t, previewURL+"index.html", re.r.Viewer.Token); code != 200 || body != "hello from the workspace" {
		t.Fatalf("preview = %d %q", code, body)
	}
	// A healthy preview is a work product of the workspace.
	if n := re.count(`SELECT count(*) FROM work_products WHERE kind = 'preview_url' AND url LIKE '%' || $1 || '%'`, webID); n < 1 {
		t.Fatal("no preview_url work product")
	}
	// Start once more while running changes nothing (same generation, same port).
	if code, _ := re.call(re.r.Board, http.MethodPost, base+"/start", map[string]any{"name": "web"}); code != http.StatusAccepted {
		t.Fatalf("start while running = %d", code)
	}
	time.Sleep(500 * time.Millisecond)
	if sv := re.services(re.r.Viewer, ws.ID)["web"]; sv["generation"] != gen || sv["status"] != "running" {
		t.Fatalf("a second start restarted the service: %v (generation was %v)", sv, gen)
	}

	// Restart keeps the id, the URL and the port, under a new generation.
	if code, _ := re.call(re.r.Board, http.MethodPost, base+"/restart", map[string]any{"name": "web"}); code != http.StatusAccepted {
		t.Fatalf("restart = %d", code)
	}
	sv = re.waitService(ws.ID, "web", "running again", func(sv map[string]any) bool {
		return sv["status"] == "running" && sv["health"] == "healthy" && sv["generation"].(float64) > gen.(float64)
	})
	if sv["id"] != webID || sv["port"] != port || sv["url"] != previewURL {
		t.Fatalf("restarted = %v, want id %s port %v", sv, webID, port)
	}

	// Stop twice: 202 both times, stopped with reason requested.
	for range 2 {
		if code, out := re.call(re.r.Board, http.MethodPost, base+"/stop", map[string]any{"name": "web"}); code != http.StatusAccepted || out["desired_state"] != "stopped" {
			t.Fatalf("stop = %d %v", code, out)
		}
	}
	sv = re.waitService(ws.ID, "web", "stopped", serviceIs("stopped", ""))
	if sv["stop_reason"] != "requested" {
		t.Fatalf("stopped = %v", sv)
	}
	if code, _ := getWith(t, previewURL, re.r.Viewer.Token); code != http.StatusServiceUnavailable {
		t.Fatalf("preview of a stopped service = %d", code)
	}

	// Refusals change nothing.
	before := re.count(`SELECT count(*) FROM river_job WHERE kind = 'runtime_service'`)
	for _, c := range []struct {
		who    actor
		action string
		body   any
		want   int
	}{
		{re.r.Viewer, "start", map[string]any{"name": "web"}, http.StatusForbidden},
		{re.r.Other, "start", map[string]any{"name": "web"}, http.StatusNotFound},
		{re.r.Board, "start", map[string]any{"name": "nope"}, http.StatusNotFound},
		{re.r.Board, "start", map[string]any{}, http.StatusUnprocessableEntity},
		{re.r.Board, "launch", map[string]any{"name": "web"}, http.StatusNotFound},
		{re.r.Board, "start", map[string]any{"name": "web", "port": 80}, http.StatusBadRequest},
	} {
		if code, out := re.call(c.who, http.MethodPost, base+"/"+c.action, c.body); code != c.want {
			t.Errorf("%s %v = %d %v, want %d", c.action, c.body, code, out, c.want)
		}
	}
	if code, _ := re.call(re.r.Other, http.MethodGet, base, nil); code != http.StatusNotFound {
		t.Errorf("other company's list = %d, want 404", code)
	}
	if after := re.count(`SELECT count(*) FROM river_job WHERE kind = 'runtime_service'`); after != before {
		t.Fatalf("refused requests enqueued %d jobs", after-before)
	}
}

// TestRuntimeServicesRunTokensAndTrust: a run token controls its own workspace's services, not
// another workspace's of the same company; a low-trust workspace has none (403 for anyone).
func TestRuntimeServicesRunTokensAndTrust(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	def := db.ServiceDefinition{Name: "web", Command: `exec python3 -m http.server "$PORT" --bind 127.0.0.1`, PortEnv: "PORT",
		HealthPath: "/", ReadyTimeoutS: 20, StopPolicy: "manual", Lifecycle: "ephemeral"}
	own, _ := re.serviceWorkspace("standard", map[string]string{"index.html": "own"}, def)
	other, _ := re.serviceWorkspace("standard", map[string]string{"index.html": "other"}, def)
	low, _ := re.serviceWorkspace("low", nil, def)
	run := re.liveRunToken(own.ID)
	api := func(ws string) string { return "/api/execution-workspaces/" + ws + "/runtime-services" }

	if code, out := re.call(run, http.MethodGet, api(own.ID), nil); code != http.StatusOK || len(out["items"].([]any)) != 1 {
		t.Fatalf("run lists its own services = %d %v", code, out)
	}
	if code, _ := re.call(run, http.MethodPost, api(own.ID)+"/start", map[string]any{"name": "web"}); code != http.StatusAccepted {
		t.Fatalf("run starts its own service = %d", code)
	}
	re.waitService(own.ID, "web", "running", serviceIs("running", "healthy"))
	// The run's token also reaches its own preview, not the other workspace's.
	ownURL := re.services(re.r.Viewer, own.ID)["web"]["url"].(string)
	if code, _ := getWith(t, ownURL, run.Token); code != http.StatusOK {
		t.Fatalf("run's own preview = %d", code)
	}
	for _, m := range []struct{ method, path string }{{http.MethodGet, api(other.ID)}, {http.MethodPost, api(other.ID) + "/start"}} {
		if code, _ := re.call(run, m.method, m.path, map[string]any{"name": "web"}); code != http.StatusForbidden {
			t.Errorf("run token %s on another workspace = %d, want 403", m.method, code)
		}
	}
	otherID := re.services(re.r.Viewer, other.ID)["web"]["id"].(string)
	if re.services(re.r.Viewer, other.ID)["web"]["status"] != "stopped" {
		t.Fatal("the other workspace's service moved")
	}
	resp := re.do(re.client(), http.MethodGet, "/preview/"+otherID+"/", nil, map[string]string{"Authorization": "Bearer " + run.Token})
	if readBody(t, resp); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("run token on another workspace's preview = %d, want 404", resp.StatusCode)
	}
	if code, _ := re.call(run, http.MethodPost, api(own.ID)+"/stop", map[string]any{"name": "web"}); code != http.StatusAccepted {
		t.Fatalf("run stops its own service = %d", code)
	}
	re.waitService(own.ID, "web", "stopped", serviceIs("stopped", ""))

	// Low trust: 403 services_denied for a board member, nothing enqueued.
	before := re.count(`SELECT count(*) FROM river_job WHERE kind = 'runtime_service'`)
	for _, action := range []string{"start", "restart", "stop"} {
		code, out := re.call(re.r.Board, http.MethodPost, api(low.ID)+"/"+action, map[string]any{"name": "web"})
		if code != http.StatusForbidden || taskErrorCode(out) != "services_denied" {
			t.Errorf("low trust %s = %d %v", action, code, out)
		}
	}
	if re.count(`SELECT count(*) FROM river_job WHERE kind = 'runtime_service'`) != before {
		t.Fatal("a denied request enqueued a job")
	}
	_, body := re.pageBody(re.r.Board, "/workspaces/"+low.ID)
	if !strings.Contains(body, "no runtime services") || strings.Contains(body, "/services/web/start") {
		t.Fatal("the low-trust workspace's page offers services")
	}
}

// TestRuntimeServicesPanel: the workspace page shows each service with its state and, for
// board members, Start; the buttons go through the same core as the API (htmx gets the panel,
// which refreshes itself only while a service changes; a plain form is sent back to the page).
func TestRuntimeServicesPanel(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	def := db.ServiceDefinition{Name: "web", Command: `echo "<b>started</b>"; exec python3 -m http.server "$PORT" --bind 127.0.0.1`, PortEnv: "PORT",
		HealthPath: "/", ReadyTimeoutS: 20, StopPolicy: "manual", Lifecycle: "ephemeral"}
	ws, _ := re.serviceWorkspace("standard", map[string]string{"index.html": "hi"}, def)
	page := "/workspaces/" + ws.ID
	start := page + "/services/web/start"

	_, body := re.pageBody(re.r.Viewer, page)
	if !strings.Contains(body, `id="services"`) || !strings.Contains(body, "stopped") || strings.Contains(body, start) {
		t.Fatalf("viewer's panel: %.3000s", panelOf(body))
	}
	if strings.Contains(panelOf(body), "every 2s") {
		t.Fatal("an idle panel polls")
	}
	_, body = re.pageBody(re.r.Board, page)
	if !strings.Contains(panelOf(body), `action="`+start+`"`) {
		t.Fatalf("board's panel has no Start: %s", panelOf(body))
	}
	// A viewer's post is refused and changes nothing.
	resp := re.form(re.r.Viewer, start, false)
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("viewer start = %d", resp.StatusCode)
	}
	if re.services(re.r.Viewer, ws.ID)["web"]["desired_state"] != "stopped" {
		t.Fatal("a viewer's post changed the service")
	}
	// htmx start: the panel comes back, re-fetching itself on its services' events (no polling).
	resp = re.form(re.r.Board, start, true)
	body = readBody(t, resp)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(strings.TrimSpace(body), `<section id="services"`) || !strings.Contains(body, `hx-trigger="sse:service"`) ||
		!strings.Contains(body, "?fragment=services") {
		t.Fatalf("htmx start = %d %.600s", resp.StatusCode, body)
	}
	re.waitService(ws.ID, "web", "running", serviceIs("running", "healthy"))
	// The refreshed fragment shows it running with its link and log tail, and stops polling.
	resp = re.do(re.browser(re.r.Board), http.MethodGet, page+"?fragment=services", nil, map[string]string{"HX-Request": "true"})
	body = readBody(t, resp)
	svURL := re.services(re.r.Viewer, ws.ID)["web"]["url"].(string)
	if resp.StatusCode != 200 || !strings.HasPrefix(svURL, "http://localhost:") || !strings.Contains(body, `href="`+svURL+`"`) || !strings.Contains(body, "Open preview") ||
		strings.Contains(body, "every 2s") || !strings.Contains(body, "/services/web/stop") || !strings.Contains(body, "/services/web/restart") {
		t.Fatalf("running panel = %d %s", resp.StatusCode, body)
	}
	if !strings.Contains(body, "&lt;b&gt;started&lt;/b&gt;") || strings.Contains(body, "<b>started") {
		t.Fatalf("the log tail is missing or unescaped: %s", body)
	}
	// Plain stop: 303 back to the page; the service stops.
	resp = re.form(re.r.Board, page+"/services/web/stop", false)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != page {
		t.Fatalf("plain stop = %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	re.waitService(ws.ID, "web", "stopped", serviceIs("stopped", ""))
	// A workspace that is not ready: the refusal (409) is shown in the panel.
	if _, err := re.pool.Exec(context.Background(), `UPDATE execution_workspaces SET status = 'failed' WHERE id = $1`, ws.ID); err != nil {
		t.Fatal(err)
	}
	resp = re.form(re.r.Board, start, true)
	if body = readBody(t, resp); resp.StatusCode != http.StatusConflict || !strings.Contains(body, "ready workspace") {
		t.Fatalf("start in a failed workspace = %d %.400s", resp.StatusCode, body)
	}
}

// pageBody loads path in a's signed-in browser.
func (re *runEnv) pageBody(a actor, path string) (*http.Response, string) {
	re.t.Helper()
	resp := re.do(re.browser(a), http.MethodGet, path, nil, nil)
	return resp, readBody(re.t, resp)
}

// form posts an empty form to path in a's signed-in browser.
func (re *runEnv) form(a actor, path string, htmx bool) *http.Response {
	re.t.Helper()
	h := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
	if htmx {
		h["HX-Request"] = "true"
	}
	return re.do(re.browser(a), http.MethodPost, path, strings.NewReader(url.Values{}.Encode()), h)
}

// panelOf is the services panel of a workspace page.
func panelOf(body string) string {
	at := strings.Index(body, `<section id="services"`)
	if at < 0 {
		return ""
	}
	end := strings.Index(body[at:], "</section>")
	return body[at : at+end]
}

// getWith is the status and body of a GET of u with a bearer token.
func getWith(t *testing.T, u, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}
