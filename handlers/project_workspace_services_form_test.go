package handlers

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"berth/db"
)

// servicesFormWorld is a directory workspace of a fresh project and the edit form's fields for
// it, with one filled row (row 0, new) for the service "web".
func servicesFormWorld(t *testing.T) (*projT, string, url.Values) {
	t.Helper()
	f := newProjT(t)
	pid := f.project("SVC", nil)["id"].(string)
	dir := t.TempDir()
	w := f.workspace(pid, map[string]any{"name": "app", "source_type": "directory", "source": dir})
	form := url.Values{"name": {"app"}, "source_type": {"directory"}, "source": {dir},
		"services_rows": {"1"}, "services[0].new": {"1"}, "services[0].name": {"web"},
		"services[0].command": {`npx vite --base "$BERTH_PREVIEW_BASE" --port "$PORT"`}, "services[0].port_env": {"WEB_PORT"},
		"services[0].health_path": {"/healthz"}, "services[0].ready_timeout_s": {"45"}, "services[0].stop_policy": {"idle_timeout"},
		"services[0].lifecycle": {"shared"}, "services[0].idle_timeout_m": {"12"}}
	return f, w["id"].(string), form
}

func (f *projT) storedServices(id string) []db.ServiceDefinition {
	f.t.Helper()
	var raw []byte
	if err := f.e.pool.QueryRow(context.Background(), `SELECT services FROM project_workspaces WHERE id = $1`, id).Scan(&raw); err != nil {
		f.t.Fatal(err)
	}
	var out []db.ServiceDefinition
	if err := json.Unmarshal(raw, &out); err != nil {
		f.t.Fatal(err)
	}
	return out
}

// TestProjectWorkspaceServicesForm: the edit form's service rows add a service with every
// member, show it again as a row, change and remove it; the page lists it for a viewer.
func TestProjectWorkspaceServicesForm(t *testing.T) {
	t.Parallel()
	f, id, form := servicesFormWorld(t)
	path := "/project-workspaces/" + id

	// The page offers the blank row to a board member, nothing to a viewer.
	_, body := f.get(f.Board, path)
	if !strings.Contains(body, `name="services[0].name"`) || !strings.Contains(body, `name="services_rows" value="1"`) {
		t.Fatalf("the edit form has no blank service row: %.600s", body)
	}
	if _, body := f.get(f.Viewer, path); strings.Contains(body, `name="services[0].name"`) {
		t.Fatal("a viewer sees the services form")
	}

	resp, _ := f.post(f.Board, path, form, true)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("HX-Redirect") != path {
		t.Fatalf("htmx add service = %d %q", resp.StatusCode, resp.Header.Get("HX-Redirect"))
	}
	got := f.storedServices(id)
	if len(got) != 1 {
		t.Fatalf("stored %v", got)
	}
	d := got[0]
	if d.Name != "web" || d.PortEnv != "WEB_PORT" || d.HealthPath != "/healthz" || d.ReadyTimeoutS != 45 || d.StopPolicy != "idle_timeout" ||
		d.Lifecycle != "shared" || d.IdleTimeoutM != 12 || d.StripPrefix == nil || *d.StripPrefix || !strings.Contains(d.Command, "$BERTH_PREVIEW_BASE") {
		t.Fatalf("stored %+v", d)
	}
	_, body = f.get(f.Viewer, path)
	if !strings.Contains(body, "WEB_PORT") || !strings.Contains(body, "after 12 min") || !strings.Contains(body, "passed") {
		t.Fatalf("the page does not show the service's members: %.2000s", body)
	}
	// The API shows the same members.
	_, out := f.e.call(f.Viewer, http.MethodGet, "/api/project-workspaces/"+id, nil)
	sv := out["services"].([]any)[0].(map[string]any)
	if sv["strip_prefix"] != false || sv["idle_timeout_m"] != float64(12) {
		t.Fatalf("API service = %v", sv)
	}

	// The board's form now shows it as row 0 and a blank row 1; a plain post changes it (the
	// prefix stripped again, the defaults back) and keeps the blank row out.
	_, body = f.get(f.Board, path)
	if !strings.Contains(body, `name="services[0].name" type="text" maxlength="64" class="mono" value="web"`) || !strings.Contains(body, `name="services[1].new"`) {
		t.Fatalf("edit form rows: %.3000s", body)
	}
	change := url.Values{"name": {"app"}, "source_type": {"directory"}, "source": {form.Get("source")}, "services_rows": {"2"},
		"services[0].name": {"web"}, "services[0].command": {"./serve"}, "services[0].strip_prefix": {"true"},
		"services[0].stop_policy": {"manual"}, "services[0].lifecycle": {"ephemeral"},
		"services[1].new": {"1"}, "services[1].stop_policy": {"manual"}, "services[1].lifecycle": {"ephemeral"}, "services[1].strip_prefix": {"true"}}
	resp, _ = f.post(f.Board, path, change, false)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != path {
		t.Fatalf("change = %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if got := f.storedServices(id); len(got) != 1 || got[0].Command != "./serve" || got[0].StripPrefix != nil || got[0].IdleTimeoutM != 0 ||
		got[0].PortEnv != "PORT" || got[0].HealthPath != "/" || got[0].ReadyTimeoutS != 30 {
		t.Fatalf("changed to %+v", got)
	}
	// Saving the workspace without service rows (an older form) keeps the services.
	resp, _ = f.post(f.Board, path, url.Values{"name": {"app2"}, "source_type": {"directory"}, "source": {form.Get("source")}}, false)
	if resp.StatusCode != http.StatusSeeOther || len(f.storedServices(id)) != 1 {
		t.Fatalf("save without rows = %d, services %v", resp.StatusCode, f.storedServices(id))
	}
	// Remove.
	change.Set("name", "app2")
	change.Set("services[0].remove", "true")
	resp, _ = f.post(f.Board, path, change, false)
	if resp.StatusCode != http.StatusSeeOther || len(f.storedServices(id)) != 0 {
		t.Fatalf("remove = %d, services %v", resp.StatusCode, f.storedServices(id))
	}
	// A viewer cannot post the form.
	resp, _ = f.post(f.Viewer, path, form, false)
	if resp.StatusCode != http.StatusForbidden || len(f.storedServices(id)) != 0 {
		t.Fatalf("viewer post = %d", resp.StatusCode)
	}
}

// TestProjectWorkspaceServicesFormErrors: each refused member is a 422 whose message sits under
// its own field (row 1 when row 0 is fine), and nothing is stored.
func TestProjectWorkspaceServicesFormErrors(t *testing.T) {
	t.Parallel()
	f, id, form := servicesFormWorld(t)
	path := "/project-workspaces/" + id
	// Row 0 is a valid existing service; row 1 is the one refused.
	base := url.Values{}
	for k, v := range form {
		base[k] = v
	}
	base.Del("services[0].new")
	base.Set("services_rows", "2")
	for k, v := range map[string]string{"new": "1", "name": "api", "command": "./api", "stop_policy": "manual", "lifecycle": "ephemeral"} {
		base.Set("services[1]."+k, v)
	}
	cases := []struct{ member, value, message string }{
		{"name", "Web Server", "must be 1–64 of a-z, 0-9 and -"},
		{"name", "web", "is already the name of"},
		{"command", "", "is required"},
		{"port_env", "port", "must be an environment variable name"},
		{"port_env", "PATH", "is reserved"},
		{"health_path", "health", "must start with"},
		{"ready_timeout_s", "0", "must be from 1 to 600 seconds"},
		{"ready_timeout_s", "half a minute", "must be a whole number of seconds"},
		{"stop_policy", "never", "must be"},
		{"lifecycle", "forever", "must be"},
		{"idle_timeout_m", "0", "must be from 1 to"},
		{"idle_timeout_m", "1.5", "must be a whole number of minutes"},
	}
	for _, tc := range cases {
		post := maps.Clone(base)
		post.Set("services[1]."+tc.member, tc.value)
		if tc.member == "command" {
			post.Set("services[1].name", "api") // a filled name keeps the row even without a command
		}
		for _, htmx := range []bool{true, false} {
			resp, body := f.post(f.Board, path, post, htmx)
			field := `id="svc-1-` + strings.ReplaceAll(tc.member, "_", "-") + `"`
			at := strings.Index(body, field)
			if resp.StatusCode != http.StatusUnprocessableEntity || at < 0 {
				t.Fatalf("%s=%q (htmx %v) = %d, field present %v", tc.member, tc.value, htmx, resp.StatusCode, at >= 0)
			}
			// The message is the first field error after the field, before the next field.
			rest := body[at:]
			next := strings.Index(rest[1:], `<div class="field">`)
			if next < 0 {
				next = len(rest) - 1
			}
			seg := rest[:next+1]
			if !strings.Contains(seg, `class="field-error"`) || !strings.Contains(seg, tc.message) || !strings.Contains(seg, `aria-invalid="true"`) &&
				tc.member != "strip_prefix" {
				t.Errorf("%s=%q (htmx %v): message not under the field: %.600s", tc.member, tc.value, htmx, seg)
			}
			if htmx && strings.Contains(body, "<html") || !htmx && !strings.Contains(body, "<html") {
				t.Errorf("%s (htmx %v): wrong document", tc.member, htmx)
			}
			// Row 0 keeps its typed values.
			if !strings.Contains(body, `value="WEB_PORT"`) {
				t.Errorf("%s: the form lost row 0's values", tc.member)
			}
		}
		if got := f.storedServices(id); len(got) != 0 {
			t.Fatalf("%s: a refused form stored %v", tc.member, got)
		}
	}
	// Too many rows is one message above the rows.
	post := maps.Clone(form)
	post.Set("services_rows", "40")
	resp, body := f.post(f.Board, path, post, true)
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, "at most 20 services") {
		t.Fatalf("too many rows = %d", resp.StatusCode)
	}
}

// TestProjectWorkspaceServicesFormEscaping: service text typed into the form is shown escaped
// on the page and in a refused form.
func TestProjectWorkspaceServicesFormEscaping(t *testing.T) {
	t.Parallel()
	f, id, form := servicesFormWorld(t)
	path := "/project-workspaces/" + id
	form.Set("services[0].command", `echo "<script>alert(1)</script>"`)
	form.Set("services[0].health_path", `/<img>`)
	if resp, _ := f.post(f.Board, path, form, false); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("save = %d", resp.StatusCode)
	}
	for _, a := range []actor{f.Viewer, f.Board} {
		_, body := f.get(a, path)
		if strings.Contains(body, "<script>alert") || strings.Contains(body, "/<img>") || !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
			t.Fatalf("the page renders service text unescaped")
		}
	}
	form.Set("services[0].name", `<b>x</b>`)
	resp, body := f.post(f.Board, path, form, true)
	if resp.StatusCode != http.StatusUnprocessableEntity || strings.Contains(body, "<b>x</b>") || !strings.Contains(body, "&lt;b&gt;x&lt;/b&gt;") {
		t.Fatalf("refused form = %d, renders the name unescaped", resp.StatusCode)
	}
}

// TestProjectWorkspaceServicesAPIMembers: the API takes strip_prefix and idle_timeout_m, checks
// idle_timeout_m, and a PATCH of other fields keeps them.
func TestProjectWorkspaceServicesAPIMembers(t *testing.T) {
	t.Parallel()
	f := newProjT(t)
	pid := f.project("API", nil)["id"].(string)
	svc := map[string]any{"name": "web", "command": "vite", "strip_prefix": false, "idle_timeout_m": 5, "stop_policy": "idle_timeout"}
	w := f.workspace(pid, map[string]any{"name": "w", "source_type": "directory", "source": t.TempDir(), "services": []any{svc}})
	id := w["id"].(string)
	if got := f.storedServices(id); len(got) != 1 || got[0].StripPrefix == nil || *got[0].StripPrefix || got[0].IdleTimeoutM != 5 {
		t.Fatalf("stored %+v", got)
	}
	status, out := f.e.call(f.Board, http.MethodPatch, "/api/project-workspaces/"+id, map[string]any{"setup_command": "true"})
	if status != http.StatusOK {
		t.Fatalf("patch = %d %v", status, out)
	}
	if got := f.storedServices(id); len(got) != 1 || got[0].StripPrefix == nil || *got[0].StripPrefix || got[0].IdleTimeoutM != 5 {
		t.Fatalf("a patch of another field changed the service: %+v", got)
	}
	for _, bad := range []any{0, 10081} {
		svc["idle_timeout_m"] = bad
		status, out = f.e.call(f.Board, http.MethodPatch, "/api/project-workspaces/"+id, map[string]any{"services": []any{svc}})
		if status != http.StatusUnprocessableEntity || projErrFields(out)["services[0].idle_timeout_m"] == nil {
			t.Fatalf("idle_timeout_m %v = %d %v", bad, status, out)
		}
	}
}
