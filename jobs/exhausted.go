package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"berth/db"
	"berth/environment"
)

// A River job whose last attempt fails (or that cancels itself) is discarded, and River retries it
// no more: whatever object it was moving must not be left saying "in progress" (docs/jobs.md
// "When retries run out"). Every kind settles that on its object, visibly:
//
//   - finalize, cleanup_lease, capture_image and import_image do it in their own Work (finalize
//     and cleanup failed with the reason, the setup session failed, the upload failed);
//   - provision and execute_run leave a live run to the orphan sweep, which ends it
//     failed/orphaned ("no_job") within quietAfter (sweep.go): only the sweep can tell a run with
//     an outcome in the spool from one without;
//   - close_workspace, reopen_workspace, runtime_service (start and restart), select_attempts (the
//     group's refs failed) and probe_environment are settled by exhaustedMiddleware below, with the
//     last error as the reason;
//   - the periodic kinds (sweep_orphans, expire_leases, expire_setup_sessions, housekeeping) own
//     no object; the next period enqueues them again.
//
// On /admin/jobs the job itself shows as discarded (or cancelled) with every attempt's error.

// exhaustedMiddleware settles a job's object when the job will not be tried again.
type exhaustedMiddleware struct {
	river.MiddlewareDefaults
	deps Deps
}

var _ rivertype.WorkerMiddleware = (*exhaustedMiddleware)(nil)

// Work runs the job and, when its error ends it for good, settles its object.
func (m *exhaustedMiddleware) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	err := doInner(ctx)
	if !finalFailure(job, err) {
		return err
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if serr := settleExhausted(sctx, m.deps, job, err); serr != nil && m.deps.Log != nil {
		m.deps.Log.ErrorContext(ctx, "settle a job whose retries ran out", "kind", job.Kind, "job_id", job.ID, "err", serr)
	}
	return err
}

// finalFailure reports whether err ends job for good: its last attempt failed, or it cancelled
// itself. A snooze is not a failure.
func finalFailure(job *rivertype.JobRow, err error) bool {
	if err == nil {
		return false
	}
	var snooze *river.JobSnoozeError
	if errors.As(err, &snooze) {
		return false
	}
	var cancel *river.JobCancelError
	return errors.As(err, &cancel) || job.Attempt >= job.MaxAttempts
}

// exhaustedReason is the reason recorded on the object.
func exhaustedReason(job *rivertype.JobRow, err error) string {
	return fmt.Sprintf("Berth gave up after %d attempt(s) of %s: %v", job.Attempt, job.Kind, err)
}

// settleExhausted writes the settled state of the object of a job that will not run again.
func settleExhausted(ctx context.Context, d Deps, job *rivertype.JobRow, jobErr error) error {
	reason := exhaustedReason(job, jobErr)
	switch job.Kind {
	case (CloseWorkspaceArgs{}).Kind():
		var a CloseWorkspaceArgs
		if err := json.Unmarshal(job.EncodedArgs, &a); err != nil {
			return err
		}
		return settleWorkspace(ctx, d, a.CompanyID, a.WorkspaceID, "execution_workspace.cleanup_failed", func(tx pgx.Tx, ws db.ExecutionWorkspace) error {
			_, err := db.FailWorkspaceClose(ctx, tx, ws.ID, a.Generation, reason)
			return err
		})
	case (ReopenWorkspaceArgs{}).Kind():
		var a ReopenWorkspaceArgs
		if err := json.Unmarshal(job.EncodedArgs, &a); err != nil {
			return err
		}
		return settleWorkspace(ctx, d, a.CompanyID, a.WorkspaceID, "execution_workspace.reopen_failed", func(tx pgx.Tx, ws db.ExecutionWorkspace) error {
			_, err := db.AbortWorkspaceReopen(ctx, tx, ws.ID, a.Generation, "Reopening failed: "+reason)
			return err
		})
	case (RuntimeServiceArgs{}).Kind():
		var a RuntimeServiceArgs
		if err := json.Unmarshal(job.EncodedArgs, &a); err != nil {
			return err
		}
		if a.Action == ServiceStop {
			return nil // a stop that failed leaves the process as it is: the service sweep reconciles it
		}
		return db.InTx(ctx, d.Pool, func(tx pgx.Tx) error {
			svc, err := db.LockRuntimeService(ctx, tx, a.ServiceID)
			if errors.Is(err, db.ErrNotFound) {
				return nil
			}
			if err != nil || svc.Status != db.ServiceStarting {
				return err // started after all, or already settled
			}
			if _, err := db.MarkRuntimeServiceEnded(ctx, tx, svc.ID, 0, db.ServiceEnd{Status: db.ServiceFailed, StopReason: reason,
				Restarts: svc.Restarts}); err != nil {
				return err
			}
			return db.InsertAudit(ctx, tx, db.AuditEvent{CompanyID: svc.CompanyID, ActorType: db.ActorSystem, ActorLabel: "berth",
				Action: "runtime_service.start_failed", TargetType: "runtime_service", TargetID: svc.ID,
				Details: map[string]any{"reason": reason}})
		})
	case (SelectAttemptsArgs{}).Kind():
		var a SelectAttemptsArgs
		if err := json.Unmarshal(job.EncodedArgs, &a); err != nil {
			return err
		}
		return db.InTx(ctx, d.Pool, func(tx pgx.Tx) error {
			g, err := db.FailAttemptRefs(ctx, tx, a.GroupID, a.Generation, reason)
			if errors.Is(err, db.ErrAttemptFenced) {
				return nil // moved after all, or taken back
			}
			if err != nil {
				return err
			}
			return db.InsertAudit(ctx, tx, db.AuditEvent{CompanyID: g.CompanyID, ActorType: db.ActorSystem, ActorLabel: "berth",
				Action: "attempts.refs_failed", TargetType: "task", TargetID: g.TaskID,
				Details: map[string]any{"group_id": g.ID, "generation": g.Generation, "reason": reason}})
		})
	case (ProbeEnvironmentArgs{}).Kind():
		var a ProbeEnvironmentArgs
		if err := json.Unmarshal(job.EncodedArgs, &a); err != nil {
			return err
		}
		env, err := db.EnvironmentByID(ctx, d.Pool, a.CompanyID, a.EnvironmentID)
		if errors.Is(err, db.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		q := Qualification{OK: false, ProbedAt: time.Now().UTC().Truncate(time.Second), Summary: reason,
			Checks: []environment.Check{}}
		if basis, err := (&ProbeEnvironmentWorker{runWorker: runWorker{deps: d}}).qualificationBasis(ctx, d.Pool, env); err == nil {
			q.ConfigFingerprint, q.ImageDigest = basis.fingerprint, basis.image
		}
		doc, err := json.Marshal(q)
		if err != nil {
			return err
		}
		return db.SetEnvironmentQualification(ctx, d.Pool, env.CompanyID, env.ID, doc)
	}
	return nil
}

// settleWorkspace applies a fenced transition to a workspace a job was closing or reopening and
// audits it; a workspace that moved on (another generation or status) is left alone.
func settleWorkspace(ctx context.Context, d Deps, companyID, id, action string, fn func(pgx.Tx, db.ExecutionWorkspace) error) error {
	ws, err := db.ExecutionWorkspaceByID(ctx, d.Pool, companyID, id)
	if errors.Is(err, db.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return db.InTx(ctx, d.Pool, func(tx pgx.Tx) error {
		err := fn(tx, ws)
		if errors.Is(err, db.ErrWorkspaceFenced) {
			return nil
		}
		if err != nil {
			return err
		}
		return systemAudit(ctx, tx, ws, action, map[string]any{"generation": ws.Generation, "reason": "retries exhausted"})
	})
}
