package views

import (
	"strconv"
	"strings"
	"time"
)

// Human labels for the codes Berth stores and answers in its API. Pages show the label and keep
// the code in a title attribute (see the *Code components), so people read words and those who
// script against the API still find the code they would match on. An unknown code is shown as
// itself: a new code is never hidden, only not yet phrased.

// codeLabels maps a code to its label, per kind of code.
var codeLabels = map[string]map[string]string{
	"readiness": {
		"ready":               "Ready to close",
		"ready_with_warnings": "Ready to close, with warnings",
		"blocked":             "Blocked",
	},
	"reason": {
		"already_closed":          "Already closed",
		"unmanaged_path":          "Not Berth's directory",
		"live_run":                "A run is still using it",
		"active_lease":            "An environment lease is held",
		"finalize_pending":        "Finalize still running",
		"finalize_failed":         "Finalize failed",
		"open_tasks_bound":        "Open tasks still bound",
		"git_unreadable":          "Git state unreadable",
		"dirty_worktree":          "Uncommitted changes",
		"unmerged_work":           "Unmerged commits",
		"shared_workspace":        "Shared workspace",
		"destructive_confirmed":   "Destructive close confirmed",
		"services_will_stop":      "Services will stop",
		"cleanup_command_skipped": "Cleanup command skipped",
		"behind_base":             "Behind its base",
	},
	"plan_blocker": {
		"configuration_incomplete": "Configuration incomplete",
		"trust_requires_sandbox":   "Low trust needs a sandbox",
		"reuse_target_invalid":     "Workspace to reuse is not usable",
		"environment_unqualified":  "Environment not probed",
	},
	"setup": {
		"starting":         "starting",
		"waiting_for_user": "waiting for you",
		"capturing":        "capturing the image",
		"promoted":         "finished: new version active",
		"cancelled":        "cancelled",
		"timed_out":        "timed out",
		"failed":           "failed",
	},
	"mode": {
		"shared":   "Shared",
		"isolated": "Isolated",
		"inherit":  "From the project",
		"reuse":    "Reuse a workspace",
	},
	"strategy": {
		"git_worktree": "Git worktree",
		"copy":         "Copy",
		"shared":       "The project's own directory",
		"reuse":        "Reuse",
	},
	"driver": {
		"local":   "local",
		"sandbox": "sandbox",
		"ssh":     "SSH",
	},
	"rule": {
		"project_default_mode": "Project default",
		"task_override":        "Task override",
		"binding_override":     "Binding",
		"task_mode":            "Task mode",
		"reuse_target":         "Workspace to reuse",
		"trust_low_isolation":  "Low trust",
		"task_environment":     "Task's environment",
		"environment":          "Environment",
		"qualification":        "Qualification",
		"containment":          "Containment",
		"trust_low_sandbox":    "Low trust",
		"strategy":             "Strategy",
		"branch":               "Branch",
		"host_scripts":         "Host scripts",
		"runtime_services":     "Runtime services",
		"result":               "Result",
	},
	"phase": {
		"realize":       "Prepare workspace",
		"setup":         "Setup command",
		"upload":        "Upload",
		"download":      "Download",
		"finalize":      "Finalize",
		"cleanup":       "Cleanup command",
		"teardown":      "Tear down",
		"service_start": "Start service",
		"service_stop":  "Stop service",
	},
}

// codeLabel is the label of code in kind, or the code itself when it has none.
func codeLabel(kind, code string) string {
	if l, ok := codeLabels[kind][code]; ok {
		return l
	}
	return code
}

// ReadinessLabel is a close-readiness state for people ("ready_with_warnings" → "Ready to close,
// with warnings").
func ReadinessLabel(state string) string { return codeLabel("readiness", state) }

// ReasonLabel is a close blocker's or warning's code for people.
func ReasonLabel(code string) string { return codeLabel("reason", code) }

// PlanBlockerLabel is a plan blocker's code for people.
func PlanBlockerLabel(code string) string { return codeLabel("plan_blocker", code) }

// ModeLabel is a workspace mode for people.
func ModeLabel(mode string) string { return codeLabel("mode", mode) }

// StrategyLabel is a realization strategy for people.
func StrategyLabel(s string) string {
	if s == "" {
		return "—"
	}
	return codeLabel("strategy", s)
}

// EnvironmentLabel names an environment with its driver once: "local" for a local environment
// called local, "build box (SSH)" otherwise.
func EnvironmentLabel(name, driver string) string {
	d := codeLabel("driver", driver)
	if name == "" {
		return d + " environment"
	}
	if driver == "" || strings.EqualFold(name, d) || strings.EqualFold(name, driver) {
		return name
	}
	return name + " (" + d + ")"
}

// RuleLabel is a plan-trace rule for people.
func RuleLabel(rule string) string {
	if strings.HasSuffix(rule, "_override") {
		if l, ok := codeLabels["rule"][rule]; ok {
			return l
		}
		return strings.ReplaceAll(strings.TrimSuffix(rule, "_override"), "_", " ") + " override"
	}
	return codeLabel("rule", rule)
}

// PhaseLabel is a ledger step's phase for people.
func PhaseLabel(phase string) string { return codeLabel("phase", phase) }

// OperationDetail is what a ledger step ran, without repeating its phase: the realize step's
// command "realize git_worktree" reads "git worktree" next to its "Prepare workspace" label.
func OperationDetail(phase, command string) string {
	rest, ok := strings.CutPrefix(command, phase+" ")
	if !ok {
		return command
	}
	if l, ok := codeLabels["strategy"][rest]; ok {
		return strings.ToLower(l[:1]) + l[1:]
	}
	return rest
}

// WorkspaceCloseWords are the sentences that say what closing a workspace does, and did, for its
// mode: a shared workspace is the project's own directory and Berth leaves it alone; a worktree
// is removed and its task branch kept; a copy is deleted.
type WorkspaceCloseWords struct {
	Confirm string // the confirmation question before a close
	Closed  string // what a closed workspace's card says happened
	Reopen  string // what Reopen will do
}

// CloseWords phrases closing for a workspace of this mode and strategy.
func CloseWords(mode, strategy, branch string) WorkspaceCloseWords {
	switch {
	case mode == "shared" || strategy == "shared":
		return WorkspaceCloseWords{
			Confirm: "Close this workspace? Berth only archives its record: the directory is the project's own and stays exactly as it is. There is no task branch.",
			Closed:  "Only Berth's record was archived: the directory is the project's own and was left untouched. There is no task branch.",
			Reopen:  "Reopens the record over the project's directory again, under a new generation.",
		}
	case strategy == "copy":
		return WorkspaceCloseWords{
			Confirm: "Close this workspace? Its directory, a copy of the project's files, is deleted; its work products stay.",
			Closed:  "Its directory (a copy of the project's files) is deleted; its work products remain.",
			Reopen:  "Makes a fresh copy of the project's files, under a new generation.",
		}
	default:
		b := "its task branch"
		if branch != "" {
			b = "branch " + branch
		}
		return WorkspaceCloseWords{
			Confirm: "Close this workspace? Its git worktree is removed and its directory deleted; " + b + " and its work products stay.",
			Closed:  "Its git worktree and directory are gone; " + b + " and its work products remain.",
			Reopen:  "Checks " + b + " out again in a new worktree, under a new generation.",
		}
	}
}

// WorkspaceActionFlash is the flash code of an accepted close or reopen form.
func WorkspaceActionFlash(closing bool, mode, strategy, status string) string {
	switch {
	case closing && status == "closed":
		return "workspace_closed"
	case closing && (mode == "shared" || strategy == "shared"):
		return "workspace_close_shared"
	case closing:
		return "workspace_close"
	case status == "ready":
		return "workspace_open"
	default:
		return "workspace_reopen"
	}
}

// flashMessages are the confirmations a redirect may ask a page to show (?flash=code).
var flashMessages = map[string]string{
	"task_saved":             "Task saved.",
	"project_saved":          "Project and execution policy saved.",
	"workspace_closed":       "The workspace is closed.",
	"workspace_close_shared": "Close accepted: Berth archives the record and leaves the project's directory as it is.",
	"workspace_close":        "Close accepted: Berth is carrying it out; the steps appear under Operations.",
	"workspace_open":         "The workspace is open.",
	"workspace_reopen":       "Reopen accepted: Berth is rebuilding the workspace; the steps appear under Operations.",
	"password_changed":       "Password changed. Your other sessions were signed out.",
	"token_revoked":          "The token is revoked: it no longer works.",
	"sessions_revoked":       "Your other sessions are signed out.",
	"source_root_added":      "Source root added: board members may now use directories inside it.",
	"source_root_removed":    "Source root removed.",
	"request_approved":       "Request approved: the directory is a source root now.",
	"request_dismissed":      "Request dismissed.",
	"request_sent":           "Request sent: instance administrators see it on their Source roots page.",
}

// FlashMessage is the confirmation for a flash code; "" for none or an unknown code.
func FlashMessage(code string) string { return flashMessages[code] }

// commitCount is "1 commit" or "n commits".
func commitCount(n int) string {
	if n == 1 {
		return "1 commit"
	}
	return strconv.Itoa(n) + " commits"
}

// baseName is a base ref for people: "refs/heads/main" reads "main", none reads "the base".
func baseName(ref string) string {
	if ref = strings.TrimPrefix(ref, "refs/heads/"); ref == "" {
		return "the base"
	}
	return ref
}

// Duration is a run's length for people: "0.4 s", "12 s", "3 min 5 s", "2 h 10 min".
func Duration(d time.Duration) string {
	switch {
	case d < 0:
		return "0 s"
	case d < 10*time.Second:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + " s"
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + " s"
	case d < time.Hour:
		return strconv.Itoa(int(d.Minutes())) + " min " + strconv.Itoa(int(d.Seconds())%60) + " s"
	}
	return strconv.Itoa(int(d.Hours())) + " h " + strconv.Itoa(int(d.Minutes())%60) + " min"
}

// TargetURL is the page of an audit target, "" when it has none. companyID serves the targets
// that live on a company page (agents, members).
func TargetURL(companyID, typ, id string) string {
	if id == "" {
		return ""
	}
	switch typ {
	case "project":
		return "/projects/" + id
	case "task":
		return "/tasks/" + id
	case "run":
		return "/runs/" + id
	case "execution_workspace":
		return "/workspaces/" + id
	case "environment":
		return "/environments/" + id
	case "environment_lease":
		return "/leases/" + id
	case "project_workspace":
		return "/project-workspaces/" + id
	case "image_setup_session":
		return "/image-setup-sessions/" + id
	case "company":
		return "/companies/" + id
	case "agent":
		if companyID != "" {
			return "/companies/" + companyID + "/agents"
		}
	case "user":
		if companyID != "" {
			return "/companies/" + companyID + "/members"
		}
	}
	return ""
}

// TargetTypeLabel is an audit target type for people: "execution_workspace" → "execution workspace".
func TargetTypeLabel(typ string) string {
	switch typ {
	case "environment_lease":
		return "lease"
	case "image_setup_session":
		return "setup session"
	}
	return strings.ReplaceAll(typ, "_", " ")
}
