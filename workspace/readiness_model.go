package workspace

import "fmt"

// What close-readiness reads (CloseSnapshot) and answers (Readiness): the codes, the snapshot
// the caller reads in one go, and the answer's shape. readiness.go holds the evaluator.

// Codes of the reasons a close is blocked, in the order EvaluateClose reports them.
const (
	BlockAlreadyClosed   = "already_closed"
	BlockUnmanagedPath   = "unmanaged_path"
	BlockLiveRun         = "live_run"
	BlockActiveLease     = "active_lease"
	BlockFinalizePending = "finalize_pending"
	BlockFinalizeFailed  = "finalize_failed"
	BlockOpenTasksBound  = "open_tasks_bound"
	BlockGitUnreadable   = "git_unreadable"
	BlockDirtyWorktree   = "dirty_worktree"
	BlockUnmergedWork    = "unmerged_work"
)

// Codes of the warnings a close can carry, in the order EvaluateClose reports them.
const (
	WarnSharedWorkspace       = "shared_workspace"
	WarnDestructiveConfirmed  = "destructive_confirmed"
	WarnServicesWillStop      = "services_will_stop"
	WarnCleanupCommandSkipped = "cleanup_command_skipped"
	WarnBehindBase            = "behind_base"
)

// Kinds of planned close actions, in execution order.
const (
	ActionStopServices      = "stop_services"
	ActionRescueRef         = "rescue_ref"
	ActionCleanupCommand    = "cleanup_command"
	ActionGitWorktreeRemove = "git_worktree_remove"
	ActionRemoveDirectory   = "remove_directory"
	ActionArchiveRecord     = "archive_record"
)

// Finalize states of an execution workspace (execution_workspaces.finalize_state).
const (
	FinalizeNone    = "none"
	FinalizePending = "pending"
	FinalizeSettled = "settled"
	FinalizeFailed  = "failed"
)

// WorkspacesPlaceholder stands for the managed base in every command shown to people, so no
// response ever carries an absolute host path.
const WorkspacesPlaceholder = `"$BERTH_WORKSPACES"`

// GitDirPlaceholder stands for the source repository's git dir in a worktree's planned actions
// (its worktree registration lives there).
const GitDirPlaceholder = `"$BERTH_GIT_DIR"`

// CloseWorkspace is what close-readiness knows of the execution workspace itself.
type CloseWorkspace struct {
	ID         string
	Mode       string   // shared | isolated
	Strategy   Strategy // shared | git_worktree | copy
	Status     string   // preparing | ready | failed | closing | closed | cleanup_failed
	Generation int64    // the fencing token the close will be conditional on
	// Managed is true when Berth created the root (the Manager holds its ownership record).
	Managed bool
	// RootRel is the root relative to the managed base: the workspace ref ("ws-" + 32 hex).
	RootRel string
	Branch  string // the task branch of a worktree
	BaseRef string // the ref the worktree started from
	// CleanupCommand is the project workspace's cleanup command; "" when there is none.
	CleanupCommand string
	// HostScriptsAllowed is the effective plan's verdict: false for low trust and sandboxes.
	HostScriptsAllowed bool
}

// CloseRun is a run that uses the workspace.
type CloseRun struct {
	ID     string
	Status string // queued | preparing | running | succeeded | failed | cancelled | timed_out
}

// CloseLease is an environment lease on the workspace.
type CloseLease struct {
	ID     string
	Status string // acquiring | active | releasing | released | expired | failed
}

// CloseTask is a task bound to the workspace.
type CloseTask struct {
	ID     string
	Key    string
	Status string // todo | in_progress | in_review | done | cancelled
}

// CloseService is a runtime service tied to the workspace.
type CloseService struct {
	ID     string
	Name   string
	Status string
	// PGID is the service's process group, 0 when none is recorded; it only shapes the command shown.
	PGID int
}

// CloseSnapshot is everything close-readiness depends on, read in one snapshot by the caller.
type CloseSnapshot struct {
	Workspace     CloseWorkspace
	Runs          []CloseRun
	Leases        []CloseLease
	FinalizeState string // none | pending | settled | failed ("" means none)
	LinkedTasks   []CloseTask
	// Git is the worktree's state (see Manager.GitState); nil when the workspace is not a git
	// workspace or nothing could be read.
	Git *GitState
	// GitErr is non-empty when reading the git state failed outright.
	GitErr             string
	Services           []CloseService
	ConfirmDestructive bool
}

// CloseReason is one blocker or warning: a stable code and a sentence for a person.
type CloseReason struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// LinkedTask is a bound task as readiness reports it; Open tasks block the close.
type LinkedTask struct {
	ID     string `json:"id"`
	Key    string `json:"key"`
	Status string `json:"status"`
	Open   bool   `json:"open"`
}

// CloseGit is the git state readiness reports; the counts mean nothing when Readable is false.
type CloseGit struct {
	Dirty     int  `json:"dirty"`
	Untracked int  `json:"untracked"`
	Ahead     int  `json:"ahead"`
	Behind    int  `json:"behind"`
	Merged    bool `json:"merged"`
	Readable  bool `json:"readable"`
	// CommitsSinceBase counts HEAD's commits since the base commit recorded at creation (Ahead
	// and Behind compare with the base branch as it is now); nil when it was not read.
	CommitsSinceBase *int `json:"commits_since_base,omitempty"`
}

// RunningService is a service the close will stop.
type RunningService struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Status string `json:"status"`
}

// PlannedAction is one step of the close, with the literal command a person can read and check.
type PlannedAction struct {
	Kind    string `json:"kind"`
	Label   string `json:"label"`
	Command string `json:"command"`
}

// Readiness is the answer of GET …/close-readiness (and the body of a 409 on a blocked close).
type Readiness struct {
	State               string           `json:"state"`
	BlockingReasons     []CloseReason    `json:"blocking_reasons"`
	Warnings            []CloseReason    `json:"warnings"`
	LinkedTasks         []LinkedTask     `json:"linked_tasks"`
	Git                 *CloseGit        `json:"git"`
	RunningServices     []RunningService `json:"running_services"`
	PlannedActions      []PlannedAction  `json:"planned_actions"`
	DestructiveRequired bool             `json:"destructive_required"`
	Shared              bool             `json:"shared"`
}

func (r *Readiness) block(code, format string, args ...any) {
	r.BlockingReasons = append(r.BlockingReasons, CloseReason{Code: code, Message: fmt.Sprintf(format, args...)})
}

func (r *Readiness) warn(code, format string, args ...any) {
	r.Warnings = append(r.Warnings, CloseReason{Code: code, Message: fmt.Sprintf(format, args...)})
}

func (r *Readiness) plan(kind, label, command string) {
	r.PlannedActions = append(r.PlannedActions, PlannedAction{Kind: kind, Label: label, Command: command})
}
