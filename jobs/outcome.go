package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"berth/db"
	"berth/jobs/spool"
)

// A run's outcome reaches the database through the spool (package jobs/spool): the executor's
// recordOutcome and a successor's ReplaySpool hand it writeOutcome, the run's final transaction.

// outcomeTryTimeout bounds one write the executor makes after its command ended, as the spool
// bounds each try of the final one.
const outcomeTryTimeout = spool.TryTimeout

// finalizeOutageWait is how long finalize waits before trying again after the database did not
// answer; River's snooze does not count it as an attempt, so an outage of any length never
// exhausts finalize's attempts (finalize.go).
const finalizeOutageWait = 5 * time.Second

// writeOutcome is a run's final transaction: the kept log, the running → terminal transition with
// exit and error codes, finalize pending and enqueued. A run no longer running (the sweep or a
// replay ended it) is db.ErrRunState and nothing changes.
func writeOutcome(ctx context.Context, pool *pgxpool.Pool, ins Inserter, o spool.Outcome) error {
	return db.InTx(ctx, pool, func(tx pgx.Tx) error {
		code, msg := o.ErrorCode, o.ErrorMessage
		u := db.RunUpdate{ErrorCode: &code, ErrorMessage: &msg, ExitCode: o.ExitCode, Finished: true}
		r, err := db.TransitionRun(ctx, tx, o.RunID, []string{db.RunRunning}, o.Status, u)
		if err != nil {
			return err
		}
		if err := db.SetRunLog(ctx, tx, o.RunID, o.RunLog()); err != nil {
			return err
		}
		if err := db.MarkFinalizePending(ctx, tx, r); err != nil {
			return err
		}
		if _, err := Enqueue(ctx, ins, tx, FinalizeArgs{RunID: r.ID}); err != nil {
			return fmt.Errorf("enqueue finalize: %w", err)
		}
		return nil
	})
}

// recordOutcome spools a run's outcome and writes it through the River client working the job,
// retrying until the database takes it or ctx ends (spool.Dir.Record).
func (w runWorker) recordOutcome(ctx context.Context, run db.Run, o spool.Outcome) error {
	write := func(ctx context.Context, o spool.Outcome) error {
		return writeOutcome(ctx, w.deps.Pool, river.ClientFromContext[pgx.Tx](ctx), o)
	}
	return spool.Of(w.deps.Data).Record(ctx, o, write, runLog(w.deps.Log, run))
}

// ReplaySpool writes the run outcomes spooled on this node by a process that stopped before
// the database took them (spool.Dir.Replay), skipping those this process's executors are still
// recording. It returns once the spool is empty or ctx ends. Start it with the working client, in
// its own goroutine: while an outcome waits in the spool, the orphan sweep leaves its run alone.
func ReplaySpool(ctx context.Context, d Deps) error {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	return spool.Of(d.Data).Replay(ctx, spool.Replayer{
		Log:  d.Log,
		Busy: d.Executing.Has,
		RunLog: func(ctx context.Context, id string) *slog.Logger {
			return runLogByID(ctx, d.Log, d.Pool, id)
		},
		Open: func(ctx context.Context) (spool.Writer, error) {
			ins, err := inserter(ctx, d)
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context, o spool.Outcome) error { return writeOutcome(ctx, d.Pool, ins, o) }, nil
		},
	})
}
