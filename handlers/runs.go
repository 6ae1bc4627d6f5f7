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
	"berth/jobs"
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
}

func newRunJSON(r db.Run) runJSON {
	return runJSON{ID: r.ID, TaskID: r.TaskID, Status: r.Status, ExitCode: r.ExitCode, ErrorCode: optional(r.ErrorCode),
		ErrorMessage: optional(r.ErrorMessage), LeaseID: optional(r.LeaseID), ExecutionWorkspaceID: optional(r.ExecutionWorkspaceID),
		TimeoutS: r.TimeoutS, CancelRequested: r.CancelRequested, LogBytes: r.LogBytes, LogTruncated: r.LogTruncated,
		CreatedAt: r.CreatedAt.UTC(), StartedAt: utcPtr(r.StartedAt), FinishedAt: utcPtr(r.FinishedAt)}
}

// runRequest is the optional body of POST /api/tasks/{id}/runs.
type runRequest struct {
	TimeoutS *int `json:"timeout_s"`
}

// errRunsUnavailable is answered when this process cannot enqueue jobs.
var errRunsUnavailable = &httpError{Status: http.StatusServiceUnavailable, Code: "jobs_unavailable", Message: "This server cannot queue runs."}

// admitRun resolves the task's plan and, when nothing blocks it, records a queued run and enqueues
// provision in the same transaction. A blocked plan records the run as failed with the first
// blocker's code, provisions nothing, and answers 409 with the blockers and the run.
func (s *Server) admitRun(ctx context.Context, r *http.Request, a access, taskID string, in runRequest) (db.Run, error) {
	if s.jobs == nil {
		return db.Run{}, errRunsUnavailable
	}
	timeout := defaultRunTimeout
	if in.TimeoutS != nil {
		if *in.TimeoutS < 1 || *in.TimeoutS > 86400 {
			return db.Run{}, invalid(map[string]string{"timeout_s": "Give a timeout from 1 to 86400 seconds."})
		}
		timeout = *in.TimeoutS
	}
	var (
		run     db.Run
		blocked *workspace.Plan
	)
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		task, err := db.LockTask(ctx, tx, a.Company.ID, taskID)
		if err != nil {
			return err
		}
		if task.ProjectStatus != "active" {
			return errProjectArchived
		}
		if task.Command == "" {
			return invalid(map[string]string{"command": "The task has no command to run: edit the task and give it one."})
		}
		snap, err := db.LoadPlanSnapshot(ctx, tx, a.Company.ID, taskID)
		if err != nil {
			return err
		}
		plan := workspace.ResolvePlan(planInput(snap))
		planJSON, err := json.Marshal(plan)
		if err != nil {
			return err
		}
		run, err = db.CreateRun(ctx, tx, db.NewRun{CompanyID: a.Company.ID, TaskID: taskID, EnvironmentID: plan.EnvironmentID,
			CreatedBy: a.P.User.ID, Command: task.Command, Plan: planJSON, TimeoutS: timeout})
		if err != nil {
			return err
		}
		if plan.Blocked {
			blocked = &plan
			code, msg := plan.Blockers[0].Code, plan.Blockers[0].Message
			if run, err = db.TransitionRun(ctx, tx, run.ID, []string{db.RunQueued}, db.RunFailed,
				db.RunUpdate{ErrorCode: &code, ErrorMessage: &msg, Finished: true}); err != nil {
				return err
			}
			return s.auditTx(ctx, tx, r, a, "run.blocked", "run", run.ID, map[string]any{"task_id": taskID, "blocker": code})
		}
		if _, err := s.jobs.InsertTx(ctx, tx, jobs.ProvisionArgs{RunID: run.ID}, nil); err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "run.created", "run", run.ID, map[string]any{"task_id": taskID})
	})
	if err != nil {
		return db.Run{}, err
	}
	if blocked != nil {
		b := blocked.Blockers[0]
		return run, &httpError{Status: http.StatusConflict, Code: b.Code, Message: b.Message + " " + b.Fix,
			Extra: map[string]any{"blockers": blocked.Blockers, "run": newRunJSON(run)}}
	}
	return run, nil
}

// createRunAPI is POST /api/tasks/{id}/runs (board members): 202 with the queued run.
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
	run, err := s.admitRun(r.Context(), r, a, id, in)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/api/runs/"+run.ID)
	writeJSON(w, http.StatusAccepted, newRunJSON(run))
	return nil
}

// runLogAPI is GET /api/runs/{id}/log?offset=N: the stored log bytes after N as text/plain, with
// the next offset in X-Log-Offset, for tailing.
func (s *Server) runLogAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.objectAccess(r.Context(), p, "runs", id)
	if err != nil {
		return err
	}
	var offset int64
	if v := r.URL.Query().Get("offset"); v != "" {
		if offset, err = strconv.ParseInt(v, 10, 64); err != nil || offset < 0 {
			return badRequest("bad_offset", "offset must be a whole number of bytes, 0 or more.")
		}
	}
	chunk, next, err := db.RunLogAfter(r.Context(), s.pool, a.Company.ID, id, offset)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Log-Offset", strconv.FormatInt(next, 10))
	_, err = w.Write(chunk)
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
	log, _, err := db.RunLogAfter(ctx, s.pool, a.Company.ID, id, 0)
	if err != nil {
		return err
	}
	v := views.RunView{ID: run.ID, TaskID: task.ID, TaskKey: task.Key, TaskTitle: task.Title, Status: run.Status,
		ErrorCode: run.ErrorCode, ErrorMessage: run.ErrorMessage, ExitCode: run.ExitCode, Command: run.Command,
		Live: run.Live(), CancelRequested: run.CancelRequested, CanManage: a.canManage(), Log: string(log),
		LogBytes: run.LogBytes, LogTruncated: run.LogTruncated, CreatedAt: run.CreatedAt, StartedAt: run.StartedAt,
		FinishedAt: run.FinishedAt, WorkspaceID: run.ExecutionWorkspaceID}
	for _, o := range ops {
		v.Operations = append(v.Operations, views.OperationRow{Phase: o.Phase, Command: o.Command, Status: o.Status,
			ExitCode: o.ExitCode, Error: o.Error, Log: string(o.Log), StartedAt: o.StartedAt, FinishedAt: o.FinishedAt})
	}
	if isHTMX(r) && r.URL.Query().Get("fragment") == "run" {
		return s.render(w, r, views.RunBody(v))
	}
	return s.render(w, r, views.RunPage(s.companyFrame(r, a, task.Key+" run", "projects"), v))
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
	for _, r := range runs {
		d.Runs = append(d.Runs, views.TaskRunRow{ID: r.ID, Status: r.Status, ErrorCode: r.ErrorCode, CreatedAt: r.CreatedAt})
	}
	return d, nil
}
