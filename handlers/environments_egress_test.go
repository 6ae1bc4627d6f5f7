package handlers

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestEnvironmentEgressForm (issue 22): the environment form edits the egress policy and the
// injected secrets with field errors; the environment page and the task's plan show the policy;
// an edit through the form keeps what it does not change; refusals change nothing.
func TestEnvironmentEgressForm(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	admin := e.browser(r.Admin)
	listPage := "/companies/" + r.A.ID + "/environments"
	base := func(extra url.Values) url.Values {
		v := url.Values{"name": {"Egress box"}, "driver": {"local"}, "secret_env": {"GH_TOKEN=ghp-secret-value-123"}}
		for k, vs := range extra {
			v[k] = vs
		}
		return v
	}

	// Refusals: a bad entry, an allowlist with nothing on it, an injection of a variable that is
	// not a secret. Each names its field; nothing is written.
	for _, c := range []struct {
		form url.Values
		want string
	}{
		{base(url.Values{"egress_mode": {"allowlist"}, "egress_allow": {"registry.npmjs.org\nbad_host!"}}), `bad_host!`},
		{base(url.Values{"egress_mode": {"allowlist"}}), `an allowlist needs at least one entry`},
		{base(url.Values{"egress_mode": {"sideways"}}), `must be &#34;off&#34;, &#34;allowlist&#34; or &#34;open&#34;`},
		{base(url.Values{"inject": {"NOT_A_SECRET api.github.com"}}), "NOT_A_SECRET is not one of the secret variables"},
		{base(url.Values{"inject": {"GH_TOKEN api.github.com | Authorization Bearer"}}), "write Header: format"},
	} {
		resp, page := e.envForm(admin, listPage, c.form, false)
		if resp.StatusCode != 422 || !strings.Contains(page, c.want) {
			t.Errorf("form %v = %d, want 422 naming %s", c.form, resp.StatusCode, c.want)
		}
		if strings.Contains(page, "ghp-secret-value-123") {
			t.Error("a refused form echoes the secret value")
		}
	}
	if n := e.count(`SELECT count(*) FROM environments`); n != 0 {
		t.Fatalf("refused forms wrote %d environments", n)
	}

	resp, _ := e.envForm(admin, listPage, base(url.Values{"egress_mode": {"allowlist"},
		"egress_allow": {"registry.npmjs.org\r\n10.8.0.0/16:5432"}, "egress_deny": {"telemetry.example.com"},
		"inject": {"GH_TOKEN api.github.com,uploads.github.com"}}), false)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("create = %d", resp.StatusCode)
	}
	id := strings.TrimPrefix(resp.Header.Get("Location"), "/environments/")
	code, out := e.call(r.Admin, http.MethodGet, "/api/environments/"+id, nil)
	cfg, _ := out["config"].(map[string]any)
	eg, _ := cfg["egress"].(map[string]any)
	if code != 200 || eg["mode"] != "allowlist" || fmt.Sprint(eg["allow"]) != "[10.8.0.0/16:5432 registry.npmjs.org]" || fmt.Sprint(eg["deny"]) != "[telemetry.example.com]" {
		t.Fatalf("stored egress = %d %v", code, cfg["egress"])
	}
	if env := fmt.Sprint(cfg["env"]); !strings.Contains(env, "api.github.com") || strings.Contains(env, "ghp-secret") {
		t.Fatalf("stored env %s", env)
	}

	// The page shows the policy and the injection, never the value; the edit form is filled.
	_, page := e.envGet(admin, "/environments/"+id)
	for _, want := range []string{"only 10.8.0.0/16:5432, registry.npmjs.org", "telemetry.example.com", "GH_TOKEN → api.github.com, uploads.github.com",
		`<option value="allowlist" selected`, "GH_TOKEN api.github.com,uploads.github.com</textarea>"} {
		if !strings.Contains(page, want) {
			t.Errorf("environment page lacks %q", want)
		}
	}
	if strings.Contains(page, "ghp-secret-value-123") {
		t.Fatal("environment page shows the secret")
	}

	// Saving the edit form as it was keeps the policy and the injection (the secret kept by name).
	resp, _ = e.envForm(admin, "/environments/"+id, url.Values{"name": {"Egress box"}, "driver": {"local"}, "secret_env": {"GH_TOKEN"},
		"egress_mode": {"allowlist"}, "egress_allow": {"registry.npmjs.org\n10.8.0.0/16:5432"}, "egress_deny": {"telemetry.example.com"},
		"inject": {"GH_TOKEN api.github.com,uploads.github.com"}}, false)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("edit = %d", resp.StatusCode)
	}
	_, out = e.call(r.Admin, http.MethodGet, "/api/environments/"+id, nil)
	if cfg := out["config"].(map[string]any); fmt.Sprint(cfg["egress"]) != fmt.Sprint(eg) || !strings.Contains(fmt.Sprint(cfg["env"]), "uploads.github.com") {
		t.Fatalf("edit lost the policy: %v", cfg)
	}

	// The plan of a task on this environment shows the policy (API and page).
	w := &taskWorld{e: e, r: r}
	project := w.addProject(r.A.ID, "EGR", fmt.Sprintf(`{"default_mode":"shared","environment_id":%q,"strategy":"git_worktree"}`, id))
	w.addProjectWorkspace(r.A.ID, project, "git", true)
	var task string
	if err := e.pool.QueryRow(context.Background(), `INSERT INTO tasks (company_id, project_id, number, key, title)
		VALUES ($1, $2, 1, 'EGR-1', 'egress') RETURNING id`, r.A.ID, project).Scan(&task); err != nil {
		t.Fatal(err)
	}
	code, plan := e.call(r.Board, http.MethodGet, "/api/tasks/"+task+"/plan", nil)
	pe, _ := plan["egress"].(map[string]any)
	if code != 200 || pe["mode"] != "allowlist" || fmt.Sprint(pe["allow"]) != "[10.8.0.0/16:5432 registry.npmjs.org]" {
		t.Fatalf("plan egress = %d %v", code, plan["egress"])
	}
	if _, page := e.envGet(e.browser(r.Board), "/tasks/"+task); !strings.Contains(page, "only 10.8.0.0/16:5432, registry.npmjs.org") {
		t.Error("the task page's plan does not show the egress policy")
	}
}
