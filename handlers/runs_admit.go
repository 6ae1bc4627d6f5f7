package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/jobs"
	"berth/workspace"
)

// Run admission (POST /api/tasks/{id}/runs; docs/api.md "Runs"): the request, its
// Idempotency-Key, and the transaction that records a queued run.

// runRequest is the optional body of POST /api/tasks/{id}/runs, with the Idempotency-Key header.
type runRequest struct {
	TimeoutS *int `json:"timeout_s"`
	// Command replaces the task's command for this run where workspace.CommandOverride allows.
	Command        *string `json:"command"`
	IdempotencyKey string  `json:"-"` // from the Idempotency-Key header; "" for none
}

// maxIdempotencyKey bounds an Idempotency-Key header.
const maxIdempotencyKey = 255

// idempotencyKey reads the Idempotency-Key header: "" when absent; 400 bad_idempotency_key when
// empty, longer than 255 bytes or not printable ASCII.
func idempotencyKey(r *http.Request) (string, error) {
	vals, ok := r.Header["Idempotency-Key"]
	if !ok {
		return "", nil
	}
	bad := badRequest("bad_idempotency_key", "Idempotency-Key must be 1 to 255 printable ASCII characters.")
	if len(vals) != 1 || vals[0] == "" || len(vals[0]) > maxIdempotencyKey {
		return "", bad
	}
	for _, c := range []byte(vals[0]) {
		if c < 0x21 || c > 0x7e {
			return "", bad
		}
	}
	return vals[0], nil
}

// idempotencyPrincipal names who an Idempotency-Key belongs to: keys are per principal.
func idempotencyPrincipal(p *principal) string {
	if p.Run != nil {
		return "run:" + p.Run.ID
	}
	return "user:" + p.User.ID
}

// errRunsUnavailable is answered when this process cannot enqueue jobs.
var errRunsUnavailable = &httpError{Status: http.StatusServiceUnavailable, Code: "jobs_unavailable", Message: "This server cannot queue runs."}

// runInProgress is the 409 for a task that already has a live run: it names that run.
func runInProgress(live db.Run) error {
	return &httpError{Status: http.StatusConflict, Code: "run_in_progress",
		Message: "The task already has a run in progress: wait for it to end or cancel it.",
		Extra:   map[string]any{"run": map[string]any{"id": live.ID, "status": live.Status}}}
}

// errIdempotencyKeyReused refuses a key its principal already used for another task.
var errIdempotencyKeyReused = &httpError{Status: http.StatusConflict, Code: "idempotency_key_reused",
	Message: "This Idempotency-Key was used for another task's run in the last 24 hours: use a new key."}

// admitRun resolves the task's plan and, when nothing blocks it, records a queued run and enqueues
// provision in the same transaction. One run per task is live at a time: while one is, the answer
// is 409 run_in_progress naming it (returned with the error), checked under the task's row lock
// and enforced by the database (runs_one_live_per_task). With an Idempotency-Key the principal's
// key answers with the run it admitted before (live or ended) for 24 hours, and is refused on
// another task. A blocked plan records the run as failed with the first blocker's code,
// provisions nothing, and answers 409 with the blockers and the run.
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
	owner := idempotencyPrincipal(a.P)
	var (
		run     db.Run
		blocked *workspace.Plan
	)
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		task, err := db.LockTask(ctx, tx, a.Company.ID, taskID)
		if err != nil {
			return err
		}
		if in.IdempotencyKey != "" {
			k, err := db.RunForIdempotencyKey(ctx, tx, owner, in.IdempotencyKey)
			switch {
			case err == nil && k.TaskID != taskID:
				return errIdempotencyKeyReused
			case err == nil:
				run, err = db.RunByID(ctx, tx, a.Company.ID, k.RunID)
				return err
			case !errors.Is(err, db.ErrNotFound):
				return err
			}
		}
		if live, err := db.LiveTaskRun(ctx, tx, a.Company.ID, taskID); err == nil {
			run = live
			return runInProgress(live)
		} else if !errors.Is(err, db.ErrNotFound) {
			return err
		}
		if task.ProjectStatus != "active" {
			return errProjectArchived
		}
		if in.Command != nil && (strings.TrimSpace(*in.Command) == "" || len(*in.Command) > maxAttemptCommand || strings.ContainsRune(*in.Command, 0)) {
			return invalid(map[string]string{"command": "Give a command of 1 to 16384 bytes without NUL."})
		}
		if task.Command == "" && in.Command == nil {
			return invalid(map[string]string{"command": "The task has no command to run: edit the task and give it one."})
		}
		snap, err := db.LoadPlanSnapshot(ctx, tx, a.Company.ID, taskID)
		if err != nil {
			return err
		}
		command := task.Command
		if in.Command != nil {
			if ok, why := workspace.CommandOverride(planInput(snap)); !ok {
				return &httpError{Status: http.StatusForbidden, Code: "command_override_denied",
					Message: "This run cannot replace the task's command: " + why + "."}
			}
			command = *in.Command
		}
		plan := workspace.ResolvePlan(planInput(snap))
		if err := refuseSealed(ctx, tx, a, plan.ReuseWorkspaceID); err != nil { // attempts.go
			return err
		}
		planJSON, err := json.Marshal(plan)
		if err != nil {
			return err
		}
		run, err = db.CreateRun(ctx, tx, db.NewRun{CompanyID: a.Company.ID, TaskID: taskID, EnvironmentID: plan.EnvironmentID,
			CreatedBy: a.P.User.ID, Command: command, Plan: planJSON, TimeoutS: timeout})
		if errors.Is(err, db.ErrConflict) { // a run admitted without the task lock: the index still holds
			if live, lerr := db.LiveTaskRun(ctx, tx, a.Company.ID, taskID); lerr == nil {
				run = live
				return runInProgress(live)
			}
		}
		if err != nil {
			return err
		}
		if in.IdempotencyKey != "" {
			err := db.RecordIdempotencyKey(ctx, tx, owner, in.IdempotencyKey, a.Company.ID, taskID, run.ID)
			if errors.Is(err, db.ErrConflict) { // the same key, committed meanwhile for another task
				return errIdempotencyKeyReused
			}
			if err != nil {
				return err
			}
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
		if _, err := jobs.Enqueue(ctx, s.jobs, tx, jobs.ProvisionArgs{RunID: run.ID}); err != nil {
			return nodeUnavailable(err)
		}
		details := map[string]any{"task_id": taskID}
		if in.Command != nil {
			details["command_override"] = true
		}
		return s.auditTx(ctx, tx, r, a, "run.created", "run", run.ID, details)
	})
	var he *httpError
	if errors.As(err, &he) && he.Code == "run_in_progress" {
		return run, err
	}
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
