package handlers

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"berth/db"
)

// Execution workspaces in the JSON API: list, detail, the operations ledger and a task's work
// products (docs/api.md "Execution workspaces"). Close-readiness, close and reopen are in
// execution_workspace_close.go; the pages in execution_workspace_pages.go.

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
	NodeID             *string         `json:"node_id"` // the node whose disk holds it (docs/scaling.md)
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
		CreatedAt: w.CreatedAt.UTC(), UpdatedAt: w.UpdatedAt.UTC(), NodeID: optional(w.NodeID)}
}

// workspaceCursor is the keyset position of the workspace list (newest first).
type workspaceCursor struct {
	CreatedAt time.Time `json:"t"`
	ID        string    `json:"i"`
}

// workspaceQuery is a parsed list request; listWorkspaces decodes its cursor.
type workspaceQuery struct {
	Status, ProjectID, TaskID string
	Limit                     int
	Cursor                    string
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
	var err error
	out.Limit, out.Cursor, err = pageParams(r)
	return out, err
}

// listWorkspaces reads one page of a company's workspaces, newest first; a cursor without an id
// is the first page.
func (s *Server) listWorkspaces(ctx context.Context, a access, q workspaceQuery) ([]db.ExecutionWorkspace, string, error) {
	workspaces := keysetList[db.ExecutionWorkspace, workspaceCursor]{
		fetch: func(ctx context.Context, after workspaceCursor, limit int) ([]db.ExecutionWorkspace, error) {
			f := db.ExecutionWorkspaceFilter{Status: q.Status, ProjectID: q.ProjectID, TaskID: q.TaskID, Limit: limit}
			if after.ID != "" {
				f.Before, f.BeforeID = &after.CreatedAt, after.ID
			}
			return db.ListExecutionWorkspaces(ctx, s.pool, a.Company.ID, f)
		},
		key: func(w db.ExecutionWorkspace) workspaceCursor {
			return workspaceCursor{CreatedAt: w.CreatedAt, ID: w.ID}
		},
		valid: func(c workspaceCursor) bool { return c.ID == "" || db.ValidID(c.ID) },
	}
	return workspaces.page(ctx, q.Cursor, q.Limit)
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
	writeList(w, list, next, newWorkspaceJSON)
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
