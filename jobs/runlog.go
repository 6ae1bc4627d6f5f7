package jobs

import (
	"context"
	"log/slog"

	"berth/db"
)

// runLog is the logger for a line about a run: every such line carries run_id, task_id and
// company_id, so one run's story can be filtered out of the log (DESIGN §12). A nil log discards.
func runLog(log *slog.Logger, run db.Run) *slog.Logger {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return log.With("run_id", run.ID, "task_id", run.TaskID, "company_id", run.CompanyID)
}

// runLogByID is runLog for a line that has only the run's id: it reads the run for its task and
// company, and falls back to the id alone when the run cannot be read.
func runLogByID(ctx context.Context, log *slog.Logger, q db.Querier, id string) *slog.Logger {
	run, err := db.RunForJob(ctx, q, id)
	if err != nil {
		return runLog(log, db.Run{ID: id})
	}
	return runLog(log, run)
}

// started records that a run's command is starting: the admission histogram's observation
// (created_at to started_at) and the "run started" line.
func (w runWorker) started(ctx context.Context, run db.Run) {
	if w.deps.Admission != nil && run.StartedAt != nil {
		w.deps.Admission.Observe(run.StartedAt.Sub(run.CreatedAt).Seconds())
	}
	runLog(w.deps.Log, run).InfoContext(ctx, "run started", "node", w.deps.NodeID)
}
