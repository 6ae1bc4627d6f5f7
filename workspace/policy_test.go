package workspace

import (
	"reflect"
	"strings"
	"testing"
)

func TestResolvePlan(t *testing.T) {
	t.Parallel()
	local := PlanEnvironment{ID: "env-local", Name: "local", Driver: "local"}
	sandbox := PlanEnvironment{ID: "env-sb", Name: "sb", Driver: "sandbox", Qualified: true}
	sandboxUnq := PlanEnvironment{ID: "env-sb2", Name: "sb2", Driver: "sandbox"}
	sshUnq := PlanEnvironment{ID: "env-ssh", Name: "ssh", Driver: "ssh"}
	sshOK := PlanEnvironment{ID: "env-ssh2", Name: "ssh2", Driver: "ssh", Qualified: true}
	archived := PlanEnvironment{ID: "env-old", Name: "old", Driver: "local", Archived: true}
	envs := map[string]PlanEnvironment{}
	for _, e := range []PlanEnvironment{local, sandbox, sandboxUnq, sshUnq, sshOK, archived} {
		envs[e.ID] = e
	}
	base := func() PlanInput {
		return PlanInput{
			ProjectID: "p1", TaskKey: "PRJ-7", TaskTrust: TrustStandard, TaskMode: ModeInherit,
			Policy:        ProjectPolicy{DefaultMode: ModeShared, EnvironmentID: local.ID, Strategy: "git_worktree"},
			PrimarySource: "git", Environments: envs,
		}
	}
	ws := func(mut func(*PlanWorkspace)) *PlanWorkspace {
		w := &PlanWorkspace{ID: "ws1", ProjectID: "p1", Mode: ModeIsolated, Trust: TrustStandard, Status: "ready", Reusable: true}
		if mut != nil {
			mut(w)
		}
		return w
	}

	type want struct {
		mode, strategy, env, reuse, branch string
		hostScripts, services              bool
		blockers                           []string
		traceHas                           []string // "rule=effect" pairs that must appear
	}
	cases := []struct {
		name string
		in   func(*PlanInput)
		want want
	}{
		{"project default shared", nil, want{mode: "shared", strategy: "shared", env: local.ID, hostScripts: true, services: true,
			traceHas: []string{"project_default_mode=mode=shared", "task_mode=inherit", "strategy=shared"}}},
		{"missing default falls back to shared", func(in *PlanInput) { in.Policy.DefaultMode = "" },
			want{mode: "shared", strategy: "shared", env: local.ID, hostScripts: true, services: true, traceHas: []string{"project_default_mode=mode=shared"}}},
		{"project default isolated branches the git source", func(in *PlanInput) { in.Policy.DefaultMode = ModeIsolated },
			want{mode: "isolated", strategy: "git_worktree", env: local.ID, branch: "berth/PRJ-7", hostScripts: true, services: true,
				traceHas: []string{"strategy=git_worktree", "branch=berth/PRJ-7"}}},
		{"custom branch template", func(in *PlanInput) {
			in.Policy.DefaultMode = ModeIsolated
			in.Policy.BranchTemplate = "work/{task_key}"
		},
			want{mode: "isolated", strategy: "git_worktree", env: local.ID, branch: "work/PRJ-7", hostScripts: true, services: true}},
		{"isolated directory source is copied", func(in *PlanInput) { in.Policy.DefaultMode = ModeIsolated; in.PrimarySource = "directory" },
			want{mode: "isolated", strategy: "copy", env: local.ID, hostScripts: true, services: true, traceHas: []string{"strategy=copy"}}},
		{"copy strategy from policy", func(in *PlanInput) { in.Policy.DefaultMode = ModeIsolated; in.Policy.Strategy = "copy" },
			want{mode: "isolated", strategy: "copy", env: local.ID, hostScripts: true, services: true}},
		{"task override honoured when allowed", func(in *PlanInput) { in.Policy.AllowTaskOverride = true; in.TaskMode = ModeIsolated },
			want{mode: "isolated", strategy: "git_worktree", env: local.ID, branch: "berth/PRJ-7", hostScripts: true, services: true,
				traceHas: []string{"task_override=mode=isolated"}}},
		{"task override ignored when not allowed", func(in *PlanInput) { in.TaskMode = ModeIsolated },
			want{mode: "shared", strategy: "shared", env: local.ID, hostScripts: true, services: true, traceHas: []string{"task_override=ignored"}}},
		{"binding overrides the task when allowed", func(in *PlanInput) {
			in.Policy.AllowTaskOverride = true
			in.TaskMode = ModeIsolated
			in.BindingMode = ModeShared
		}, want{mode: "shared", strategy: "shared", env: local.ID, hostScripts: true, services: true, traceHas: []string{"binding_override=mode=shared"}}},
		{"binding inherit falls back to the task", func(in *PlanInput) {
			in.Policy.AllowTaskOverride = true
			in.TaskMode = ModeIsolated
			in.BindingMode = ModeInherit
		}, want{mode: "isolated", strategy: "git_worktree", env: local.ID, branch: "berth/PRJ-7", hostScripts: true, services: true}},
		{"reuse a selectable workspace", func(in *PlanInput) {
			in.Policy.AllowTaskOverride = true
			in.BindingMode, in.BindingTargetID, in.BindingTarget = ModeReuse, "ws1", ws(nil)
		}, want{mode: "isolated", strategy: "", env: local.ID, reuse: "ws1", hostScripts: true, services: true, traceHas: []string{"reuse_target=reuse=ws1", "strategy=reuse"}}},
		{"reuse without a bound workspace", func(in *PlanInput) { in.Policy.AllowTaskOverride = true; in.TaskMode = ModeReuse },
			want{mode: "reuse", env: local.ID, hostScripts: true, services: true, blockers: []string{BlockReuseTargetInvalid}}},
		{"reuse of a closed workspace", func(in *PlanInput) {
			in.Policy.AllowTaskOverride = true
			in.BindingMode, in.BindingTargetID, in.BindingTarget = ModeReuse, "ws1", ws(func(w *PlanWorkspace) { w.Status = "closed" })
		}, want{mode: "reuse", env: local.ID, hostScripts: true, services: true, blockers: []string{BlockReuseTargetInvalid}}},
		{"reuse of another project's workspace", func(in *PlanInput) {
			in.Policy.AllowTaskOverride = true
			in.BindingMode, in.BindingTargetID, in.BindingTarget = ModeReuse, "ws1", ws(func(w *PlanWorkspace) { w.ProjectID = "p2" })
		}, want{mode: "reuse", env: local.ID, hostScripts: true, services: true, blockers: []string{BlockReuseTargetInvalid}}},
		{"reuse of a deleted workspace", func(in *PlanInput) {
			in.Policy.AllowTaskOverride = true
			in.BindingMode, in.BindingTargetID = ModeReuse, "ws-gone"
		}, want{mode: "reuse", env: local.ID, hostScripts: true, services: true, blockers: []string{BlockReuseTargetInvalid}}},
		{"reuse across trust levels", func(in *PlanInput) {
			in.Policy.AllowTaskOverride = true
			in.BindingMode, in.BindingTargetID, in.BindingTarget = ModeReuse, "ws1", ws(func(w *PlanWorkspace) { w.Trust = TrustLow })
		}, want{mode: "reuse", env: local.ID, hostScripts: true, services: true, blockers: []string{BlockReuseTargetInvalid}}},
		{"low trust forces isolation and needs a sandbox", func(in *PlanInput) { in.TaskTrust = TrustLow },
			want{mode: "isolated", strategy: "git_worktree", env: local.ID, branch: "berth/PRJ-7", blockers: []string{BlockTrustRequiresSandbox},
				traceHas: []string{"trust_low_isolation=mode=isolated", "trust_low_sandbox=blocked", "host_scripts=denied", "runtime_services=denied"}}},
		{"low trust in a sandbox runs without host scripts or services", func(in *PlanInput) {
			in.TaskTrust = TrustLow
			in.Policy.EnvironmentID = sandbox.ID
		}, want{mode: "isolated", strategy: "git_worktree", env: sandbox.ID, branch: "berth/PRJ-7", traceHas: []string{"host_scripts=denied", "runtime_services=denied"}}},
		{"low trust ignores a shared override", func(in *PlanInput) {
			in.TaskTrust = TrustLow
			in.Policy.EnvironmentID = sandbox.ID
			in.Policy.AllowTaskOverride = true
			in.TaskMode = ModeShared
		}, want{mode: "isolated", strategy: "git_worktree", env: sandbox.ID, branch: "berth/PRJ-7", traceHas: []string{"task_override=mode=shared", "trust_low_isolation=mode=isolated"}}},
		{"standard trust in a sandbox: no host scripts", func(in *PlanInput) { in.Policy.EnvironmentID = sandbox.ID },
			want{mode: "shared", strategy: "shared", env: sandbox.ID, services: true, traceHas: []string{"host_scripts=denied"}}},
		{"unqualified sandbox is a warning", func(in *PlanInput) { in.Policy.EnvironmentID = sandboxUnq.ID },
			want{mode: "shared", strategy: "shared", env: sandboxUnq.ID, services: true, traceHas: []string{"qualification=warning"}}},
		{"unqualified ssh blocks", func(in *PlanInput) { in.Policy.EnvironmentID = sshUnq.ID },
			want{mode: "shared", strategy: "shared", env: sshUnq.ID, hostScripts: true, services: true, blockers: []string{BlockEnvironmentUnqualified}}},
		{"qualified ssh runs", func(in *PlanInput) { in.Policy.EnvironmentID = sshOK.ID },
			want{mode: "shared", strategy: "shared", env: sshOK.ID, hostScripts: true, services: true}},
		{"no environment blocks as configuration_incomplete", func(in *PlanInput) { in.Policy.EnvironmentID = "" },
			want{mode: "shared", strategy: "shared", hostScripts: true, services: true, blockers: []string{BlockConfigurationIncomplete}}},
		{"missing environment blocks", func(in *PlanInput) { in.Policy.EnvironmentID = "env-deleted" },
			want{mode: "shared", strategy: "shared", hostScripts: true, services: true, blockers: []string{BlockConfigurationIncomplete}}},
		{"archived environment blocks", func(in *PlanInput) { in.Policy.EnvironmentID = archived.ID },
			want{mode: "shared", strategy: "shared", hostScripts: true, services: true, blockers: []string{BlockConfigurationIncomplete}}},
		{"task environment honoured when allowed", func(in *PlanInput) { in.Policy.AllowTaskOverride = true; in.TaskEnvID = sshOK.ID },
			want{mode: "shared", strategy: "shared", env: sshOK.ID, hostScripts: true, services: true, traceHas: []string{"task_environment=environment=" + sshOK.ID}}},
		{"task environment ignored when not allowed", func(in *PlanInput) { in.TaskEnvID = archived.ID },
			want{mode: "shared", strategy: "shared", env: local.ID, hostScripts: true, services: true, traceHas: []string{"task_environment=ignored"}}},
		{"no primary workspace blocks", func(in *PlanInput) { in.PrimarySource = "" },
			want{mode: "shared", env: local.ID, hostScripts: true, services: true, blockers: []string{BlockConfigurationIncomplete}}},
		{"several blockers at once", func(in *PlanInput) { in.PrimarySource = ""; in.Policy.EnvironmentID = "" },
			want{mode: "shared", hostScripts: true, services: true, blockers: []string{BlockConfigurationIncomplete, BlockConfigurationIncomplete}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := base()
			if tc.in != nil {
				tc.in(&in)
			}
			p := ResolvePlan(in)
			got := want{mode: p.Mode, strategy: p.Strategy, env: p.EnvironmentID, reuse: p.ReuseWorkspaceID, branch: p.Branch,
				hostScripts: p.HostScriptsAllowed, services: p.ServicesAllowed}
			for _, b := range p.Blockers {
				got.blockers = append(got.blockers, b.Code)
				if b.Message == "" || b.Fix == "" {
					t.Errorf("blocker %s lacks a message or a fix", b.Code)
				}
			}
			w := tc.want
			w.traceHas = nil
			if !reflect.DeepEqual(got, w) {
				t.Errorf("plan = %+v\nwant   %+v", got, w)
			}
			if p.Blocked != (len(p.Blockers) > 0) {
				t.Errorf("blocked = %v with %d blockers", p.Blocked, len(p.Blockers))
			}
			var steps []string
			for _, s := range p.Trace {
				steps = append(steps, s.Rule+"="+s.Effect)
				if s.Reason == "" {
					t.Errorf("trace step %s has no reason", s.Rule)
				}
			}
			for _, h := range tc.want.traceHas {
				found := false
				for _, s := range steps {
					if s == h {
						found = true
					}
				}
				if !found {
					t.Errorf("trace lacks %q; have %s", h, strings.Join(steps, ", "))
				}
			}
			if again := ResolvePlan(in); !reflect.DeepEqual(again, p) {
				t.Error("ResolvePlan is not deterministic")
			}
		})
	}
}

func TestPlanBranchAndTemplate(t *testing.T) {
	t.Parallel()
	for tmpl, want := range map[string]string{
		"berth/{task_key}":     "berth/PRJ-7",
		"feat/{task_key}-work": "feat/PRJ-7-work",
		"x y/{task_key}":       "x-y/PRJ-7",
		"a..b/{task_key}":      "a-b/PRJ-7",
		"/{task_key}/":         "PRJ-7",
	} {
		if got := PlanBranch(tmpl, "PRJ-7"); got != want {
			t.Errorf("PlanBranch(%q) = %q, want %q", tmpl, got, want)
		}
	}
	for tmpl, ok := range map[string]bool{
		"": true, "berth/{task_key}": true, "static": false, "a b/{task_key}": false, "a..b/{task_key}": false,
		"{task_key}.lock": false, "-x/{task_key}": false, strings.Repeat("a", 201) + "{task_key}": false,
	} {
		if got := ValidBranchTemplate(tmpl) == ""; got != ok {
			t.Errorf("ValidBranchTemplate(%q) ok = %v, want %v", tmpl, got, ok)
		}
	}
}

// TestPlanUncontained: "containment": "none" on a local environment is visible in the trace, and
// never lets a low-trust task out of the sandbox requirement.
func TestPlanUncontained(t *testing.T) {
	t.Parallel()
	open := PlanEnvironment{ID: "env-open", Name: "open", Driver: "local", Uncontained: true}
	in := PlanInput{ProjectID: "p1", TaskKey: "PRJ-1", TaskTrust: TrustStandard, TaskMode: ModeInherit,
		Policy:        ProjectPolicy{DefaultMode: ModeIsolated, EnvironmentID: open.ID, Strategy: "git_worktree"},
		PrimarySource: "git", Environments: map[string]PlanEnvironment{open.ID: open}}
	has := func(p Plan) bool {
		for _, e := range p.Trace {
			if e.Rule == "containment" && e.Effect == "uncontained" && strings.Contains(e.Reason, "Berth's own files") {
				return true
			}
		}
		return false
	}
	if p := ResolvePlan(in); p.Blocked || !has(p) {
		t.Fatalf("uncontained local plan: blocked %v, trace %+v", p.Blocked, p.Trace)
	}
	open.Uncontained = false
	in.Environments[open.ID] = open
	if p := ResolvePlan(in); has(p) {
		t.Fatalf("a contained environment's trace says uncontained: %+v", p.Trace)
	}
	open.Uncontained = true
	in.Environments[open.ID] = open
	in.TaskTrust = TrustLow
	if p := ResolvePlan(in); !p.Blocked {
		t.Fatal("a low-trust task ran on an uncontained local environment")
	}
}
