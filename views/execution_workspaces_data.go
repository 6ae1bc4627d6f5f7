package views

import "time"

// WorkspacesData is one page of a company's execution workspaces and the filters that chose it.
type WorkspacesData struct {
	CompanyID string
	Status    string
	ProjectID string
	TaskID    string
	TaskKey   string // key of the task filter, "" when none or unknown
	Statuses  []string
	Projects  []TaskOption
	Items     []WorkspaceRow
	NextURL   string // the next page with the same filters, "" on the last one
}

func (d WorkspacesData) filtered() bool { return d.Status != "" || d.ProjectID != "" || d.TaskID != "" }

// WorkspaceRow is one execution workspace in the list.
type WorkspaceRow struct {
	ID          string
	Ref         string
	Status      string
	Mode        string
	Strategy    string
	Branch      string
	ProjectID   string
	ProjectName string
	TaskID      string
	TaskKey     string
	Generation  int64
	CreatedAt   time.Time
	ClosedAt    *time.Time
}

// WorkspacePageData is one execution workspace's page.
type WorkspacePageData struct {
	ID            string
	CompanyID     string
	Ref           string
	Status        string
	Mode          string
	Strategy      string
	Trust         string
	Branch        string
	BaseRef       string
	BaseCommit    string
	TreeDigest    string
	FinalizeState string
	CleanupReason string
	Generation    int64
	CreatedAt     time.Time
	ClosedAt      *time.Time
	ProjectID     string
	ProjectName   string
	TaskID        string
	TaskKey       string
	TaskTitle     string
	// The plan the workspace was created with, and its trace.
	PlanMode        string
	PlanStrategy    string
	PlanBranch      string
	PlanHostScripts bool
	Trace           []PlanStep
	Operations      []WorkspaceOpRow
	Leases          []WorkspaceLeaseRow
	Runs            []WorkspaceRunRow
	WorkProducts    []WorkProductRow
	Readiness       WorkspaceReadinessView
	Services        ServicesPanelData
	CanManage       bool
	Notice          string
	NoticeError     bool
	Live            bool // closing or preparing: the page follows it
}

// WorkspaceOpRow is one ledger step with (the tail of) its log.
type WorkspaceOpRow struct {
	OperationRow
	ID           string
	RunID        string
	LogBytes     int64
	LogTruncated bool // the step's log was over its cap when captured
	Excerpt      bool // Log is only the tail of the stored log
}

// WorkspaceLeaseRow is one environment lease held on the workspace.
type WorkspaceLeaseRow struct {
	ID            string
	Status        string
	RunID         string
	Generation    int64
	CleanupStatus string
	FailureReason string
	AcquiredAt    *time.Time
	ReleasedAt    *time.Time
}

// WorkspaceRunRow is one run that used the workspace.
type WorkspaceRunRow struct {
	ID        string
	TaskKey   string
	Status    string
	ErrorCode string
	CreatedAt time.Time
}

// WorkProductRow is one work product recorded from the workspace.
type WorkProductRow struct {
	Kind      string
	Ref       string
	URL       string
	Path      string
	RunID     string
	Detail    string
	CreatedAt time.Time
}

// WorkspaceReadinessView is the close-readiness panel.
type WorkspaceReadinessView struct {
	State               string
	Blockers            []WorkspaceReason
	Warnings            []WorkspaceReason
	LinkedTasks         []WorkspaceLinkedTask
	Git                 *WorkspaceGit
	Actions             []WorkspaceAction
	DestructiveRequired bool
	Shared              bool
	Confirmed           bool   // evaluated with confirm_destructive
	Closable            bool   // not blocked, or blocked only by what a destructive close overrides
	Unavailable         string // why readiness could not be evaluated on this server
}

// WorkspaceReason is a blocker or a warning.
type WorkspaceReason struct {
	Code    string
	Message string
}

// WorkspaceLinkedTask is a task the workspace serves.
type WorkspaceLinkedTask struct {
	ID     string
	Key    string
	Status string
	Open   bool
}

// WorkspaceGit is the worktree's git state.
type WorkspaceGit struct {
	Dirty     int
	Untracked int
	Ahead     int
	Behind    int
	Merged    bool
	Readable  bool
	SinceBase *int // commits since the recorded base commit; nil when unknown
}

// WorkspaceAction is one planned close step with its literal command.
type WorkspaceAction struct {
	Kind    string
	Label   string
	Command string
}

// WorkspaceStatusBadge is the badge class of an execution workspace status.
func WorkspaceStatusBadge(status string) string {
	switch status {
	case "ready":
		return "badge badge-ok"
	case "failed", "cleanup_failed":
		return "badge badge-err"
	case "closed":
		return "badge badge-muted"
	default:
		return "badge badge-warn"
	}
}

// ReadinessBadge is the badge class of a close-readiness state.
func ReadinessBadge(state string) string {
	switch state {
	case "ready":
		return "badge badge-ok"
	case "ready_with_warnings":
		return "badge badge-warn"
	default:
		return "badge badge-err"
	}
}

func workspaceShortRef(ref string) string {
	if len(ref) > 11 {
		return ref[:11]
	}
	return ref
}

func shortCommit(c string) string {
	if len(c) > 12 {
		return c[:12]
	}
	return c
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func workspacesBaseURL(companyID string) string { return "/companies/" + companyID + "/workspaces" }

func workspaceURL(id string) string { return "/workspaces/" + id }

func workspaceOpLogURL(workspaceID, opID string) string {
	return "/api/execution-workspaces/" + workspaceID + "/operations/" + opID + "/log"
}
