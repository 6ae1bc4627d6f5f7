package handlers

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// planWant is what one plan case expects; nil pointers expect JSON null.
type planWant struct {
	mode     string
	strategy *string
	env      func(w *taskWorld, c *planCase) *string
	reuse    bool // reuse_workspace_id is the case's workspace
	branch   *string
	host     bool
	blockers []string
	trace    []string // "rule=effect" pairs that must appear
}

// planCase sets up one situation in a fresh world and names the task to resolve.
type planCase struct {
	name  string
	setup func(w *taskWorld, c *planCase) (taskID string)
	want  planWant
	html  []string // text the task page must show for this plan

	workspaceID string // set by setup when the case binds a workspace
	envID       string // set by setup when the case adds an environment
}

func planPtr(s string) *string { return &s }

func planPolicyEnv(w *taskWorld, _ *planCase) *string { return &w.EnvID }
func planCaseEnv(_ *taskWorld, c *planCase) *string   { return &c.envID }
func planNoEnv(*taskWorld, *planCase) *string         { return nil }

// setPolicy merges JSON into the world's project policy.
func (w *taskWorld) setPolicy(patch string) {
	w.exec(`UPDATE projects SET execution_policy = execution_policy || $2::jsonb WHERE id = $1`, w.ProjectID, patch)
}

// task creates a task in the world's project and returns its id.
func (w *taskWorld) task(body map[string]any) string {
	if body["title"] == nil {
		body["title"] = "Plan me"
	}
	return w.createTask(w.r.Board, w.ProjectID, body)["id"].(string)
}

// TestPlanEndToEnd resolves the plan of real tasks through GET /api/tasks/{id}/plan, one case per
// rule of docs/api.md "Effective plan" as the database presents it, and checks the exact JSON
// shape, the blockers with their fixes and the trace; the task page shows the same plan.
func TestPlanEndToEnd(t *testing.T) {
	t.Parallel()
	cases := []*planCase{
		{name: "happy path: shared in the primary git workspace on a local environment",
			setup: func(w *taskWorld, _ *planCase) string { return w.task(map[string]any{}) },
			want: planWant{mode: "shared", strategy: planPtr("shared"), env: planPolicyEnv, host: true,
				trace: []string{"project_default_mode=mode=shared", "task_mode=inherit", "strategy=shared", "host_scripts=allowed"}},
			html: []string{"ready", "project_default_mode", "the project&#39;s default mode"}},
		{name: "isolated default branches the git source",
			setup: func(w *taskWorld, _ *planCase) string {
				w.setPolicy(`{"default_mode":"isolated"}`)
				return w.task(map[string]any{})
			},
			want: planWant{mode: "isolated", strategy: planPtr("git_worktree"), env: planPolicyEnv, branch: planPtr("berth/PRJ-1"), host: true,
				trace: []string{"strategy=git_worktree", "branch=berth/PRJ-1"}}},
		{name: "isolated directory source is copied",
			setup: func(w *taskWorld, _ *planCase) string {
				w.exec(`UPDATE project_workspaces SET source_type = 'directory' WHERE project_id = $1`, w.ProjectID)
				w.setPolicy(`{"default_mode":"isolated"}`)
				return w.task(map[string]any{})
			},
			want: planWant{mode: "isolated", strategy: planPtr("copy"), env: planPolicyEnv, host: true, trace: []string{"strategy=copy"}}},
		{name: "configuration_incomplete: no environment",
			setup: func(w *taskWorld, _ *planCase) string {
				w.setPolicy(`{"environment_id":null}`)
				return w.task(map[string]any{})
			},
			want: planWant{mode: "shared", strategy: planPtr("shared"), env: planNoEnv, host: true,
				blockers: []string{"configuration_incomplete"}, trace: []string{"environment=blocked", "result=blocked"}},
			html: []string{"Blocked.", "configuration_incomplete", "Fix: Set an environment in the project"}},
		{name: "configuration_incomplete: archived environment",
			setup: func(w *taskWorld, _ *planCase) string {
				w.exec(`UPDATE environments SET status = 'archived' WHERE id = $1`, w.EnvID)
				return w.task(map[string]any{})
			},
			want: planWant{mode: "shared", strategy: planPtr("shared"), env: planNoEnv, host: true,
				blockers: []string{"configuration_incomplete"}, trace: []string{"environment=blocked"}}},
		{name: "configuration_incomplete: the policy names another company's environment",
			setup: func(w *taskWorld, _ *planCase) string {
				w.setPolicy(fmt.Sprintf(`{"environment_id":%q}`, w.addEnvironment(w.r.B.ID, "theirs", "local", "active", "")))
				return w.task(map[string]any{})
			},
			want: planWant{mode: "shared", strategy: planPtr("shared"), env: planNoEnv, host: true,
				blockers: []string{"configuration_incomplete"}, trace: []string{"environment=blocked"}}},
		{name: "configuration_incomplete: no primary workspace",
			setup: func(w *taskWorld, _ *planCase) string {
				w.exec(`UPDATE project_workspaces SET is_primary = false WHERE project_id = $1`, w.ProjectID)
				return w.task(map[string]any{})
			},
			want: planWant{mode: "shared", env: planPolicyEnv, host: true,
				blockers: []string{"configuration_incomplete"}, trace: []string{"strategy=blocked"}},
			html: []string{"Add a project workspace"}},
		{name: "trust low without a sandbox is isolated and blocked",
			setup: func(w *taskWorld, _ *planCase) string { return w.task(map[string]any{"trust": "low"}) },
			want: planWant{mode: "isolated", strategy: planPtr("git_worktree"), env: planPolicyEnv, branch: planPtr("berth/PRJ-1"),
				blockers: []string{"trust_requires_sandbox"},
				trace:    []string{"trust_low_isolation=mode=isolated", "trust_low_sandbox=blocked", "host_scripts=denied", "runtime_services=denied"}},
			html: []string{"trust_requires_sandbox", "Pick a sandbox environment"}},
		{name: "trust low in a sandbox runs without host scripts",
			setup: func(w *taskWorld, c *planCase) string {
				c.envID = w.addEnvironment(w.r.A.ID, "box", "sandbox", "active", `{"ok":true,"summary":"probed"}`)
				w.setPolicy(fmt.Sprintf(`{"environment_id":%q}`, c.envID))
				return w.task(map[string]any{"trust": "low"})
			},
			want: planWant{mode: "isolated", strategy: planPtr("git_worktree"), env: planCaseEnv, branch: planPtr("berth/PRJ-1"),
				trace: []string{"trust_low_isolation=mode=isolated", "host_scripts=denied"}}},
		{name: "unqualified ssh environment blocks",
			setup: func(w *taskWorld, c *planCase) string {
				c.envID = w.addEnvironment(w.r.A.ID, "remote", "ssh", "active", `{"ok":false}`)
				w.setPolicy(fmt.Sprintf(`{"environment_id":%q}`, c.envID))
				return w.task(map[string]any{})
			},
			want: planWant{mode: "shared", strategy: planPtr("shared"), env: planCaseEnv, host: true,
				blockers: []string{"environment_unqualified"}, trace: []string{"qualification=blocked"}}},
		{name: "task override ignored when the project does not allow it",
			setup: func(w *taskWorld, _ *planCase) string { return w.task(map[string]any{"workspace_mode": "isolated"}) },
			want:  planWant{mode: "shared", strategy: planPtr("shared"), env: planPolicyEnv, host: true, trace: []string{"task_override=ignored"}},
			html:  []string{"does not allow task overrides"}},
		{name: "task override honoured when the project allows it",
			setup: func(w *taskWorld, _ *planCase) string {
				w.setPolicy(`{"allow_task_override":true}`)
				return w.task(map[string]any{"workspace_mode": "isolated"})
			},
			want: planWant{mode: "isolated", strategy: planPtr("git_worktree"), env: planPolicyEnv, branch: planPtr("berth/PRJ-1"), host: true,
				trace: []string{"task_override=mode=isolated"}}},
		{name: "task environment ignored when overrides are not allowed",
			setup: func(w *taskWorld, c *planCase) string {
				c.envID = w.addEnvironment(w.r.A.ID, "other", "local", "active", "")
				return w.task(map[string]any{"environment_id": c.envID})
			},
			want: planWant{mode: "shared", strategy: planPtr("shared"), env: planPolicyEnv, host: true, trace: []string{"task_environment=ignored"}}},
		{name: "task environment honoured when overrides are allowed",
			setup: func(w *taskWorld, c *planCase) string {
				w.setPolicy(`{"allow_task_override":true}`)
				c.envID = w.addEnvironment(w.r.A.ID, "other", "local", "active", "")
				return w.task(map[string]any{"environment_id": c.envID})
			},
			want: planWant{mode: "shared", strategy: planPtr("shared"), env: planCaseEnv, host: true}},
		{name: "binding reuses a selectable workspace",
			setup: func(w *taskWorld, c *planCase) string {
				w.setPolicy(`{"allow_task_override":true}`)
				id := w.task(map[string]any{})
				c.workspaceID = w.addExecWorkspace(w.r.A.ID, w.ProjectID, "standard", "ready")
				w.putBinding(id, map[string]any{"mode": "reuse", "execution_workspace_id": c.workspaceID, "revision": 0, "request_key": "k"}, http.StatusOK)
				return id
			},
			want: planWant{mode: "isolated", env: planPolicyEnv, reuse: true, host: true,
				trace: []string{"binding_override=mode=reuse", "strategy=reuse"}}},
		{name: "binding to a workspace that closed later blocks",
			setup: func(w *taskWorld, c *planCase) string {
				w.setPolicy(`{"allow_task_override":true}`)
				id := w.task(map[string]any{})
				c.workspaceID = w.addExecWorkspace(w.r.A.ID, w.ProjectID, "standard", "ready")
				w.putBinding(id, map[string]any{"mode": "reuse", "execution_workspace_id": c.workspaceID, "revision": 0, "request_key": "k"}, http.StatusOK)
				w.exec(`UPDATE execution_workspaces SET status = 'closed' WHERE id = $1`, c.workspaceID)
				return id
			},
			want: planWant{mode: "reuse", env: planPolicyEnv, host: true, blockers: []string{"reuse_target_invalid"},
				trace: []string{"reuse_target=blocked"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := newTaskWorld(t)
			id := c.setup(w, c)
			status, out := w.e.call(w.r.Viewer, http.MethodGet, "/api/tasks/"+id+"/plan", nil)
			if status != http.StatusOK {
				t.Fatalf("plan = %d %v", status, out)
			}
			checkPlan(t, w, c, out)
			if len(c.html) > 0 {
				resp, body := w.get(w.e.browser(w.r.Viewer), "/tasks/"+id, false)
				for _, want := range c.html {
					if resp.StatusCode != http.StatusOK || !strings.Contains(body, want) {
						t.Errorf("task page (%d) lacks %q", resp.StatusCode, want)
					}
				}
			}
		})
	}
}

// checkPlan compares a plan response with the case's expectations, member by member.
func checkPlan(t *testing.T, w *taskWorld, c *planCase, out map[string]any) {
	t.Helper()
	want := []string{"blocked", "blockers", "branch", "egress", "environment_id", "host_scripts_allowed", "mode", "reuse_workspace_id", "strategy", "trace"}
	if got := taskSortedKeys(out); !slices.Equal(got, want) {
		t.Fatalf("plan members = %v, want %v", got, want)
	}
	nullable := func(name string, want *string) {
		t.Helper()
		if want == nil && out[name] != nil || want != nil && out[name] != *want {
			t.Errorf("%s = %v, want %v", name, out[name], strOrNil(want))
		}
	}
	if out["mode"] != c.want.mode {
		t.Errorf("mode = %v, want %s", out["mode"], c.want.mode)
	}
	nullable("strategy", c.want.strategy)
	nullable("branch", c.want.branch)
	nullable("environment_id", c.want.env(w, c))
	var reuse *string
	if c.want.reuse {
		reuse = &c.workspaceID
	}
	nullable("reuse_workspace_id", reuse)
	if out["host_scripts_allowed"] != c.want.host {
		t.Errorf("host_scripts_allowed = %v, want %v", out["host_scripts_allowed"], c.want.host)
	}
	if out["blocked"] != (len(c.want.blockers) > 0) {
		t.Errorf("blocked = %v with blockers %v", out["blocked"], c.want.blockers)
	}
	var codes []string
	for _, b := range out["blockers"].([]any) {
		m := b.(map[string]any)
		if got := taskSortedKeys(m); !slices.Equal(got, []string{"code", "fix", "message"}) || m["message"] == "" || m["fix"] == "" {
			t.Errorf("blocker %v: want non-empty code, message and fix", m)
		}
		codes = append(codes, m["code"].(string))
	}
	if !slices.Equal(codes, c.want.blockers) && !(len(codes) == 0 && len(c.want.blockers) == 0) {
		t.Errorf("blockers = %v, want %v", codes, c.want.blockers)
	}
	var steps []string
	for _, s := range out["trace"].([]any) {
		m := s.(map[string]any)
		if got := taskSortedKeys(m); !slices.Equal(got, []string{"effect", "reason", "rule"}) || m["rule"] == "" || m["effect"] == "" || m["reason"] == "" {
			t.Errorf("trace step %v: want non-empty rule, effect and reason", m)
		}
		steps = append(steps, fmt.Sprint(m["rule"], "=", m["effect"]))
	}
	for _, want := range c.want.trace {
		if !slices.Contains(steps, want) {
			t.Errorf("trace lacks %s: %v", want, steps)
		}
	}
}

func strOrNil(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}

// TestPlanFragment proves the htmx plan panel renders alone, and that a browser without htmx is
// sent to the task page instead of a bare fragment.
func TestPlanFragment(t *testing.T) {
	t.Parallel()
	w := newTaskWorld(t)
	id := w.task(map[string]any{})
	c := w.e.browser(w.r.Admin)
	resp, body := w.get(c, "/tasks/"+id+"/plan", true)
	if resp.StatusCode != http.StatusOK || strings.Contains(body, "<html") || !strings.Contains(body, `id="plan"`) ||
		!strings.Contains(body, "project_default_mode") {
		t.Fatalf("plan fragment = %d %s", resp.StatusCode, body)
	}
	resp, _ = w.get(c, "/tasks/"+id+"/plan", false)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/tasks/"+id+"#plan" {
		t.Fatalf("plan fragment without htmx = %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
}
