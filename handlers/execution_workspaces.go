package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/jobs"
	"berth/views"
	"berth/workspace"
)

// Execution workspaces: list, detail, the operations ledger, close-readiness, close and reopen
// (DESIGN §4 "Close-readiness", §5, §8 "Close"), and a task's work products.
//
// Close is decided here, in one transaction holding the workspace row lock (AcquireLease
// share-locks the same row, so no lease can start meanwhile): close-readiness is evaluated on a
// snapshot read in that transaction plus the worktree's git state on this node; a blocked close is
// a 409 carrying the readiness; an accepted one moves the workspace to closing with generation+1
// and enqueues close_workspace with exactly the planned actions. Reopen moves a closed workspace to
// preparing with generation+1 and enqueues reopen_workspace. A client may send the generation it
// read as a fence (a different one is a 409); it never sets it.

// opLogExcerpt is how much of each operation's log the ledger list carries (its tail).
const opLogExcerpt = 4096

// workspaceJSON is an execution workspace as the API returns it. ref and cwd are opaque names
// relative to Berth's managed base, never host paths.
type workspaceJSON struct {
	ID                 string          `json:"id"`
	CompanyID          string          `json:"company_id"`
	ProjectID          string          `json:"project_id"`
	ProjectWorkspaceID *string         `json:"project_workspace_id"`
	SourceTaskID       *string         `json:"source_task_id"`
	Mode               string          `json:"mode"`
	Strategy           string          `json:"strategy"`
	Trust              string          `json:"trust"`
	Status             string          `json:"status"`
	FinalizeState      string          `json:"finalize_state"`
	Generation         int64           `json:"generation"`
	Ref                string          `json:"ref"`
	Cwd                *string         `json:"cwd"`
	BaseRef            *string         `json:"base_ref"`
	BaseCommit         *string         `json:"base_commit"`
	Branch             *string         `json:"branch"`
	BaseTreeDigest     *string         `json:"base_tree_digest"`
	Reusable           bool            `json:"reusable"`
	Plan               json.RawMessage `json:"plan"`
	ClosedAt           *time.Time      `json:"closed_at"`
	CleanupReason      *string         `json:"cleanup_reason"`
	CreatedAt          time.Time       `json:"created_at"`
	UpdatedAt          time.Time       `json:"updated_at"`
}

func newWorkspaceJSON(w db.ExecutionWorkspace) workspaceJSON {
	plan := json.RawMessage(w.Plan)
	if len(plan) == 0 || !json.Valid(plan) {
		plan = json.RawMessage("{}")
	}
	return workspaceJSON{ID: w.ID, CompanyID: w.CompanyID, ProjectID: w.ProjectID, ProjectWorkspaceID: optional(w.ProjectWorkspaceID),
		SourceTaskID: optional(w.SourceTaskID), Mode: w.Mode, Strategy: w.Strategy, Trust: w.Trust, Status: w.Status,
		FinalizeState: w.FinalizeState, Generation: w.Generation, Ref: w.Ref, Cwd: optional(w.Cwd), BaseRef: optional(w.BaseRef),
		BaseCommit: optional(w.BaseCommit), Branch: optional(w.Branch), BaseTreeDigest: optional(w.BaseTreeDigest),
		Reusable: w.Reusable, Plan: plan, ClosedAt: utcPtr(w.ClosedAt), CleanupReason: optional(w.CleanupReason),
		CreatedAt: w.CreatedAt.UTC(), UpdatedAt: w.UpdatedAt.UTC()}
}

// workspaceCursor is the keyset position of the workspace list (newest first).
type workspaceCursor struct {
	CreatedAt time.Time `json:"t"`
	ID        string    `json:"i"`
}

// workspaceQuery is a parsed list request.
type workspaceQuery struct {
	Status, ProjectID, TaskID string
	Limit                     int
	After                     workspaceCursor
}

func parseWorkspaceQuery(r *http.Request) (workspaceQuery, error) {
	q := r.URL.Query()
	out := workspaceQuery{Status: strings.TrimSpace(q.Get("status")), ProjectID: strings.TrimSpace(q.Get("project_id")),
		TaskID: strings.TrimSpace(q.Get("task_id"))}
	if out.Status != "" && !slices.Contains(db.WorkspaceStatuses, out.Status) {
		return out, badRequest("bad_filter", "status must be one of "+strings.Join(db.WorkspaceStatuses, ", ")+".")
	}
	for name, v := range map[string]string{"project_id": out.ProjectID, "task_id": out.TaskID} {
		if v != "" && !db.ValidID(v) {
			return out, badRequest("bad_filter", name+" must be an id.")
		}
	}
	limit, cursor, err := pageParams(r)
	if err != nil {
		return out, err
	}
	out.Limit = limit
	if err := decodeCursor(cursor, &out.After); err != nil {
		return out, err
	}
	if out.After.ID != "" && !db.ValidID(out.After.ID) {
		return out, badRequest("bad_cursor", "The cursor is not valid; start again without it.")
	}
	return out, nil
}

// listWorkspaces reads one page of a company's workspaces, newest first.
func (s *Server) listWorkspaces(ctx context.Context, a access, q workspaceQuery) ([]db.ExecutionWorkspace, string, error) {
	f := db.ExecutionWorkspaceFilter{Status: q.Status, ProjectID: q.ProjectID, TaskID: q.TaskID, Limit: q.Limit + 1}
	if q.After.ID != "" {
		t := q.After.CreatedAt
		f.Before, f.BeforeID = &t, q.After.ID
	}
	list, err := db.ListExecutionWorkspaces(ctx, s.pool, a.Company.ID, f)
	if err != nil {
		return nil, "", err
	}
	list, next := keysetPage(list, q.Limit, func(w db.ExecutionWorkspace) any {
		return workspaceCursor{CreatedAt: w.CreatedAt, ID: w.ID}
	})
	return list, next, nil
}

// listWorkspacesAPI is GET /api/companies/{cid}/execution-workspaces?status=&project_id=&task_id=.
func (s *Server) listWorkspacesAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	a, err := s.companyAccess(r.Context(), p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	q, err := parseWorkspaceQuery(r)
	if err != nil {
		return err
	}
	list, next, err := s.listWorkspaces(r.Context(), a, q)
	if err != nil {
		return err
	}
	out := listResponse[workspaceJSON]{Items: make([]workspaceJSON, 0, len(list)), NextCursor: next}
	for _, ws := range list {
		out.Items = append(out.Items, newWorkspaceJSON(ws))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// workspaceFor authorizes a reader for /…/execution-workspaces/{id} and reads the workspace.
func (s *Server) workspaceFor(ctx context.Context, p *principal, id string) (access, db.ExecutionWorkspace, error) {
	a, err := s.objectAccess(ctx, p, "execution_workspaces", id)
	if err != nil {
		return access{}, db.ExecutionWorkspace{}, err
	}
	ws, err := db.ExecutionWorkspaceByID(ctx, s.pool, a.Company.ID, id)
	return a, ws, err
}

// getWorkspaceAPI is GET /api/execution-workspaces/{id}.
func (s *Server) getWorkspaceAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	_, ws, err := s.workspaceFor(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, newWorkspaceJSON(ws))
	return nil
}

// operationJSON is one ledger step with the tail of its log.
type operationJSON struct {
	ID           string     `json:"id"`
	RunID        *string    `json:"run_id"`
	TaskID       *string    `json:"task_id"`
	Phase        string     `json:"phase"`
	Command      string     `json:"command"`
	Cwd          string     `json:"cwd"`
	Status       string     `json:"status"`
	ExitCode     *int       `json:"exit_code"`
	Error        *string    `json:"error"`
	LogExcerpt   string     `json:"log_excerpt"`
	LogBytes     int64      `json:"log_bytes"`
	LogSHA256    string     `json:"log_sha256"`
	LogTruncated bool       `json:"log_truncated"`
	StartedAt    time.Time  `json:"started_at"`
	FinishedAt   *time.Time `json:"finished_at"`
}

func newOperationJSON(o db.Operation) operationJSON {
	return operationJSON{ID: o.ID, RunID: optional(o.RunID), TaskID: optional(o.TaskID), Phase: o.Phase, Command: o.Command,
		Cwd: o.Cwd, Status: o.Status, ExitCode: o.ExitCode, Error: optional(o.Error), LogExcerpt: logText(o.Log),
		LogBytes: o.LogBytes, LogSHA256: o.LogSHA256, LogTruncated: o.LogTruncated, StartedAt: o.StartedAt.UTC(),
		FinishedAt: utcPtr(o.FinishedAt)}
}

// logText makes log bytes fit for JSON and HTML: invalid UTF-8 (a cut multi-byte character, binary
// output) becomes U+FFFD.
func logText(b []byte) string { return strings.ToValidUTF8(string(b), "\uFFFD") }

// listOperationsAPI is GET /api/execution-workspaces/{id}/operations: the ledger, oldest first,
// each step with the last 4 KiB of its log.
func (s *Server) listOperationsAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	a, ws, err := s.workspaceFor(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	limit, cursor, err := pageParams(r)
	if err != nil {
		return err
	}
	var after db.OperationCursor
	if err := decodeCursor(cursor, &after); err != nil {
		return err
	}
	if after.ID != "" && !db.ValidID(after.ID) {
		return badRequest("bad_cursor", "The cursor is not valid; start again without it.")
	}
	ops, err := db.WorkspaceOperationsPage(r.Context(), s.pool, a.Company.ID, ws.ID, after, limit+1, opLogExcerpt)
	if err != nil {
		return err
	}
	ops, next := keysetPage(ops, limit, func(o db.Operation) any { return db.OperationCursor{StartedAt: o.StartedAt, ID: o.ID} })
	out := listResponse[operationJSON]{Items: make([]operationJSON, 0, len(ops)), NextCursor: next}
	for _, o := range ops {
		out.Items = append(out.Items, newOperationJSON(o))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// operationLogAPI is GET /api/execution-workspaces/{id}/operations/{op_id}/log: the stored log of
// one step as text/plain.
func (s *Server) operationLogAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	a, ws, err := s.workspaceFor(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	op, err := db.WorkspaceOperationByID(r.Context(), s.pool, a.Company.ID, ws.ID, r.PathValue("op_id"))
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, err = w.Write(op.Log)
	return err
}

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
	if !shared && !settled {
		root, err := s.workspaces.Root(ws.Ref)
		cw.Managed = err == nil && root != ""
		if cw.Managed && cw.Strategy == workspace.StrategyGitWorktree {
			gs, err := s.workspaces.GitState(ctx, root, ws.BaseRef)
			if err != nil {
				return closeFacts{}, err
			}
			snap.Git = &gs
		}
	}
	snap.Workspace = cw
	rd := workspace.EvaluateClose(snap)
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
		var err error
		if ws, err = db.LockExecutionWorkspace(ctx, tx, a.Company.ID, id); err != nil {
			return err
		}
		if ws.Status == db.WorkspaceClosed {
			status = http.StatusOK
			return nil
		}
		if gen != nil && *gen != ws.Generation {
			return staleGeneration(ws)
		}
		switch ws.Status {
		case db.WorkspaceClosing:
			return nil // already accepted; the job is on it
		case db.WorkspacePreparing:
			return &httpError{Status: http.StatusConflict, Code: "workspace_preparing",
				Message: "The workspace is being prepared (reopened); close it once it is ready or has failed."}
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
		if _, err := s.jobs.InsertTx(ctx, tx, args, nil); err != nil {
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
		var err error
		if ws, err = db.LockExecutionWorkspace(ctx, tx, a.Company.ID, id); err != nil {
			return err
		}
		if ws.Status == db.WorkspaceReady {
			status = http.StatusOK
			return nil
		}
		if gen != nil && *gen != ws.Generation {
			return staleGeneration(ws)
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
		if _, err := s.jobs.InsertTx(ctx, tx, jobs.ReopenWorkspaceArgs{CompanyID: ws.CompanyID, WorkspaceID: ws.ID,
			Generation: ws.Generation}, nil); err != nil {
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

// workProductJSON is a work product as the API returns it.
type workProductJSON struct {
	ID                   string         `json:"id"`
	TaskID               *string        `json:"task_id"`
	RunID                *string        `json:"run_id"`
	ExecutionWorkspaceID *string        `json:"execution_workspace_id"`
	Kind                 string         `json:"kind"`
	Ref                  *string        `json:"ref"`
	URL                  *string        `json:"url"`
	Path                 *string        `json:"path"`
	Metadata             map[string]any `json:"metadata"`
	CreatedAt            time.Time      `json:"created_at"`
}

func newWorkProductJSON(p db.WorkProduct) workProductJSON {
	meta := p.Metadata
	if meta == nil {
		meta = map[string]any{}
	}
	return workProductJSON{ID: p.ID, TaskID: optional(p.TaskID), RunID: optional(p.RunID),
		ExecutionWorkspaceID: optional(p.ExecutionWorkspaceID), Kind: p.Kind, Ref: optional(p.Ref), URL: optional(p.URL),
		Path: optional(p.Path), Metadata: meta, CreatedAt: p.CreatedAt.UTC()}
}

// taskWorkProductsAPI is GET /api/tasks/{id}/work-products: any reader; newest first. They outlive
// the workspace they came from.
func (s *Server) taskWorkProductsAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.objectAccess(r.Context(), p, "tasks", id)
	if err != nil {
		return err
	}
	limit, cursor, err := pageParams(r)
	if err != nil {
		return err
	}
	var after db.WorkProductCursor
	if err := decodeCursor(cursor, &after); err != nil {
		return err
	}
	if after.ID != "" && !db.ValidID(after.ID) {
		return badRequest("bad_cursor", "The cursor is not valid; start again without it.")
	}
	list, err := db.TaskWorkProductsPage(r.Context(), s.pool, a.Company.ID, id, after, limit+1)
	if err != nil {
		return err
	}
	list, next := keysetPage(list, limit, func(p db.WorkProduct) any { return db.WorkProductCursor{CreatedAt: p.CreatedAt, ID: p.ID} })
	out := listResponse[workProductJSON]{Items: make([]workProductJSON, 0, len(list)), NextCursor: next}
	for _, p := range list {
		out.Items = append(out.Items, newWorkProductJSON(p))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// ---- Pages ----

// workspacesPage is GET /companies/{cid}/workspaces: the company's execution workspaces with
// status, project and task filters, newest first.
func (s *Server) workspacesPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	a, err := s.companyAccess(ctx, p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	q, err := parseWorkspaceQuery(r)
	if err != nil {
		return err
	}
	list, next, err := s.listWorkspaces(ctx, a, q)
	if err != nil {
		return err
	}
	projects, err := db.ListProjects(ctx, s.pool, a.Company.ID, "", "", maxPageLimit)
	if err != nil {
		return err
	}
	names := map[string]string{}
	d := views.WorkspacesData{CompanyID: a.Company.ID, Status: q.Status, ProjectID: q.ProjectID, TaskID: q.TaskID,
		Statuses: db.WorkspaceStatuses}
	for _, pr := range projects {
		names[pr.ID] = pr.Name
		d.Projects = append(d.Projects, views.TaskOption{Value: pr.ID, Label: pr.Key + " · " + pr.Name})
	}
	var taskIDs []string
	for _, ws := range list {
		taskIDs = append(taskIDs, ws.SourceTaskID)
	}
	if q.TaskID != "" {
		taskIDs = append(taskIDs, q.TaskID)
	}
	labels, err := db.TaskLabels(ctx, s.pool, a.Company.ID, taskIDs)
	if err != nil {
		return err
	}
	if q.TaskID != "" {
		d.TaskKey = labels[q.TaskID].Key
	}
	for _, ws := range list {
		d.Items = append(d.Items, views.WorkspaceRow{ID: ws.ID, Ref: ws.Ref, Status: ws.Status, Mode: ws.Mode,
			Strategy: ws.Strategy, Branch: ws.Branch, ProjectID: ws.ProjectID, ProjectName: names[ws.ProjectID],
			TaskID: ws.SourceTaskID, TaskKey: labels[ws.SourceTaskID].Key, Generation: ws.Generation,
			CreatedAt: ws.CreatedAt, ClosedAt: ws.ClosedAt})
	}
	if next != "" {
		d.NextURL = workspacesPageURL(a.Company.ID, q, next)
	}
	if htmxTarget(r, "workspaces-view") {
		return s.render(w, r, views.WorkspacesView(d))
	}
	return s.render(w, r, views.WorkspacesPage(s.companyFrame(r, a, "Workspaces", "workspaces"), d))
}

// workspacesPageURL is the list page with the same filters and limit, at cursor.
func workspacesPageURL(companyID string, q workspaceQuery, cursor string) string {
	v := url.Values{}
	for k, val := range map[string]string{"status": q.Status, "project_id": q.ProjectID, "task_id": q.TaskID} {
		if val != "" {
			v.Set(k, val)
		}
	}
	if q.Limit != defaultPageLimit {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	v.Set("cursor", cursor)
	return "/companies/" + companyID + "/workspaces?" + v.Encode()
}

// workspacePageData gathers everything the workspace page shows.
func (s *Server) workspacePageData(ctx context.Context, a access, ws db.ExecutionWorkspace, confirm bool) (views.WorkspacePageData, error) {
	d := views.WorkspacePageData{ID: ws.ID, CompanyID: ws.CompanyID, Ref: ws.Ref, Status: ws.Status, Mode: ws.Mode,
		Strategy: ws.Strategy, Trust: ws.Trust, Branch: ws.Branch, BaseRef: ws.BaseRef, BaseCommit: ws.BaseCommit,
		TreeDigest: ws.BaseTreeDigest, FinalizeState: ws.FinalizeState, CleanupReason: ws.CleanupReason,
		Generation: ws.Generation, CreatedAt: ws.CreatedAt, ClosedAt: ws.ClosedAt, ProjectID: ws.ProjectID,
		TaskID: ws.SourceTaskID, CanManage: a.canManage() && s.jobs != nil,
		Live: ws.Status == db.WorkspaceClosing || ws.Status == db.WorkspacePreparing}
	if pr, err := db.ProjectByID(ctx, s.pool, a.Company.ID, ws.ProjectID); err == nil {
		d.ProjectName = pr.Name
	} else if !errors.Is(err, db.ErrNotFound) {
		return d, err
	}
	var plan workspace.Plan
	if json.Unmarshal(ws.Plan, &plan) == nil {
		d.PlanMode, d.PlanStrategy, d.PlanBranch, d.PlanHostScripts = plan.Mode, plan.Strategy, plan.Branch, plan.HostScriptsAllowed
		for _, t := range plan.Trace {
			d.Trace = append(d.Trace, views.PlanStep{Rule: t.Rule, Effect: t.Effect, Reason: t.Reason})
		}
	}
	ops, err := db.WorkspaceOperationsPage(ctx, s.pool, a.Company.ID, ws.ID, db.OperationCursor{}, maxPageLimit, 16<<10)
	if err != nil {
		return d, err
	}
	for _, o := range ops {
		d.Operations = append(d.Operations, views.WorkspaceOpRow{ID: o.ID, RunID: o.RunID, LogBytes: o.LogBytes,
			LogTruncated: o.LogTruncated, Excerpt: int64(len(o.Log)) < o.LogBytes,
			OperationRow: views.OperationRow{Phase: o.Phase, Command: o.Command, Status: o.Status, ExitCode: o.ExitCode,
				Error: o.Error, Log: logText(o.Log), StartedAt: o.StartedAt, FinishedAt: o.FinishedAt}})
	}
	runs, err := db.WorkspaceRuns(ctx, s.pool, a.Company.ID, ws.ID, 20)
	if err != nil {
		return d, err
	}
	var taskIDs []string
	for _, r := range runs {
		taskIDs = append(taskIDs, r.TaskID)
	}
	taskIDs = append(taskIDs, ws.SourceTaskID)
	labels, err := db.TaskLabels(ctx, s.pool, a.Company.ID, taskIDs)
	if err != nil {
		return d, err
	}
	d.TaskKey, d.TaskTitle = labels[ws.SourceTaskID].Key, labels[ws.SourceTaskID].Title
	for _, r := range runs {
		d.Runs = append(d.Runs, views.WorkspaceRunRow{ID: r.ID, TaskKey: labels[r.TaskID].Key, Status: r.Status,
			ErrorCode: r.ErrorCode, CreatedAt: r.CreatedAt})
	}
	leases, err := db.WorkspaceLeases(ctx, s.pool, a.Company.ID, ws.ID, false, 20)
	if err != nil {
		return d, err
	}
	for _, l := range leases {
		d.Leases = append(d.Leases, views.WorkspaceLeaseRow{ID: l.ID, Status: l.Status, RunID: l.RunID, Generation: l.Generation,
			CleanupStatus: l.CleanupStatus, AcquiredAt: l.AcquiredAt, ReleasedAt: l.ReleasedAt, FailureReason: l.FailureReason})
	}
	products, err := db.WorkspaceWorkProducts(ctx, s.pool, a.Company.ID, ws.ID, 50)
	if err != nil {
		return d, err
	}
	for _, p := range products {
		row := views.WorkProductRow{Kind: p.Kind, Ref: p.Ref, URL: p.URL, Path: p.Path, RunID: p.RunID, CreatedAt: p.CreatedAt}
		if v, ok := p.Metadata["rescue_ref"].(string); ok {
			row.Detail = "rescue ref " + v
		} else if v, ok := p.Metadata["branch"].(string); ok {
			row.Detail = "on " + v
		}
		d.WorkProducts = append(d.WorkProducts, row)
	}
	d.Readiness = views.WorkspaceReadinessView{Confirmed: confirm}
	if ws.Status == db.WorkspaceClosed || d.Live {
		return d, nil // the panel shows the close or the rebuild, not readiness
	}
	facts, err := s.evaluateClose(ctx, s.pool, ws, confirm)
	var he *httpError
	switch {
	case errors.As(err, &he):
		d.Readiness.Unavailable = he.Message
	case err != nil:
		return d, err
	default:
		d.Readiness = readinessView(facts.Readiness)
	}
	return d, nil
}

// readinessView phrases readiness for the page.
func readinessView(r readinessJSON) views.WorkspaceReadinessView {
	v := views.WorkspaceReadinessView{State: r.State, DestructiveRequired: r.DestructiveRequired, Shared: r.Shared,
		Confirmed: r.ConfirmDestructive}
	overridable := len(r.BlockingReasons) > 0
	for _, b := range r.BlockingReasons {
		v.Blockers = append(v.Blockers, views.WorkspaceReason{Code: b.Code, Message: b.Message})
		if b.Code != workspace.BlockDirtyWorktree && b.Code != workspace.BlockUnmergedWork {
			overridable = false
		}
	}
	v.Closable = r.State != workspace.ReadinessBlocked || overridable
	for _, x := range r.Warnings {
		v.Warnings = append(v.Warnings, views.WorkspaceReason{Code: x.Code, Message: x.Message})
	}
	for _, t := range r.LinkedTasks {
		v.LinkedTasks = append(v.LinkedTasks, views.WorkspaceLinkedTask{ID: t.ID, Key: t.Key, Status: t.Status, Open: t.Open})
	}
	if g := r.Git; g != nil {
		v.Git = &views.WorkspaceGit{Dirty: g.Dirty, Untracked: g.Untracked, Ahead: g.Ahead, Behind: g.Behind, Merged: g.Merged, Readable: g.Readable}
	}
	for _, act := range r.PlannedActions {
		v.Actions = append(v.Actions, views.WorkspaceAction{Kind: act.Kind, Label: act.Label, Command: act.Command})
	}
	return v
}

// workspacePage is GET /workspaces/{id}; ?confirm_destructive=1 previews a destructive close.
func (s *Server) workspacePage(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	a, ws, err := s.workspaceFor(ctx, p, r.PathValue("id"))
	if err != nil {
		return err
	}
	d, err := s.workspacePageData(ctx, a, ws, boolParam(r.URL.Query().Get("confirm_destructive")))
	if err != nil {
		return err
	}
	if isHTMX(r) && r.URL.Query().Get("fragment") == "body" {
		return s.render(w, r, views.WorkspaceBody(d))
	}
	return s.render(w, r, views.WorkspacePage(s.companyFrame(r, a, "Workspace "+shortRef(ws.Ref), "workspaces"), d))
}

// shortRef is the recognizable start of a workspace ref.
func shortRef(ref string) string {
	if len(ref) > 11 {
		return ref[:11]
	}
	return ref
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
		form, err := taskFormValues(w, r)
		if err != nil {
			return err
		}
		var gen *int64
		if g, convErr := strconv.ParseInt(form.Get("generation"), 10, 64); convErr == nil {
			gen = &g
		}
		confirm := boolParam(form.Get("confirm_destructive"))
		if closing {
			_, _, err = s.closeWorkspace(ctx, r, a, id, confirm, gen)
		} else {
			_, _, err = s.reopenWorkspace(ctx, r, a, id, gen)
		}
		var he *httpError
		if err != nil && (!errors.As(err, &he) || he.Status != http.StatusConflict) {
			return err
		}
		if err == nil {
			http.Redirect(w, r, "/workspaces/"+id, http.StatusSeeOther)
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
		d.Notice, d.NoticeError = he.Message, true
		return s.renderStatus(w, r, http.StatusConflict, views.WorkspacePage(s.companyFrame(r, a, "Workspace "+shortRef(ws.Ref), "workspaces"), d))
	}
}
