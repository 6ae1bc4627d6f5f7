package workspace

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Workspace modes, strategies and trust levels the policy resolver speaks.
const (
	ModeInherit  = "inherit"
	ModeShared   = "shared"
	ModeIsolated = "isolated"
	ModeReuse    = "reuse"

	TrustStandard = "standard"
	TrustLow      = "low"
)

// Blocker codes a plan can carry.
const (
	BlockConfigurationIncomplete = "configuration_incomplete"
	BlockTrustRequiresSandbox    = "trust_requires_sandbox"
	BlockReuseTargetInvalid      = "reuse_target_invalid"
	BlockEnvironmentUnqualified  = "environment_unqualified"
)

// ProjectPolicy is a project's execution policy as stored in projects.execution_policy.
type ProjectPolicy struct {
	DefaultMode       string `json:"default_mode"`
	AllowTaskOverride bool   `json:"allow_task_override"`
	EnvironmentID     string `json:"environment_id"`
	Strategy          string `json:"strategy"`
	BranchTemplate    string `json:"branch_template"`
}

// PlanEnvironment is what the resolver knows of an environment.
type PlanEnvironment struct {
	ID        string
	Name      string
	Driver    string // local | ssh | sandbox | plugin
	Archived  bool
	Qualified bool // a current, successful probe qualification exists
	// Uncontained is an instance admin's "containment": "none" on a local environment: its
	// commands run outside the jail.
	Uncontained bool
}

// PlanWorkspace is what the resolver knows of an existing execution workspace.
type PlanWorkspace struct {
	ID        string
	ProjectID string
	Mode      string // shared | isolated
	Trust     string
	Status    string // preparing | ready | failed | closing | closed | cleanup_failed
	Reusable  bool
}

// PlanInput is everything the effective plan depends on, read in one snapshot.
type PlanInput struct {
	ProjectID       string
	Policy          ProjectPolicy
	TaskKey         string
	TaskTrust       string
	TaskMode        string // inherit | shared | isolated | reuse
	TaskEnvID       string
	PrimarySource   string // "git", "directory", or "" when the project has no primary workspace
	Environments    map[string]PlanEnvironment
	BindingMode     string         // the binding's requested mode; "" when the task was never bound
	BindingTarget   *PlanWorkspace // the workspace the binding selects, if any (nil if missing or not visible)
	BindingTargetID string         // the id the binding names (kept even when the row is gone)
}

// Blocker is one reason a plan cannot run, with what would fix it.
type Blocker struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Fix     string `json:"fix"`
}

// TraceStep is one rule that fired: what it changed and why.
type TraceStep struct {
	Rule   string `json:"rule"`
	Effect string `json:"effect"`
	Reason string `json:"reason"`
}

// Plan is the effective plan: where and how the task's next run works, or why it cannot.
type Plan struct {
	Mode               string      `json:"mode"`
	Strategy           string      `json:"strategy"`
	EnvironmentID      string      `json:"environment_id"`
	ReuseWorkspaceID   string      `json:"reuse_workspace_id"`
	Branch             string      `json:"branch"`
	HostScriptsAllowed bool        `json:"host_scripts_allowed"`
	ServicesAllowed    bool        `json:"services_allowed"`
	Blocked            bool        `json:"blocked"`
	Blockers           []Blocker   `json:"blockers"`
	Trace              []TraceStep `json:"trace"`
}

func (p *Plan) trace(rule, effect, reason string, args ...any) {
	p.Trace = append(p.Trace, TraceStep{Rule: rule, Effect: effect, Reason: fmt.Sprintf(reason, args...)})
}

func (p *Plan) block(code, message, fix string) {
	p.Blocked = true
	p.Blockers = append(p.Blockers, Blocker{Code: code, Message: message, Fix: fix})
}

// ResolvePlan turns project policy, task settings, trust, environment availability and the
// task's binding into the effective plan and its trace. It is a pure function: the same input
// always gives the same plan. Trust only tightens; a task override counts only when the project
// allows it; a missing or archived environment blocks before anything is provisioned.
func ResolvePlan(in PlanInput) Plan {
	p := Plan{Blockers: []Blocker{}, Trace: []TraceStep{}}
	trust := in.TaskTrust
	if trust != TrustLow {
		trust = TrustStandard
	}

	// 1. Mode: project default, then the task's setting, then the binding's selection.
	p.Mode = in.Policy.DefaultMode
	if p.Mode != ModeShared && p.Mode != ModeIsolated {
		p.Mode = ModeShared
		p.trace("project_default_mode", "mode=shared", "the project sets no default mode; shared is the default")
	} else {
		p.trace("project_default_mode", "mode="+p.Mode, "the project's default mode")
	}
	requested, source := in.TaskMode, "task"
	if in.BindingMode != "" && in.BindingMode != ModeInherit {
		requested, source = in.BindingMode, "binding"
	}
	if requested != "" && requested != ModeInherit {
		if in.Policy.AllowTaskOverride {
			p.Mode = requested
			p.trace(source+"_override", "mode="+requested, "the %s asks for %s and the project allows task overrides", source, requested)
		} else {
			p.trace(source+"_override", "ignored", "the %s asks for %s but the project does not allow task overrides", source, requested)
		}
	} else {
		p.trace("task_mode", "inherit", "the task inherits the project's mode")
	}

	// 2. Reuse resolves to an existing workspace, which must be selectable.
	if p.Mode == ModeReuse {
		w := in.BindingTarget
		switch {
		case in.BindingTargetID == "":
			p.block(BlockReuseTargetInvalid, "Reuse is selected but no execution workspace is bound.",
				"Select an execution workspace in the task's workspace binding, or choose another mode.")
			p.trace("reuse_target", "blocked", "no workspace is bound")
		case w == nil || w.ProjectID != in.ProjectID:
			p.block(BlockReuseTargetInvalid, "The bound execution workspace no longer exists or belongs to another project.",
				"Bind a workspace of this project.")
			p.trace("reuse_target", "blocked", "the bound workspace is missing or outside the project")
		case w.Status == "closed" || w.Status == "closing" || w.Status == "cleanup_failed" || w.Status == "failed":
			p.block(BlockReuseTargetInvalid, fmt.Sprintf("The bound execution workspace is %s.", w.Status),
				"Reopen it, or bind another workspace.")
			p.trace("reuse_target", "blocked", "the bound workspace is %s", w.Status)
		case w.Trust != trust:
			p.block(BlockReuseTargetInvalid, fmt.Sprintf("The bound workspace was made for %s-trust work; this task is %s trust.", w.Trust, trust),
				"Bind a workspace of the same trust level.")
			p.trace("reuse_target", "blocked", "trust %s does not match the task's %s", w.Trust, trust)
		default:
			p.ReuseWorkspaceID = w.ID
			p.Mode = w.Mode
			p.trace("reuse_target", "reuse="+w.ID, "the binding selects a %s workspace of this project", w.Mode)
		}
	}

	// 3. Trust only tightens.
	if trust == TrustLow {
		if p.Mode != ModeIsolated && p.Mode != ModeReuse {
			p.trace("trust_low_isolation", "mode=isolated", "low-trust tasks always run in an isolated workspace")
			p.Mode = ModeIsolated
		} else {
			p.trace("trust_low_isolation", "none", "already isolated")
		}
	}

	// 4. Environment: the task's choice when overrides are allowed, else the project's.
	envID := in.Policy.EnvironmentID
	envSource := "project"
	if in.TaskEnvID != "" {
		if in.Policy.AllowTaskOverride {
			envID, envSource = in.TaskEnvID, "task"
			p.trace("task_environment", "environment="+envID, "the task picks its environment and the project allows overrides")
		} else {
			p.trace("task_environment", "ignored", "the task picks an environment but the project does not allow task overrides")
		}
	}
	env, found := in.Environments[envID]
	switch {
	case envID == "":
		p.block(BlockConfigurationIncomplete, "No environment is configured for this task.",
			"Set an environment in the project's execution policy.")
		p.trace("environment", "blocked", "neither the project nor the task names an environment")
	case !found:
		p.block(BlockConfigurationIncomplete, "The "+envSource+"'s environment no longer exists.",
			"Choose an existing environment in the "+envSource+" settings.")
		p.trace("environment", "blocked", "the %s's environment is missing", envSource)
	case env.Archived:
		p.block(BlockConfigurationIncomplete, fmt.Sprintf("Environment %q is archived.", env.Name),
			"Choose an active environment in the "+envSource+" settings.")
		p.trace("environment", "blocked", "environment %q is archived", env.Name)
	default:
		p.EnvironmentID = env.ID
		p.trace("environment", "environment="+env.ID, "environment %s, chosen by the %s", envNameDriver(env.Name, env.Driver), envSource)
		switch {
		case env.Driver == "ssh" && !env.Qualified:
			p.block(BlockEnvironmentUnqualified, fmt.Sprintf("SSH environment %q has not passed a probe since its last change.", env.Name),
				"Probe the environment (an instance admin can do this on its page).")
			p.trace("qualification", "blocked", "ssh environments must be probed before runs")
		case env.Driver == "plugin" && !env.Qualified:
			p.block(BlockEnvironmentUnqualified, fmt.Sprintf("Plugin environment %q has not passed a probe since its last change.", env.Name),
				"Probe the environment (an instance admin can do this on its page): the probe runs the pinned plugin.")
			p.trace("qualification", "blocked", "plugin environments must be probed before runs")
		case env.Driver == "sandbox" && !env.Qualified:
			p.trace("qualification", "warning", "sandbox %q has no current probe; runs are allowed, a probe is recommended", env.Name)
		}
		if env.Uncontained && env.Driver == "local" {
			p.trace("containment", "uncontained", "runs can read Berth's own files and database")
		}
	}
	if trust == TrustLow && found && !env.Archived && env.Driver != "sandbox" {
		p.block(BlockTrustRequiresSandbox, "Low-trust tasks must run in a sandbox environment.",
			"Pick a sandbox environment for this task or its project.")
		p.trace("trust_low_sandbox", "blocked", "the environment's driver is %s, not sandbox", env.Driver)
	}

	// 5. Strategy: shared needs no realization; isolated copies or branches the primary source.
	switch {
	case p.ReuseWorkspaceID != "":
		p.Strategy = ""
		p.trace("strategy", "reuse", "the existing workspace keeps its strategy")
	case p.Mode == ModeReuse:
		p.trace("strategy", "none", "no workspace to reuse, so nothing to realize")
	case in.PrimarySource == "":
		p.block(BlockConfigurationIncomplete, "The project has no primary project workspace.",
			"Add a project workspace (a git repository or a directory) and mark it primary.")
		p.trace("strategy", "blocked", "no primary project workspace")
	case p.Mode == ModeShared:
		p.Strategy = string(StrategyShared)
		p.trace("strategy", "shared", "shared mode works in the project workspace itself")
	default:
		p.Strategy = in.Policy.Strategy
		if p.Strategy != string(StrategyGitWorktree) && p.Strategy != string(StrategyCopy) {
			p.Strategy = string(StrategyGitWorktree)
		}
		if p.Strategy == string(StrategyGitWorktree) && in.PrimarySource != "git" {
			p.Strategy = string(StrategyCopy)
			p.trace("strategy", "copy", "the primary workspace is a plain directory, so it is copied instead of branched")
		} else {
			p.trace("strategy", p.Strategy, "the project's isolation strategy")
		}
	}
	if p.Strategy == string(StrategyGitWorktree) {
		tmpl := in.Policy.BranchTemplate
		if tmpl == "" {
			tmpl = DefaultBranchTemplate
		}
		p.Branch = PlanBranch(tmpl, in.TaskKey)
		p.trace("branch", p.Branch, "branch template %q", tmpl)
	}

	// 6. Host scripts and runtime services.
	switch {
	case trust == TrustLow:
		p.trace("host_scripts", "denied", "low trust suppresses host setup and cleanup commands")
		p.trace("runtime_services", "denied", "low trust denies runtime services")
	case found && env.Driver == "sandbox":
		p.ServicesAllowed = true
		p.trace("host_scripts", "denied", "setup and cleanup commands run inside the sandbox, not on the host")
	default:
		p.HostScriptsAllowed = true
		p.ServicesAllowed = true
		if found {
			p.trace("host_scripts", "allowed", "standard trust, and %s runs commands outside a sandbox", envNameDriver(env.Name, env.Driver))
		} else {
			p.trace("host_scripts", "allowed", "standard trust; no environment is resolved yet")
		}
	}
	if p.Blocked {
		p.trace("result", "blocked", "%d blocker(s); nothing is provisioned until they are fixed", len(p.Blockers))
	}
	return p
}

// envNameDriver names an environment for a trace line: its quoted name, with its driver only
// when the name does not already say it ("local", not "local local").
func envNameDriver(name, driver string) string {
	if driver == "" || strings.EqualFold(name, driver) {
		return strconv.Quote(name)
	}
	return strconv.Quote(name) + " (" + driver + ")"
}

var branchUnsafe = regexp.MustCompile(`[^A-Za-z0-9._/-]+`)

// PlanBranch fills a branch template: {task_key} becomes the task key. Characters git refuses
// in branch names become "-".
func PlanBranch(template, taskKey string) string {
	b := strings.ReplaceAll(template, "{task_key}", taskKey)
	b = branchUnsafe.ReplaceAllString(b, "-")
	b = strings.Trim(strings.ReplaceAll(b, "..", "-"), "/.")
	if b == "" {
		b = PlanBranch(DefaultBranchTemplate, taskKey)
	}
	return b
}

// ValidBranchTemplate reports why a branch template is unusable, or "" when it is fine.
func ValidBranchTemplate(t string) string {
	switch {
	case t == "":
		return ""
	case len(t) > 200:
		return "must be at most 200 characters"
	case !strings.Contains(t, "{task_key}"):
		return "must contain {task_key}, so every task gets its own branch"
	case strings.ContainsAny(t, " ~^:?*[\\") || strings.Contains(t, "..") || strings.HasPrefix(t, "/") ||
		strings.HasSuffix(t, "/") || strings.HasSuffix(t, ".lock") || strings.HasPrefix(t, "-"):
		return "is not a valid git branch name"
	}
	return ""
}
