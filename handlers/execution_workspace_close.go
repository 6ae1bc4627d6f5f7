package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/jobs"
	"berth/views"
	"berth/workspace"
)

// Close-readiness, close and reopen of an execution workspace, from the API and the workspace
// page's forms (docs/api.md "Execution workspaces", docs/runs.md "Continuing, closing, reopening").
//
// Close is decided here, in one transaction holding the workspace row lock (AcquireLease
// share-locks the same row, so no lease can start meanwhile): close-readiness is evaluated on a
// snapshot read in that transaction plus the worktree's git state on this node; a blocked close is
// a 409 carrying the readiness; an accepted one moves the workspace to closing with generation+1
// and enqueues close_workspace with exactly the planned actions. Reopen moves a closed workspace to
// preparing with generation+1 and enqueues reopen_workspace. A client may send the generation it
// read as a fence (a different one is a 409); it never sets it.

// errWorkspacesUnavailable is answered where this process cannot see workspace directories.
var errWorkspacesUnavailable = &httpError{Status: http.StatusServiceUnavailable, Code: "workspaces_unavailable",
	Message: "This server has no access to workspace directories, so it cannot check what closing would lose. Ask a server that runs workers."}

// readinessJSON is the close-readiness answer: workspace.Readiness plus what identifies the
// workspace state it was computed for (send generation back with the close as its fence).
type readinessJSON struct {
	workspace.Readiness
	WorkspaceID        string `json:"workspace_id"`
	Status             string `json:"status"`
	Generation         int64  `json:"generation"`
	ConfirmDestructive bool   `json:"confirm_destructive"`
}

// closeFacts is a readiness evaluation and what the close job needs to carry it out.
type closeFacts struct {
	Readiness readinessJSON
	Args      jobs.CloseWorkspaceArgs
	Tasks     []db.WorkspaceTask
}

// evaluateClose reads the close snapshot of ws through q (the closing transaction, or the pool)
// and this node's git state of its worktree, and evaluates close-readiness.
func (s *Server) evaluateClose(ctx context.Context, q db.Querier, ws db.ExecutionWorkspace, confirm bool) (closeFacts, error) {
	shared := ws.Mode == string(workspace.ModeShared) || ws.Strategy == string(workspace.StrategyShared)
	settled := ws.Status == db.WorkspaceClosed || ws.Status == db.WorkspaceClosing
	if !shared && !settled && s.workspaces == nil {
		return closeFacts{}, errWorkspacesUnavailable
	}
	var plan workspace.Plan
	_ = json.Unmarshal(ws.Plan, &plan)
	cw := workspace.CloseWorkspace{ID: ws.ID, Mode: ws.Mode, Strategy: workspace.Strategy(ws.Strategy), Status: ws.Status,
		Generation: ws.Generation, RootRel: ws.Ref, Branch: ws.Branch, BaseRef: strings.TrimPrefix(ws.BaseRef, "refs/heads/"),
		HostScriptsAllowed: plan.HostScriptsAllowed}
	if ws.ProjectWorkspaceID != "" {
		pw, err := db.ProjectWorkspaceByID(ctx, q, ws.CompanyID, ws.ProjectWorkspaceID)
		if err != nil && !errors.Is(err, db.ErrNotFound) {
			return closeFacts{}, err
		}
		cw.CleanupCommand = pw.CleanupCommand
	}
	snap := workspace.CloseSnapshot{FinalizeState: ws.FinalizeState, ConfirmDestructive: confirm, Services: []workspace.CloseService{}}
	runs, err := db.WorkspaceLiveRuns(ctx, q, ws.CompanyID, ws.ID)
	if err != nil {
		return closeFacts{}, err
	}
	for _, r := range runs {
		snap.Runs = append(snap.Runs, workspace.CloseRun{ID: r.ID, Status: r.Status})
	}
	leases, err := db.WorkspaceLeases(ctx, q, ws.CompanyID, ws.ID, true, 0)
	if err != nil {
		return closeFacts{}, err
	}
	for _, l := range leases {
		snap.Leases = append(snap.Leases, workspace.CloseLease{ID: l.ID, Status: l.Status})
	}
	tasks, err := db.WorkspaceLinkedTasks(ctx, q, ws.CompanyID, ws.ID)
	if err != nil {
		return closeFacts{}, err
	}
	for _, t := range tasks {
		snap.LinkedTasks = append(snap.LinkedTasks, workspace.CloseTask{ID: t.ID, Key: t.Key, Status: t.Status})
	}
	var remote *remoteGit
	if !shared && !settled {
		if remote, err = s.remoteWorkspaceGit(ctx, ws); err != nil { // on another node's disk (internal_workspace.go)
			return closeFacts{}, err
		}
	}
	if remote != nil {
		cw.Managed, snap.Git = remote.Managed, remote.Git
	} else if !shared && !settled {
		root, err := s.workspaces.Root(ws.Ref)
		cw.Managed = err == nil && root != ""
		if cw.Managed && cw.Strategy == workspace.StrategyGitWorktree {
			gs, err := s.workspaces.GitState(ctx, ws.Ref, ws.BaseRef)
			if err != nil {
				return closeFacts{}, err
			}
			snap.Git = &gs
		}
	}
	snap.Workspace = cw
	rd := workspace.EvaluateClose(snap)
	if rd.Git != nil && remote != nil && remote.CommitsSinceBase != nil {
		rd.Git.CommitsSinceBase = remote.CommitsSinceBase
	}
	if rd.Git != nil && rd.Git.Readable && snap.Git != nil && ws.BaseCommit != "" {
		if n, err := s.workspaces.CommitsSince(ctx, ws.Ref, ws.BaseCommit); err == nil {
			rd.Git.CommitsSinceBase = &n
		}
	}
	args := jobs.CloseWorkspaceArgs{CompanyID: ws.CompanyID, WorkspaceID: ws.ID, EnvironmentID: plan.EnvironmentID}
	for _, act := range rd.PlannedActions {
		switch act.Kind {
		case workspace.ActionRescueRef:
			args.Rescue = true
		case workspace.ActionCleanupCommand:
			args.CleanupCommand = cw.CleanupCommand
		case workspace.ActionRemoveDirectory:
			args.Remove = true
		}
	}
	return closeFacts{Readiness: readinessJSON{Readiness: rd, WorkspaceID: ws.ID, Status: ws.Status, Generation: ws.Generation,
		ConfirmDestructive: confirm}, Args: args, Tasks: tasks}, nil
}

// boolParam reads a boolean query or form value: true, 1, on, yes.
func boolParam(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "on", "yes":
		return true
	}
	return false
}

// closeReadinessAPI is GET /api/execution-workspaces/{id}/close-readiness?confirm_destructive=true.
func (s *Server) closeReadinessAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	_, ws, err := s.workspaceFor(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	facts, err := s.evaluateClose(r.Context(), s.pool, ws, boolParam(r.URL.Query().Get("confirm_destructive")))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, facts.Readiness)
	return nil
}

// workspacePatch is the body of PATCH /api/execution-workspaces/{id}: a status action and its
// options. generation is only a fence; every other field is the server's.
type workspacePatch struct {
	Status             *string `json:"status"`
	ConfirmDestructive *bool   `json:"confirm_destructive"`
	Generation         *int64  `json:"generation"`

	ID                 json.RawMessage `json:"id"`
	CompanyID          json.RawMessage `json:"company_id"`
	ProjectID          json.RawMessage `json:"project_id"`
	ProjectWorkspaceID json.RawMessage `json:"project_workspace_id"`
	SourceTaskID       json.RawMessage `json:"source_task_id"`
	Mode               json.RawMessage `json:"mode"`
	Strategy           json.RawMessage `json:"strategy"`
	Trust              json.RawMessage `json:"trust"`
	FinalizeState      json.RawMessage `json:"finalize_state"`
	Ref                json.RawMessage `json:"ref"`
	Cwd                json.RawMessage `json:"cwd"`
	BaseRef            json.RawMessage `json:"base_ref"`
	BaseCommit         json.RawMessage `json:"base_commit"`
	Branch             json.RawMessage `json:"branch"`
	BaseTreeDigest     json.RawMessage `json:"base_tree_digest"`
	Reusable           json.RawMessage `json:"reusable"`
	Plan               json.RawMessage `json:"plan"`
	ClosedAt           json.RawMessage `json:"closed_at"`
	CleanupReason      json.RawMessage `json:"cleanup_reason"`
	CreatedAt          json.RawMessage `json:"created_at"`
	UpdatedAt          json.RawMessage `json:"updated_at"`
}

// check refuses server-owned members and anything that is not a close or a reopen (400).
func (in workspacePatch) check() error {
	for name, v := range map[string]json.RawMessage{"id": in.ID, "company_id": in.CompanyID, "project_id": in.ProjectID,
		"project_workspace_id": in.ProjectWorkspaceID, "source_task_id": in.SourceTaskID, "mode": in.Mode,
		"strategy": in.Strategy, "trust": in.Trust, "finalize_state": in.FinalizeState, "ref": in.Ref, "cwd": in.Cwd,
		"base_ref": in.BaseRef, "base_commit": in.BaseCommit, "branch": in.Branch, "base_tree_digest": in.BaseTreeDigest,
		"reusable": in.Reusable, "plan": in.Plan, "closed_at": in.ClosedAt, "cleanup_reason": in.CleanupReason,
		"created_at": in.CreatedAt, "updated_at": in.UpdatedAt} {
		if v != nil {
			return badRequest("server_owned_field", name+" is set by the server and cannot be changed.")
		}
	}
	if in.Status == nil {
		return badRequest("status_required", `Send {"status":"closed"} to close the workspace or {"status":"ready"} to reopen it.`)
	}
	switch *in.Status {
	case db.WorkspaceClosed:
	case db.WorkspaceReady:
		if in.ConfirmDestructive != nil {
			return badRequest("bad_field", "confirm_destructive applies only to a close.")
		}
	default:
		return badRequest("bad_status", `status must be "closed" (close) or "ready" (reopen); other statuses are set by the server.`)
	}
	if in.Generation != nil && *in.Generation < 1 {
		return badRequest("bad_generation", "generation must be the workspace's current generation, 1 or more.")
	}
	return nil
}

// staleGeneration is the 409 for a fence that no longer matches.
func staleGeneration(ws db.ExecutionWorkspace) error {
	return &httpError{Status: http.StatusConflict, Code: "stale_generation",
		Message: "The workspace changed since you read it (it is at generation " + strconv.FormatInt(ws.Generation, 10) +
			" and " + ws.Status + "). Read it again and retry.",
		Extra: map[string]any{"current": newWorkspaceJSON(ws)}}
}

// lockFenced locks workspace id in tx for a close or a reopen: done when it already has the
// target status (the action is a no-op), a 409 stale_generation when gen is given and behind.
func lockFenced(ctx context.Context, tx pgx.Tx, a access, id string, gen *int64, target string) (db.ExecutionWorkspace, bool, error) {
	ws, err := db.LockExecutionWorkspace(ctx, tx, a.Company.ID, id)
	if err != nil {
		return ws, false, err
	}
	if ws.Status == target {
		return ws, true, nil
	}
	if gen != nil && *gen != ws.Generation {
		return ws, false, staleGeneration(ws)
	}
	return ws, false, nil
}

// closeWorkspace accepts a close: 202 (closing, close_workspace enqueued), 200 when already
// closed, 409 when blocked (error.readiness), fenced (stale_generation) or preparing.
func (s *Server) closeWorkspace(ctx context.Context, r *http.Request, a access, id string, confirm bool, gen *int64) (db.ExecutionWorkspace, int, error) {
	if s.jobs == nil {
		return db.ExecutionWorkspace{}, 0, errRunsUnavailable
	}
	var (
		ws     db.ExecutionWorkspace
		status = http.StatusAccepted
	)
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		var done bool
		var err error
		if ws, done, err = lockFenced(ctx, tx, a, id, gen, db.WorkspaceClosed); err != nil || done {
			if done {
				status = http.StatusOK
			}
			return err
		}
		switch ws.Status {
		case db.WorkspaceClosing:
			return nil // already accepted; the job is on it
		case db.WorkspacePreparing:
			return &httpError{Status: http.StatusConflict, Code: "workspace_preparing",
				Message: "The workspace is being prepared (reopened); close it once it is ready or has failed."}
		}
		if closed, ok, err := s.closeOnDeadNode(ctx, tx, r, a, ws); ok || err != nil { // nodes_close.go
			ws = closed
			return err
		}
		facts, err := s.evaluateClose(ctx, tx, ws, confirm)
		if err != nil {
			return err
		}
		if facts.Readiness.State == workspace.ReadinessBlocked {
			msg := "The workspace cannot be closed yet."
			if len(facts.Readiness.BlockingReasons) > 0 {
				msg = facts.Readiness.BlockingReasons[0].Message
			}
			return &httpError{Status: http.StatusConflict, Code: "close_blocked", Message: msg,
				Extra: map[string]any{"readiness": facts.Readiness}}
		}
		if ws, err = db.BeginWorkspaceClose(ctx, tx, ws.ID, ws.Generation); err != nil {
			return err
		}
		args := facts.Args
		args.Generation = ws.Generation
		if _, err := jobs.Enqueue(ctx, s.jobs, tx, args); err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "execution_workspace.close_requested", "execution_workspace", ws.ID,
			map[string]any{"generation": ws.Generation, "confirm_destructive": confirm, "rescue": args.Rescue,
				"cleanup_command": args.CleanupCommand != "", "remove": args.Remove, "state": facts.Readiness.State})
	})
	if err != nil {
		return db.ExecutionWorkspace{}, 0, err
	}
	return ws, status, nil
}

// reopenWorkspace accepts a reopen of a closed workspace: 202 (preparing, reopen_workspace
// enqueued); 200 when it is already ready; 409 otherwise.
func (s *Server) reopenWorkspace(ctx context.Context, r *http.Request, a access, id string, gen *int64) (db.ExecutionWorkspace, int, error) {
	if s.jobs == nil {
		return db.ExecutionWorkspace{}, 0, errRunsUnavailable
	}
	var (
		ws     db.ExecutionWorkspace
		status = http.StatusAccepted
	)
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		var done bool
		var err error
		if ws, done, err = lockFenced(ctx, tx, a, id, gen, db.WorkspaceReady); err != nil || done {
			if done {
				status = http.StatusOK
			}
			return err
		}
		switch ws.Status {
		case db.WorkspacePreparing:
			return nil // already being rebuilt
		case db.WorkspaceClosed:
		default:
			return &httpError{Status: http.StatusConflict, Code: "not_closed",
				Message: "Only a closed workspace can be reopened; this one is " + ws.Status + ".",
				Extra:   map[string]any{"current": newWorkspaceJSON(ws)}}
		}
		if ws.ProjectWorkspaceID == "" {
			return &httpError{Status: http.StatusConflict, Code: "source_gone",
				Message: "The project workspace this workspace came from was deleted, so it cannot be rebuilt. Start a new run instead."}
		}
		if ws, err = db.BeginWorkspaceReopen(ctx, tx, ws.ID, ws.Generation); err != nil {
			return err
		}
		if _, err := jobs.Enqueue(ctx, s.jobs, tx, jobs.ReopenWorkspaceArgs{CompanyID: ws.CompanyID, WorkspaceID: ws.ID,
			Generation: ws.Generation}); err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "execution_workspace.reopen_requested", "execution_workspace", ws.ID,
			map[string]any{"generation": ws.Generation})
	})
	if err != nil {
		return db.ExecutionWorkspace{}, 0, err
	}
	return ws, status, nil
}

// patchWorkspaceAPI is PATCH /api/execution-workspaces/{id} (board members):
// {status:"closed", confirm_destructive, generation} closes, {status:"ready", generation} reopens.
func (s *Server) patchWorkspaceAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "execution_workspaces", id, "execution_workspace.update", "execution_workspace")
	if err != nil {
		return err
	}
	var in workspacePatch
	if err := decodeJSON(w, r, &in); err != nil {
		return err
	}
	if err := in.check(); err != nil {
		return err
	}
	var (
		ws     db.ExecutionWorkspace
		status int
	)
	if *in.Status == db.WorkspaceClosed {
		ws, status, err = s.closeWorkspace(r.Context(), r, a, id, in.ConfirmDestructive != nil && *in.ConfirmDestructive, in.Generation)
	} else {
		ws, status, err = s.reopenWorkspace(r.Context(), r, a, id, in.Generation)
	}
	if err != nil {
		return err
	}
	writeJSON(w, status, newWorkspaceJSON(ws))
	return nil
}

// workspaceFormAction is POST /workspaces/{id}/close and /reopen (board members): the same core as
// the API; success goes back to the page (303), a refusal re-renders it with the reason.
func (s *Server) workspaceFormAction(closing bool) func(http.ResponseWriter, *http.Request, *principal) error {
	return func(w http.ResponseWriter, r *http.Request, p *principal) error {
		ctx, id := r.Context(), r.PathValue("id")
		action := "execution_workspace.reopen"
		if closing {
			action = "execution_workspace.close"
		}
		a, err := s.manageObject(r, p, "execution_workspaces", id, action, "execution_workspace")
		if err != nil {
			return err
		}
		form, err := readForm(w, r, maxTextFormBody)
		if err != nil {
			return err
		}
		var gen *int64
		if g, convErr := strconv.ParseInt(form.Get("generation"), 10, 64); convErr == nil {
			gen = &g
		}
		confirm := boolParam(form.Get("confirm_destructive"))
		var accepted db.ExecutionWorkspace
		if closing {
			accepted, _, err = s.closeWorkspace(ctx, r, a, id, confirm, gen)
		} else {
			accepted, _, err = s.reopenWorkspace(ctx, r, a, id, gen)
		}
		he, refused := formRefusal(err)
		if err != nil && !refused {
			return err
		}
		if err == nil {
			flash := views.WorkspaceActionFlash(closing, accepted.Mode, accepted.Strategy, accepted.Status)
			http.Redirect(w, r, withFlash("/workspaces/"+id, flash), http.StatusSeeOther)
			return nil
		}
		ws, err := db.ExecutionWorkspaceByID(ctx, s.pool, a.Company.ID, id)
		if err != nil {
			return err
		}
		d, err := s.workspacePageData(ctx, a, ws, confirm)
		if err != nil {
			return err
		}
		d.Notice, d.NoticeError = refusalMessage(he), true
		return s.renderStatus(w, r, he.Status, views.WorkspacePage(s.companyFrame(r, a, "Workspace "+shortRef(ws.Ref), "workspaces"), d))
	}
}
