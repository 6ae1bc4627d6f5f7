package db

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Attempt groups (DESIGN §13): one task run count ways at once, each attempt a normal run in its
// own worktree forked from the group's base commit; sealed when finalized; then one selected or
// all discarded, once, fenced by the group's generation.

// Attempt group statuses as stored; the API adds "running" and "sealed" for an open group
// (AttemptGroupState).
const (
	AttemptGroupOpen      = "open"
	AttemptGroupSelected  = "selected"
	AttemptGroupDiscarded = "discarded"
)

// Where a decision's git side is (attempt_groups.refs_state): the select_attempts job moves the
// refs after the request recorded the decision.
const (
	RefsPending = "pending"
	RefsDone    = "done"
	RefsFailed  = "failed"
)

// AttemptGroup is one attempt group row.
type AttemptGroup struct {
	ID                  string
	CompanyID           string
	TaskID              string
	Status              string
	Generation          int64
	Count               int
	Command             string
	BaseRef             string
	BaseCommit          string
	TaskBranch          string
	SelectedWorkspaceID string
	SelectedN           *int
	ReplacedRef         string
	RefsState           string // RefsPending, RefsDone or RefsFailed
	RefsError           string // why the refs were not moved (failed, or a decision taken back)
	Head                string // the commit the task branch was pointed at
	CreatedAt           time.Time
	DecidedAt           *time.Time
}

const attemptGroupColumns = `id, company_id, task_id, status, generation, count, command, base_ref, base_commit,
	task_branch, coalesce(selected_workspace_id::text, ''), selected_n, replaced_ref, refs_state, refs_error, head, created_at, decided_at`

func scanAttemptGroup(row pgx.Row) (AttemptGroup, error) {
	var g AttemptGroup
	err := row.Scan(&g.ID, &g.CompanyID, &g.TaskID, &g.Status, &g.Generation, &g.Count, &g.Command, &g.BaseRef,
		&g.BaseCommit, &g.TaskBranch, &g.SelectedWorkspaceID, &g.SelectedN, &g.ReplacedRef, &g.RefsState, &g.RefsError, &g.Head, &g.CreatedAt, &g.DecidedAt)
	return g, notFound(err)
}

// NewAttemptGroup is what creating a group records.
type NewAttemptGroup struct {
	CompanyID  string
	TaskID     string
	Count      int
	Command    string
	BaseRef    string
	BaseCommit string
	TaskBranch string
	CreatedBy  string
}

// CreateAttemptGroup records an open group; a task that already has one is ErrConflict.
func CreateAttemptGroup(ctx context.Context, q Querier, n NewAttemptGroup) (AttemptGroup, error) {
	g, err := scanAttemptGroup(q.QueryRow(ctx, `INSERT INTO attempt_groups (company_id, task_id, count, command, base_ref,
			base_commit, task_branch, created_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (task_id) WHERE status = 'open' DO NOTHING
		RETURNING `+attemptGroupColumns, n.CompanyID, n.TaskID, n.Count, n.Command, n.BaseRef, n.BaseCommit, n.TaskBranch,
		nullable(n.CreatedBy)))
	if errors.Is(err, ErrNotFound) {
		return AttemptGroup{}, fmt.Errorf("create attempt group: task %s has an open group: %w", n.TaskID, ErrConflict)
	}
	if err != nil {
		return AttemptGroup{}, fmt.Errorf("create attempt group: %w", err)
	}
	return g, nil
}

// CreateAttemptRun records attempt n of a group as a queued run (outside the one-live-run index:
// the group counts as the task's live run).
func CreateAttemptRun(ctx context.Context, q Querier, n NewRun, groupID string, num int) (Run, error) {
	r, err := scanRun(q.QueryRow(ctx, `INSERT INTO runs (company_id, task_id, environment_id, created_by, agent_id,
			command, plan, timeout_s, attempt_group_id, attempt_n)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING `+runColumns,
		n.CompanyID, n.TaskID, nullable(n.EnvironmentID), nullable(n.CreatedBy), nullable(n.AgentID), n.Command, n.Plan,
		n.TimeoutS, groupID, num))
	if err != nil {
		return Run{}, fmt.Errorf("create attempt run: %w", err)
	}
	return r, nil
}

// LatestAttemptGroup reads the task's newest group (open or decided); none is ErrNotFound.
func LatestAttemptGroup(ctx context.Context, q Querier, companyID, taskID string) (AttemptGroup, error) {
	if !validUUID(taskID) {
		return AttemptGroup{}, ErrNotFound
	}
	return scanAttemptGroup(q.QueryRow(ctx, `SELECT `+attemptGroupColumns+` FROM attempt_groups
		WHERE company_id = $1 AND task_id = $2 ORDER BY created_at DESC, id DESC LIMIT 1`, companyID, taskID))
}

// LockLatestAttemptGroup is LatestAttemptGroup with the row locked for a decision in tx.
func LockLatestAttemptGroup(ctx context.Context, tx pgx.Tx, companyID, taskID string) (AttemptGroup, error) {
	if !validUUID(taskID) {
		return AttemptGroup{}, ErrNotFound
	}
	return scanAttemptGroup(tx.QueryRow(ctx, `SELECT `+attemptGroupColumns+` FROM attempt_groups
		WHERE company_id = $1 AND task_id = $2 ORDER BY created_at DESC, id DESC LIMIT 1 FOR UPDATE`, companyID, taskID))
}

// AttemptItem is one attempt as the API and the compare page show it: its run, and its workspace
// once provisioning recorded one.
type AttemptItem struct {
	N               int
	RunID           string
	RunStatus       string
	ErrorCode       string
	ExitCode        *int
	StartedAt       *time.Time
	FinishedAt      *time.Time
	RescueRef       string
	WorkspaceID     string
	WorkspaceRef    string
	WorkspaceStatus string
	FinalizeState   string
	Branch          string
	Sealed          bool
	FinalTreeDigest string
}

// Settled reports whether the attempt can no longer change: its run ended and its workspace (if
// it got one) is sealed, or its finalize or realization failed for good.
func (a AttemptItem) Settled() bool {
	if a.RunStatus == RunQueued || a.RunStatus == RunPreparing || a.RunStatus == RunRunning {
		return false
	}
	return a.WorkspaceID == "" || a.Sealed || a.FinalizeState == "failed" || a.WorkspaceStatus == WorkspaceFailed
}

// AttemptItems lists a group's attempts by number.
func AttemptItems(ctx context.Context, q Querier, companyID, groupID string) ([]AttemptItem, error) {
	rows, err := q.Query(ctx, `SELECT r.attempt_n, r.id::text, r.status, r.error_code, r.exit_code, r.started_at,
			r.finished_at, r.attempt_rescue_ref, coalesce(w.id::text, ''), coalesce(w.ref, ''), coalesce(w.status, ''),
			coalesce(w.finalize_state, ''), coalesce(w.branch, ''), w.sealed_at IS NOT NULL, coalesce(w.final_tree_digest, '')
		FROM runs r LEFT JOIN execution_workspaces w ON w.id = r.execution_workspace_id
		WHERE r.company_id = $1 AND r.attempt_group_id = $2 ORDER BY r.attempt_n`, companyID, groupID)
	if err != nil {
		return nil, fmt.Errorf("attempt items: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (AttemptItem, error) {
		var a AttemptItem
		err := row.Scan(&a.N, &a.RunID, &a.RunStatus, &a.ErrorCode, &a.ExitCode, &a.StartedAt, &a.FinishedAt, &a.RescueRef,
			&a.WorkspaceID, &a.WorkspaceRef, &a.WorkspaceStatus, &a.FinalizeState, &a.Branch, &a.Sealed, &a.FinalTreeDigest)
		return a, err
	})
}

// AttemptGroupState is the status the API shows: running until every attempt is settled, then
// sealed (selectable), or the stored decision.
func AttemptGroupState(g AttemptGroup, items []AttemptItem) string {
	if g.Status != AttemptGroupOpen {
		return g.Status
	}
	for _, it := range items {
		if !it.Settled() {
			return "running"
		}
	}
	return "sealed"
}

// AttemptRun is what a run's attempt membership tells its jobs.
type AttemptRun struct {
	GroupID    string
	N          int
	BaseRef    string
	BaseCommit string
	TaskBranch string
	GroupState string // the stored group status
}

// AttemptOfRun reads the group a run is an attempt of; an ordinary run is ErrNotFound.
func AttemptOfRun(ctx context.Context, q Querier, runID string) (AttemptRun, error) {
	var a AttemptRun
	err := q.QueryRow(ctx, `SELECT g.id::text, r.attempt_n, g.base_ref, g.base_commit, g.task_branch, g.status
		FROM runs r JOIN attempt_groups g ON g.id = r.attempt_group_id WHERE r.id = $1`, runID).
		Scan(&a.GroupID, &a.N, &a.BaseRef, &a.BaseCommit, &a.TaskBranch, &a.GroupState)
	return a, notFound(err)
}

// SealWorkspace records a workspace's final tree digest and seals it; sealing again keeps the
// first digest.
func SealWorkspace(ctx context.Context, q Querier, id, finalDigest string) error {
	_, err := q.Exec(ctx, `UPDATE execution_workspaces SET sealed_at = now(), final_tree_digest = $2, updated_at = now()
		WHERE id = $1 AND sealed_at IS NULL`, id, finalDigest)
	if err != nil {
		return fmt.Errorf("seal workspace: %w", err)
	}
	return nil
}

// WorkspaceSealed reports whether a company's workspace is sealed (a missing one is ErrNotFound).
func WorkspaceSealed(ctx context.Context, q Querier, companyID, id string) (bool, error) {
	if !validUUID(id) {
		return false, ErrNotFound
	}
	var sealed bool
	err := q.QueryRow(ctx, `SELECT sealed_at IS NOT NULL FROM execution_workspaces WHERE company_id = $1 AND id = $2`,
		companyID, id).Scan(&sealed)
	return sealed, notFound(err)
}

// ErrAttemptFenced means a decision on a group lost to another (stale generation or decided).
var ErrAttemptFenced = errors.New("attempt group already decided or changed")

// Decision is what selecting or discarding records.
type Decision struct {
	Status              string // AttemptGroupSelected or AttemptGroupDiscarded
	SelectedWorkspaceID string
	SelectedN           int
}

// DecideAttemptGroup records the decision on an open group at generation gen (bumping it), its
// refs pending for the select_attempts job; anything else is ErrAttemptFenced.
func DecideAttemptGroup(ctx context.Context, q Querier, id string, gen int64, d Decision) (AttemptGroup, error) {
	var n *int
	if d.SelectedN > 0 {
		n = &d.SelectedN
	}
	g, err := scanAttemptGroup(q.QueryRow(ctx, `UPDATE attempt_groups SET status = $3, generation = generation + 1,
			selected_workspace_id = $4, selected_n = $5, replaced_ref = '', refs_state = 'pending', refs_error = '', head = '',
			decided_at = now()
		WHERE id = $1 AND generation = $2 AND status = 'open' RETURNING `+attemptGroupColumns,
		id, gen, d.Status, nullable(d.SelectedWorkspaceID), n))
	if errors.Is(err, ErrNotFound) {
		return AttemptGroup{}, ErrAttemptFenced
	}
	return g, err
}

// AttemptGroupByID reads a company's group.
func AttemptGroupByID(ctx context.Context, q Querier, companyID, id string) (AttemptGroup, error) {
	if !validUUID(id) {
		return AttemptGroup{}, ErrNotFound
	}
	return scanAttemptGroup(q.QueryRow(ctx, `SELECT `+attemptGroupColumns+` FROM attempt_groups
		WHERE company_id = $1 AND id = $2`, companyID, id))
}

// LockAttemptGroup reads a company's group for update.
func LockAttemptGroup(ctx context.Context, tx pgx.Tx, companyID, id string) (AttemptGroup, error) {
	if !validUUID(id) {
		return AttemptGroup{}, ErrNotFound
	}
	return scanAttemptGroup(tx.QueryRow(ctx, `SELECT `+attemptGroupColumns+` FROM attempt_groups
		WHERE company_id = $1 AND id = $2 FOR UPDATE`, companyID, id))
}

// FinishAttemptRefs records that the refs of the decision at generation gen moved: the task
// branch at head (empty for a discard), its earlier commit kept at replaced (or ""). A group at
// another generation, or whose refs are done, is ErrAttemptFenced.
func FinishAttemptRefs(ctx context.Context, q Querier, id string, gen int64, head, replaced string) (AttemptGroup, error) {
	g, err := scanAttemptGroup(q.QueryRow(ctx, `UPDATE attempt_groups SET refs_state = 'done', refs_error = '', head = $3,
			replaced_ref = $4
		WHERE id = $1 AND generation = $2 AND refs_state <> 'done' RETURNING `+attemptGroupColumns, id, gen, head, replaced))
	if errors.Is(err, ErrNotFound) {
		return AttemptGroup{}, ErrAttemptFenced
	}
	return g, err
}

// FailAttemptRefs records that the select_attempts job gave up on the decision at generation gen
// (the group stays decided; its refs are as the reason says). Fenced like FinishAttemptRefs.
func FailAttemptRefs(ctx context.Context, q Querier, id string, gen int64, reason string) (AttemptGroup, error) {
	g, err := scanAttemptGroup(q.QueryRow(ctx, `UPDATE attempt_groups SET refs_state = 'failed', refs_error = $3
		WHERE id = $1 AND generation = $2 AND refs_state <> 'done' RETURNING `+attemptGroupColumns, id, gen, reason))
	if errors.Is(err, ErrNotFound) {
		return AttemptGroup{}, ErrAttemptFenced
	}
	return g, err
}

// ReopenAttemptGroup takes back the decision at generation gen whose refs could not move (nothing
// moved): the group is open again at a new generation, with the reason. Fenced like
// FinishAttemptRefs; ErrConflict when the task has another open group meanwhile.
func ReopenAttemptGroup(ctx context.Context, q Querier, id string, gen int64, reason string) (AttemptGroup, error) {
	g, err := scanAttemptGroup(q.QueryRow(ctx, `UPDATE attempt_groups SET status = 'open', generation = generation + 1,
			selected_workspace_id = NULL, selected_n = NULL, replaced_ref = '', refs_state = 'done', refs_error = $3, head = '',
			decided_at = NULL
		WHERE id = $1 AND generation = $2 AND refs_state <> 'done' RETURNING `+attemptGroupColumns, id, gen, reason))
	switch {
	case errors.Is(err, ErrNotFound):
		return AttemptGroup{}, ErrAttemptFenced
	case isUniqueViolation(err):
		return AttemptGroup{}, ErrConflict
	}
	return g, err
}

// SetAttemptRescueRef records where a discarded attempt's branch head was kept.
func SetAttemptRescueRef(ctx context.Context, q Querier, runID, ref string) error {
	_, err := q.Exec(ctx, `UPDATE runs SET attempt_rescue_ref = $2 WHERE id = $1`, runID, ref)
	if err != nil {
		return fmt.Errorf("set attempt rescue ref: %w", err)
	}
	return nil
}
