package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/environment"
	"berth/views"
	"berth/workspace"
)

// defaultRunTimeout bounds a run whose request names no timeout.
const defaultRunTimeout = 3600

// runJSON is a run as the API returns it (docs/api.md "Runs").
type runJSON struct {
	ID                   string     `json:"id"`
	TaskID               string     `json:"task_id"`
	Status               string     `json:"status"`
	ExitCode             *int       `json:"exit_code"`
	ErrorCode            *string    `json:"error_code"`
	ErrorMessage         *string    `json:"error_message"`
	LeaseID              *string    `json:"lease_id"`
	ExecutionWorkspaceID *string    `json:"execution_workspace_id"`
	TimeoutS             int        `json:"timeout_s"`
	CancelRequested      bool       `json:"cancel_requested"`
	LogBytes             int64      `json:"log_bytes"`
	LogTruncated         bool       `json:"log_truncated"`
	CreatedAt            time.Time  `json:"created_at"`
	StartedAt            *time.Time `json:"started_at"`
	FinishedAt           *time.Time `json:"finished_at"`
	NodeID               *string    `json:"node_id"` // the node that holds it (docs/scaling.md)
}

func newRunJSON(r db.Run) runJSON {
	return runJSON{ID: r.ID, TaskID: r.TaskID, Status: r.Status, ExitCode: r.ExitCode, ErrorCode: optional(r.ErrorCode),
		ErrorMessage: optional(r.ErrorMessage), LeaseID: optional(r.LeaseID), ExecutionWorkspaceID: optional(r.ExecutionWorkspaceID),
		TimeoutS: r.TimeoutS, CancelRequested: r.CancelRequested, LogBytes: r.LogBytes, LogTruncated: r.LogTruncated,
		CreatedAt: r.CreatedAt.UTC(), StartedAt: utcPtr(r.StartedAt), FinishedAt: utcPtr(r.FinishedAt), NodeID: optional(r.NodeID)}
}

// runDetailJSON is GET /api/runs/{id}: the run, how its finalize stands (its work brought home
// to the task branch or artifact store, or why not: a command that succeeded whose work could
// not be committed is not a plain success), and the hosts its jails reached and were refused
// through the egress proxy.
type runDetailJSON struct {
	runJSON
	Finalize runFinalizeJSON `json:"finalize"`
	Egress   json.RawMessage `json:"egress"`
}

type runFinalizeJSON struct {
	State string  `json:"state"` // none | pending | settled | failed
	Error *string `json:"error"`
}

// getRunAPI is GET /api/runs/{id}.
func (s *Server) getRunAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx, id := r.Context(), r.PathValue("id")
	a, err := s.objectAccess(ctx, p, "runs", id)
	if err != nil {
		return err
	}
	run, err := db.RunByID(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	state, msg, err := db.RunFinalize(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	egress, err := db.RunEgress(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	if len(egress) == 0 {
		egress = json.RawMessage(`{"hosts": []}`)
	}
	writeJSON(w, http.StatusOK, runDetailJSON{runJSON: newRunJSON(run), Finalize: runFinalizeJSON{State: state, Error: optional(msg)},
		Egress: egress})
	return nil
}

// runOutcome is the run page's finalize state and egress hosts.
func (s *Server) runOutcome(ctx context.Context, companyID, id string) (views.RunOutcome, error) {
	var o views.RunOutcome
	var err error
	if o.FinalizeState, o.FinalizeError, err = db.RunFinalize(ctx, s.pool, companyID, id); err != nil {
		return o, err
	}
	doc, err := db.RunEgress(ctx, s.pool, companyID, id)
	if err != nil || len(doc) == 0 {
		return o, err
	}
	var rec struct {
		Hosts []views.EgressRow `json:"hosts"`
	}
	if err := json.Unmarshal(doc, &rec); err != nil {
		return o, nil // an unreadable record shows nothing rather than failing the page
	}
	o.Egress = rec.Hosts
	return o, nil
}

// createRunAPI is POST /api/tasks/{id}/runs (board members): 202 with the queued run, or with the
// run an Idempotency-Key admitted before.
func (s *Server) createRunAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "tasks", id, "run.create", "task")
	if err != nil {
		return err
	}
	var in runRequest
	if r.ContentLength != 0 || r.Header.Get("Content-Type") != "" {
		if err := decodeJSON(w, r, &in); err != nil {
			return err
		}
	}
	if in.IdempotencyKey, err = idempotencyKey(r); err != nil {
		return err
	}
	run, err := s.admitRun(r.Context(), r, a, id, in)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/api/runs/"+run.ID)
	writeJSON(w, http.StatusAccepted, newRunJSON(run))
	return nil
}

// taskRunsAPI is GET /api/tasks/{id}/runs (readers): the task's runs, newest first, paged.
func (s *Server) taskRunsAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx, id := r.Context(), r.PathValue("id")
	a, err := s.objectAccess(ctx, p, "tasks", id)
	if err != nil {
		return err
	}
	runs := keysetList[db.Run, db.RunCursor]{
		fetch: func(ctx context.Context, after db.RunCursor, limit int) ([]db.Run, error) {
			var from *db.RunCursor // the first page; a cursor always has an id (valid)
			if after.ID != "" {
				from = &after
			}
			return db.TaskRunsAfter(ctx, s.pool, a.Company.ID, id, from, limit)
		},
		key:   func(run db.Run) db.RunCursor { return db.RunCursor{CreatedAt: run.CreatedAt, ID: run.ID} },
		valid: func(c db.RunCursor) bool { return db.ValidID(c.ID) },
	}
	return serveKeyset(w, r, runs, newRunJSON)
}

// runLogAPI is GET /api/runs/{id}/log?offset=N: what follows the first N bytes the run printed,
// as text/plain, with the next offset (the bytes printed so far) in X-Log-Offset, for tailing.
// Past the cap that is the rest of the kept head, the marker line and the kept tail
// (environment.LogAfter). With download=1 it is the whole kept log as an attachment.
func (s *Server) runLogAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.objectAccess(r.Context(), p, "runs", id)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	if q.Get("download") == "1" {
		return s.sendRunLog(w, r, a, id)
	}
	var offset, tail int64
	if v := q.Get("offset"); v != "" {
		if offset, err = strconv.ParseInt(v, 10, 64); err != nil || offset < 0 {
			return badRequest("bad_offset", "offset must be a whole number of bytes, 0 or more.")
		}
	}
	if v := q.Get("tail"); v != "" {
		if tail, err = strconv.ParseInt(v, 10, 64); err != nil || tail < 1 || q.Get("offset") != "" {
			return badRequest("bad_tail", "tail must be a whole number of bytes, 1 or more, and comes without offset.")
		}
	}
	l, err := db.RunLogOf(r.Context(), s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	if tail > 0 {
		offset = max(0, l.Total-tail) // the last tail bytes printed (what of them is kept)
	}
	chunk, next := environment.LogAfter(l.Data, l.Head, l.Total, offset)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Log-Offset", strconv.FormatInt(next, 10))
	w.Header().Set("X-Log-Truncated", strconv.FormatBool(l.Truncated))
	_, err = w.Write(chunk)
	return err
}

// runLogDownload is GET /runs/{id}/log (readers): the kept log as a file, for the run page.
func (s *Server) runLogDownload(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.objectAccess(r.Context(), p, "runs", id)
	if err != nil {
		return err
	}
	return s.sendRunLog(w, r, a, id)
}

// sendRunLog answers the run's kept log as an attachment named after the run.
func (s *Server) sendRunLog(w http.ResponseWriter, r *http.Request, a access, id string) error {
	l, err := db.RunLogOf(r.Context(), s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Content-Disposition", `attachment; filename="run-`+id+`.log"`)
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Log-Truncated", strconv.FormatBool(l.Truncated))
	_, err = w.Write(l.Data)
	return err
}

// cancelRun asks a live run to stop; the executor stops its process group and finalize still runs.
func (s *Server) cancelRun(ctx context.Context, r *http.Request, a access, id string) (db.Run, error) {
	var run db.Run
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		run, err = db.RequestRunCancel(ctx, tx, a.Company.ID, id)
		if errors.Is(err, db.ErrRunState) {
			return &httpError{Status: http.StatusConflict, Code: "run_ended", Message: "The run has already ended."}
		}
		if err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "run.cancel_requested", "run", id, nil)
	})
	return run, err
}

// cancelRunAPI is POST /api/runs/{id}/cancel (board members): 202 with the run.
func (s *Server) cancelRunAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "runs", id, "run.cancel", "run")
	if err != nil {
		return err
	}
	run, err := s.cancelRun(r.Context(), r, a, id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, newRunJSON(run))
	return nil
}

// runPage is GET /runs/{id}: the run's state, its steps, and its log (followed live with htmx).
func (s *Server) runPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx, id := r.Context(), r.PathValue("id")
	r = s.live(r, "run", id) // status, steps and log follow the run (events_pages.go)
	a, err := s.objectAccess(ctx, p, "runs", id)
	if err != nil {
		return err
	}
	run, err := db.RunByID(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	task, err := db.TaskByID(ctx, s.pool, a.Company.ID, run.TaskID)
	if err != nil {
		return err
	}
	ops, err := db.RunOperations(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	log, err := db.RunLogOf(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	v := views.RunView{ID: run.ID, TaskID: task.ID, TaskKey: task.Key, TaskTitle: task.Title, Status: run.Status,
		ErrorCode: run.ErrorCode, ErrorMessage: run.ErrorMessage, ExitCode: run.ExitCode, Command: run.Command,
		Live: run.Live(), CancelRequested: run.CancelRequested, CanManage: a.canManage(), Log: string(log.Data),
		LogBytes: run.LogBytes, LogTruncated: run.LogTruncated, CreatedAt: run.CreatedAt, StartedAt: run.StartedAt,
		FinishedAt: run.FinishedAt, WorkspaceID: run.ExecutionWorkspaceID}
	for _, o := range ops {
		v.Operations = append(v.Operations, views.OperationRow{Phase: o.Phase, Command: o.Command, Status: o.Status,
			ExitCode: o.ExitCode, Error: o.Error, Log: string(o.Log), StartedAt: o.StartedAt, FinishedAt: o.FinishedAt})
	}
	if v.Receipt, err = s.receiptView(ctx, a.Company.ID, id); err != nil { // receipts.go
		return err
	}
	if v.Outcome, err = s.runOutcome(ctx, a.Company.ID, id); err != nil {
		return err
	}
	facts, err := s.runFactsOf(ctx, a.Company.ID, run, time.Now()) // run_title.go; the heading is in the fragment
	if err != nil {
		return err
	}
	v.Branch, v.Environment, v.Duration = facts.Branch, facts.Environment, facts.Duration
	if isHTMX(r) && r.URL.Query().Get("fragment") == "run" {
		return s.render(w, r, views.RunBody(v))
	}
	return s.render(w, r, views.RunPage(s.projectFrame(r, a, task.ProjectID, runTitle(task.Key, run.Status, facts)), v))
}

// createRunForm is POST /tasks/{id}/runs (board members): admits a run and goes to its page; a
// blocked plan goes back to the task page, whose plan panel says why.
func (s *Server) createRunForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "tasks", id, "run.create", "task")
	if err != nil {
		return err
	}
	run, err := s.admitRun(r.Context(), r, a, id, runRequest{})
	var he *httpError
	if errors.As(err, &he) && he.Status == http.StatusConflict && run.ID != "" {
		http.Redirect(w, r, "/runs/"+run.ID, http.StatusSeeOther)
		return nil
	}
	if err != nil {
		return err
	}
	http.Redirect(w, r, "/runs/"+run.ID, http.StatusSeeOther)
	return nil
}

// cancelRunForm is POST /runs/{id}/cancel (board members).
func (s *Server) cancelRunForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "runs", id, "run.cancel", "run")
	if err != nil {
		return err
	}
	if _, err := s.cancelRun(r.Context(), r, a, id); err != nil {
		var he *httpError
		if !errors.As(err, &he) || he.Code != "run_ended" {
			return err
		}
	}
	http.Redirect(w, r, "/runs/"+id, http.StatusSeeOther)
	return nil
}

// taskRunsData is the runs panel of a task page: recent runs and whether a run can start.
func (s *Server) taskRunsData(ctx context.Context, a access, taskID string, snap db.PlanSnapshot) (views.TaskRunsData, error) {
	runs, err := db.TaskRuns(ctx, s.pool, a.Company.ID, taskID, 10)
	if err != nil {
		return views.TaskRunsData{}, err
	}
	plan := workspace.ResolvePlan(planInput(snap))
	d := views.TaskRunsData{TaskID: taskID, Blocked: plan.Blocked, NoCommand: snap.Task.Command == ""}
	d.CanRun = a.canManage() && !d.Blocked && !d.NoCommand && snap.Task.ProjectStatus == "active" && s.jobs != nil
	live, err := db.LiveTaskRun(ctx, s.pool, a.Company.ID, taskID)
	switch {
	case err == nil: // the Run button shows the live run instead of queueing another
		d.Live = &views.TaskRunRow{ID: live.ID, Status: live.Status, CreatedAt: live.CreatedAt}
		d.CanRun = false
	case !errors.Is(err, db.ErrNotFound):
		return views.TaskRunsData{}, err
	}
	for _, r := range runs {
		d.Runs = append(d.Runs, views.TaskRunRow{ID: r.ID, Status: r.Status, ErrorCode: r.ErrorCode, CreatedAt: r.CreatedAt})
	}
	return d, nil
}
