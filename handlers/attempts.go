package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/jobs"
	"berth/workspace"
)

// Attempts (DESIGN §13, docs/attempts.md): POST /api/tasks/{id}/attempts forks count isolated
// worktrees of the task from one base commit, each attempt a normal run (provision → execute_run
// → finalize) on its own branch berth/{task_key}-a{n} under its own lease; finalize seals each
// workspace with its final tree digest. GET lists the group; select and discard decide it once
// (attempts_decide.go). The group counts as the task's one live run while any attempt is live.

// attemptRequest is the body of POST /api/tasks/{id}/attempts.
type attemptRequest struct {
	Count    int     `json:"count"`
	Command  *string `json:"command"`
	TimeoutS *int    `json:"timeout_s"`
}

// maxAttemptCommand bounds a command given for attempts (as a task's command is bounded).
const maxAttemptCommand = 16 << 10

func (in attemptRequest) validate() error {
	fields := map[string]string{}
	if in.Count < 2 || in.Count > 8 {
		fields["count"] = "Give a count from 2 to 8."
	}
	if in.Command != nil && (strings.TrimSpace(*in.Command) == "" || len(*in.Command) > maxAttemptCommand || strings.ContainsRune(*in.Command, 0)) {
		fields["command"] = "Give a command of 1 to 16384 bytes, or leave it out to run the task's command."
	}
	if in.TimeoutS != nil && (*in.TimeoutS < 1 || *in.TimeoutS > 86400) {
		fields["timeout_s"] = "Give a timeout from 1 to 86400 seconds."
	}
	if len(fields) > 0 {
		return invalid(fields)
	}
	return nil
}

// attemptItemJSON is one attempt in GET /api/tasks/{id}/attempts.
type attemptItemJSON struct {
	N                    int     `json:"n"`
	ExecutionWorkspaceID *string `json:"execution_workspace_id"`
	RunID                string  `json:"run_id"`
	Status               string  `json:"status"`
	ExitCode             *int    `json:"exit_code"`
	ErrorCode            *string `json:"error_code"`
	Sealed               bool    `json:"sealed"`
	FinalTreeDigest      *string `json:"final_tree_digest"`
	Branch               string  `json:"branch"`
	RescueRef            *string `json:"rescue_ref"`
	Selected             bool    `json:"selected"`
}

// attemptsJSON is an attempt group as the API returns it.
type attemptsJSON struct {
	GroupID             string  `json:"group_id"`
	Generation          int64   `json:"generation"`
	Status              string  `json:"status"` // running | sealed | selected | discarded
	Count               int     `json:"count"`
	BaseRef             string  `json:"base_ref"`
	BaseCommit          string  `json:"base_commit"`
	TaskBranch          string  `json:"task_branch"`
	SelectedWorkspaceID *string `json:"selected_workspace_id"`
	ReplacedRef         *string `json:"replaced_ref"`
	// RefsState is where a decision's git side is: pending until select_attempts moved the refs,
	// done, or failed (RefsError says why; it also says why a decision was taken back).
	RefsState string            `json:"refs_state"`
	RefsError *string           `json:"refs_error"`
	Head      *string           `json:"head"` // the commit the task branch was pointed at
	CreatedAt time.Time         `json:"created_at"`
	DecidedAt *time.Time        `json:"decided_at"`
	Items     []attemptItemJSON `json:"items"`
}

// attemptBranch is attempt n's branch: the task branch with -a{n} (git cannot hold berth/KEY and
// berth/KEY/a1 at once).
func attemptBranch(taskBranch string, n int) string { return taskBranch + "-a" + strconv.Itoa(n) }

func newAttemptsJSON(g db.AttemptGroup, items []db.AttemptItem) attemptsJSON {
	out := attemptsJSON{GroupID: g.ID, Generation: g.Generation, Status: db.AttemptGroupState(g, items), Count: g.Count,
		BaseRef: g.BaseRef, BaseCommit: g.BaseCommit, TaskBranch: g.TaskBranch, SelectedWorkspaceID: optional(g.SelectedWorkspaceID),
		ReplacedRef: optional(g.ReplacedRef), RefsState: g.RefsState, RefsError: optional(g.RefsError), Head: optional(g.Head), CreatedAt: g.CreatedAt.UTC(), DecidedAt: utcPtr(g.DecidedAt),
		Items: make([]attemptItemJSON, 0, len(items))}
	for _, it := range items {
		branch := it.Branch
		if branch == "" {
			branch = attemptBranch(g.TaskBranch, it.N)
		}
		out.Items = append(out.Items, attemptItemJSON{N: it.N, ExecutionWorkspaceID: optional(it.WorkspaceID), RunID: it.RunID,
			Status: it.RunStatus, ExitCode: it.ExitCode, ErrorCode: optional(it.ErrorCode), Sealed: it.Sealed,
			FinalTreeDigest: optional(it.FinalTreeDigest), Branch: branch, RescueRef: optional(it.RescueRef),
			Selected: it.WorkspaceID != "" && it.WorkspaceID == g.SelectedWorkspaceID})
	}
	return out
}

// errWorkspaceSealed refuses a sealed workspace as a binding target or for a run.
var errWorkspaceSealed = &httpError{Status: http.StatusConflict, Code: "workspace_sealed",
	Message: "That workspace holds a sealed attempt: it takes no further runs or bindings. Select the attempt (its branch becomes the task branch) and run again, or bind another workspace."}

// refuseSealed answers 409 workspace_sealed when the workspace id names a sealed workspace of
// the company ("" and missing ones pass: other checks answer for them).
func refuseSealed(ctx context.Context, q db.Querier, a access, wsID string) error {
	if wsID == "" {
		return nil
	}
	sealed, err := db.WorkspaceSealed(ctx, q, a.Company.ID, wsID)
	if errors.Is(err, db.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if sealed {
		return errWorkspaceSealed
	}
	return nil
}

// createAttemptsAPI is POST /api/tasks/{id}/attempts (board members): 202 with the new group.
func (s *Server) createAttemptsAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "tasks", id, "attempts.create", "task")
	if err != nil {
		return err
	}
	var in attemptRequest
	if err := decodeJSON(w, r, &in); err != nil {
		return err
	}
	g, err := s.createAttempts(r.Context(), r, a, id, in)
	if err != nil {
		return err
	}
	return s.writeAttempts(w, r.Context(), a, g, http.StatusAccepted)
}

// createAttempts admits an attempt group: the task's plan must be an isolated git worktree and
// not blocked; the base commit is resolved once (outside the transaction: it may fetch) and every
// attempt forks from it. Under the task's row lock: no live run and no undecided group, then the
// group and count queued runs, each with provision enqueued, in one transaction.
func (s *Server) createAttempts(ctx context.Context, r *http.Request, a access, taskID string, in attemptRequest) (db.AttemptGroup, error) {
	if err := in.validate(); err != nil {
		return db.AttemptGroup{}, err
	}
	if s.jobs == nil {
		return db.AttemptGroup{}, errRunsUnavailable
	}
	if s.workspaces == nil {
		return db.AttemptGroup{}, errWorkspacesUnavailable
	}
	snap, err := db.LoadPlanSnapshot(ctx, s.pool, a.Company.ID, taskID)
	if err != nil {
		return db.AttemptGroup{}, err
	}
	plan := workspace.ResolvePlan(planInput(snap))
	if plan.Blocked {
		b := plan.Blockers[0]
		return db.AttemptGroup{}, &httpError{Status: http.StatusConflict, Code: b.Code, Message: b.Message + " " + b.Fix,
			Extra: map[string]any{"blockers": plan.Blockers}}
	}
	if plan.Mode != string(workspace.ModeIsolated) || plan.Strategy != string(workspace.StrategyGitWorktree) || plan.Branch == "" {
		return db.AttemptGroup{}, &httpError{Status: http.StatusConflict, Code: "attempts_need_worktree",
			Message: "Attempts run in isolated git worktrees, and this task's plan is " + plan.Mode + "/" + plan.Strategy +
				": give the project an isolated git_worktree policy (or the task an isolated mode) first."}
	}
	command := snap.Task.Command
	if in.Command != nil {
		command = *in.Command
	}
	if strings.TrimSpace(command) == "" {
		return db.AttemptGroup{}, invalid(map[string]string{"command": "The task has no command to run: give one here or edit the task."})
	}
	timeout := defaultRunTimeout
	if in.TimeoutS != nil {
		timeout = *in.TimeoutS
	}
	pw, err := db.PrimaryProjectWorkspace(ctx, s.pool, a.Company.ID, snap.Task.ProjectID)
	if err != nil {
		return db.AttemptGroup{}, err
	}
	if err := attemptsNotDeciding(ctx, s.pool, a.Company.ID, taskID); err != nil {
		return db.AttemptGroup{}, err // before the branches are looked at: they are moving
	}
	var baseRef, base string
	err = db.WithSourceLock(ctx, s.pool, a.Company.ID, pw.Source, func(ctx context.Context) error {
		var err error
		baseRef, base, err = s.workspaces.ResolveBase(ctx, pw.Source, pw.DefaultRef)
		if err != nil {
			return err
		}
		gitDir, err := s.workspaces.SourceGitDir(ctx, pw.Source)
		if err != nil {
			return err
		}
		for n := 1; n <= in.Count; n++ {
			if _, exists, err := s.workspaces.ResolveRef(ctx, gitDir, "refs/heads/"+attemptBranch(plan.Branch, n)); err != nil {
				return err
			} else if exists {
				return &httpError{Status: http.StatusConflict, Code: "attempt_branch_exists",
					Message: "Branch " + attemptBranch(plan.Branch, n) + " already exists (an earlier selected attempt keeps its branch while its workspace is open): close that workspace and delete or rename the branch first."}
			}
		}
		return nil
	})
	var he *httpError
	if errors.As(err, &he) {
		return db.AttemptGroup{}, err
	}
	if err != nil {
		s.log.WarnContext(ctx, "attempts: resolving the base failed", "task_id", taskID, "company_id", a.Company.ID, "err", err)
		return db.AttemptGroup{}, &httpError{Status: http.StatusConflict, Code: "base_unavailable",
			Message: "The project's default ref could not be resolved in its source repository; check the project workspace's source and default ref."}
	}

	var g db.AttemptGroup
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		task, err := db.LockTask(ctx, tx, a.Company.ID, taskID)
		if err != nil {
			return err
		}
		if task.ProjectStatus != "active" {
			return errProjectArchived
		}
		if live, err := db.LiveTaskRun(ctx, tx, a.Company.ID, taskID); err == nil {
			return runInProgress(live)
		} else if !errors.Is(err, db.ErrNotFound) {
			return err
		}
		if err := attemptsNotDeciding(ctx, tx, a.Company.ID, taskID); err != nil {
			return err
		}
		g, err = db.CreateAttemptGroup(ctx, tx, db.NewAttemptGroup{CompanyID: a.Company.ID, TaskID: taskID, Count: in.Count,
			Command: command, BaseRef: baseRef, BaseCommit: base, TaskBranch: plan.Branch, CreatedBy: a.P.User.ID})
		if errors.Is(err, db.ErrConflict) {
			return &httpError{Status: http.StatusConflict, Code: "attempts_undecided",
				Message: "The task has attempts waiting for a decision: select one or discard them before starting more."}
		}
		if err != nil {
			return err
		}
		for n := 1; n <= in.Count; n++ {
			ap := plan
			ap.Branch, ap.ReuseWorkspaceID = attemptBranch(plan.Branch, n), ""
			ap.Trace = append(append([]workspace.TraceStep(nil), plan.Trace...), workspace.TraceStep{Rule: "attempt",
				Effect: "isolated " + ap.Branch, Reason: "attempt " + strconv.Itoa(n) + " of " + strconv.Itoa(in.Count) + " forks from " + base})
			planJSON, err := json.Marshal(ap)
			if err != nil {
				return err
			}
			run, err := db.CreateAttemptRun(ctx, tx, db.NewRun{CompanyID: a.Company.ID, TaskID: taskID, EnvironmentID: ap.EnvironmentID,
				CreatedBy: a.P.User.ID, Command: command, Plan: planJSON, TimeoutS: timeout}, g.ID, n)
			if err != nil {
				return err
			}
			if _, err := jobs.Enqueue(ctx, s.jobs, tx, jobs.ProvisionArgs{RunID: run.ID}); err != nil {
				return nodeUnavailable(err)
			}
		}
		return s.auditTx(ctx, tx, r, a, "attempts.created", "task", taskID, map[string]any{"group_id": g.ID,
			"count": in.Count, "base_commit": base})
	})
	return g, err
}

// attemptsNotDeciding refuses new attempts while the last decision's refs are still moving
// (409 attempts_deciding).
func attemptsNotDeciding(ctx context.Context, q db.Querier, companyID, taskID string) error {
	last, err := db.LatestAttemptGroup(ctx, q, companyID, taskID)
	if errors.Is(err, db.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if last.RefsState == db.RefsPending {
		return &httpError{Status: http.StatusConflict, Code: "attempts_deciding",
			Message: "The last decision on this task's attempts is still moving their branches: start more once it is done."}
	}
	return nil
}

// taskAttemptsAPI is GET /api/tasks/{id}/attempts (readers): the task's newest attempt group.
func (s *Server) taskAttemptsAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx, id := r.Context(), r.PathValue("id")
	a, err := s.objectAccess(ctx, p, "tasks", id)
	if err != nil {
		return err
	}
	g, err := db.LatestAttemptGroup(ctx, s.pool, a.Company.ID, id)
	if errors.Is(err, db.ErrNotFound) {
		return &httpError{Status: http.StatusNotFound, Code: "no_attempts", Message: "The task has no attempts."}
	}
	if err != nil {
		return err
	}
	return s.writeAttempts(w, ctx, a, g, http.StatusOK)
}

// writeAttempts answers with the group and its attempts as they are now.
func (s *Server) writeAttempts(w http.ResponseWriter, ctx context.Context, a access, g db.AttemptGroup, status int) error {
	items, err := db.AttemptItems(ctx, s.pool, a.Company.ID, g.ID)
	if err != nil {
		return err
	}
	writeJSON(w, status, newAttemptsJSON(g, items))
	return nil
}
