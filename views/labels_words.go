package views

import "strings"

// More words for codes (see labels.go): statuses, task statuses and audit actions. Pages show
// the words and keep the code in a title attribute.

var taskStatusLabels = map[string]string{
	"todo": "To do", "in_progress": "In progress", "in_review": "In review", "done": "Done", "cancelled": "Cancelled",
}

// TaskStatusLabel is a task status for people ("in_review" → "In review").
func TaskStatusLabel(status string) string {
	if l, ok := taskStatusLabels[status]; ok {
		return l
	}
	return status
}

var statusLabels = map[string]string{
	"timed_out":        "timed out",
	"cleanup_failed":   "cleanup failed",
	"waiting_for_user": "waiting for you",
	"in_progress":      "in progress",
}

// StatusLabel is a run, workspace, lease, service or project status for people: the code's own
// word, with underscores read as spaces ("timed_out" → "timed out").
func StatusLabel(status string) string {
	if l, ok := statusLabels[status]; ok {
		return l
	}
	return strings.ReplaceAll(status, "_", " ")
}

// auditActions are the audit trail's actions in words, as "<actor> <words>" reads.
var auditActions = map[string]string{
	"login.succeeded":                      "signed in",
	"login.failed":                         "failed to sign in",
	"login.rate_limited":                   "was slowed down after failed sign-ins",
	"logout":                               "signed out",
	"user.admin_bootstrapped":              "became the first instance administrator",
	"user.password_changed":                "changed their password",
	"user.sessions_revoked":                "signed out their other sessions",
	"api_token.created":                    "created an API token",
	"api_token.revoked":                    "revoked an API token",
	"company.created":                      "created the company",
	"membership.put":                       "added a member",
	"membership.created":                   "added a member",
	"membership.updated":                   "changed a member's role",
	"membership.deleted":                   "removed a member",
	"agent.created":                        "created an agent",
	"agent.disabled":                       "disabled an agent",
	"project.created":                      "created a project",
	"project.updated":                      "changed a project",
	"project.archived":                     "archived a project",
	"project.unarchived":                   "restored a project",
	"project_workspace.created":            "added a project workspace",
	"project_workspace.updated":            "changed a project workspace",
	"project_workspace.deleted":            "removed a project workspace",
	"project_workspace.primary_changed":    "made a project workspace primary",
	"environment.created":                  "created an environment",
	"environment.updated":                  "changed an environment",
	"environment.archived":                 "archived an environment",
	"environment.unarchived":               "restored an environment",
	"environment.probe_requested":          "asked to probe an environment",
	"environment.probed":                   "probed an environment",
	"task.created":                         "created a task",
	"task.updated":                         "changed a task",
	"task_binding.updated":                 "changed a task's workspace binding",
	"run.created":                          "started a run",
	"run.cancel_requested":                 "asked to cancel a run",
	"run.blocked":                          "was refused a run: its plan is blocked",
	"run.orphaned":                         "marked a run orphaned (its executor died)",
	"attempts.created":                     "started attempts",
	"attempts.selected":                    "selected an attempt",
	"attempts.discarded":                   "discarded attempts",
	"execution_workspace.close_requested":  "asked to close a workspace",
	"execution_workspace.closed":           "closed a workspace",
	"execution_workspace.reopen_requested": "asked to reopen a workspace",
	"execution_workspace.reopened":         "reopened a workspace",
	"execution_workspace.reopen_failed":    "could not reopen a workspace",
	"execution_workspace.cleanup_failed":   "could not clean up a workspace",
	"execution_workspace.close_node_dead":  "closed a workspace of a dead node",
	"lease.expired":                        "expired a lease",
	"lease.fenced":                         "refused a stale lease holder",
	"lease.force_released":                 "force-released a lease",
	"lease.cleanup_retried":                "retried a lease's cleanup",
	"image_setup_session.started":          "started an image setup session",
	"image_setup_session.finished":         "finished an image setup session",
	"image_setup_session.promoted":         "activated a new image version",
	"image_setup_session.cancelled":        "cancelled an image setup session",
	"image_setup_session.failed":           "had an image setup session fail",
	"image_setup_session.timed_out":        "had an image setup session time out",
	"image_version.activated":              "activated an image version",
	"image_version.rolled_back":            "rolled an image back",
	"terminal_token.minted":                "opened a terminal token",
	"terminal_token.refused":               "was refused a terminal token",
	"terminal.attached":                    "attached to a setup terminal",
	"terminal.origin_refused":              "was refused a terminal from another origin",
	"file_resource.denied":                 "was refused a file",
	"request.cross_origin_refused":         "was refused a cross-origin request",
	"run_token.denied":                     "was refused with a run token",
	"node.taken_over":                      "took over a dead node's work",
	"workspace.unmanaged_reported":         "reported unmanaged directories",
	"source_root.added":                    "allowed a source root",
	"source_root.removed":                  "removed a source root",
	"source_root_request.opened":           "asked to allow a source directory",
	"source_root_request.approved":         "approved a source directory request",
	"source_root_request.dismissed":        "dismissed a source directory request",
}

// AuditActionLabel is an audit action in words ("membership.put" → "added a member"). A refusal
// (`….denied`) reads "was refused: …" with the words of the attempted action's verb; an unknown
// action reads as its words ("foo_bar.baz" → "foo bar baz").
func AuditActionLabel(action string) string {
	if l, ok := auditActions[action]; ok {
		return l
	}
	if tried, ok := strings.CutSuffix(action, ".denied"); ok {
		return "was refused: " + strings.NewReplacer("_", " ", ".", " ").Replace(tried)
	}
	return strings.NewReplacer("_", " ", ".", " ").Replace(action)
}

// PolicyAllowLabel phrases allow_task_override.
func PolicyAllowLabel(allowed bool) string {
	if allowed {
		return "Tasks may choose their own mode and environment"
	}
	return "Tasks follow the project (overrides off)"
}
