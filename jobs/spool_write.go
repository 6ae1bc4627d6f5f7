package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"berth/db"
)

// Writing a run's outcome through a database outage (spool.go): the executor spools the outcome,
// then retries its final transaction with backoff for as long as its process lives; River never
// sees a failed attempt, so the job is not discarded while it holds the outcome. A process that
// stops first leaves the spool file, and ReplaySpool in its successor writes it.

const (
	// outcomeRetryFirst and outcomeRetryMax bound the backoff between tries of a final write.
	outcomeRetryFirst = 200 * time.Millisecond
	outcomeRetryMax   = 2 * time.Second
	// outcomeTryTimeout bounds one try, so a database that hangs (rather than refuses) is asked
	// again instead of waited on forever.
	outcomeTryTimeout = 15 * time.Second
	// outcomeLogEvery is how often a write still failing is logged again.
	outcomeLogEvery = 30 * time.Second
)

// writeOutcome is a run's final transaction: the kept log, the running → terminal transition with
// exit and error codes, finalize pending and enqueued. A run no longer running (the sweep or a
// replay ended it) is db.ErrRunState and nothing changes.
func writeOutcome(ctx context.Context, pool *pgxpool.Pool, ins Inserter, o runOutcome) error {
	return db.InTx(ctx, pool, func(tx pgx.Tx) error {
		code, msg := o.ErrorCode, o.ErrorMessage
		u := db.RunUpdate{ErrorCode: &code, ErrorMessage: &msg, ExitCode: o.ExitCode, Finished: true}
		r, err := db.TransitionRun(ctx, tx, o.RunID, []string{db.RunRunning}, o.Status, u)
		if err != nil {
			return err
		}
		if err := db.SetRunLog(ctx, tx, o.RunID, o.runLog()); err != nil {
			return err
		}
		if r.ExecutionWorkspaceID != "" {
			if err := db.SetFinalizeState(ctx, tx, r.ExecutionWorkspaceID, "pending"); err != nil {
				return err
			}
			if err := db.SetRunFinalize(ctx, tx, r.ID, "pending", ""); err != nil {
				return err
			}
		}
		if _, err := Enqueue(ctx, ins, tx, FinalizeArgs{RunID: r.ID}); err != nil {
			return fmt.Errorf("enqueue finalize: %w", err)
		}
		return nil
	})
}

// settledOutcome reports whether a final write's error ends the retries: nil (written), the run
// already ended or gone, or the database refusing the data itself (retrying cannot help).
func settledOutcome(err error) bool {
	if err == nil || errors.Is(err, db.ErrRunState) || errors.Is(err, db.ErrNotFound) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && len(pe.Code) == 5 {
		switch pe.Code[:2] {
		case "22", "23", "42": // data exception, integrity violation, syntax or access rule
			return true
		}
	}
	return false
}

// recordOutcome spools a run's outcome and writes it, retrying with backoff until the database
// takes it or ctx (the process's working life) ends. It returns nil once the outcome is in the
// database or can never be (logged), and an error only when ctx ended first, the outcome then
// staying in the spool for the next process of this node.
func (w runWorker) recordOutcome(ctx context.Context, run db.Run, o runOutcome) error {
	sp := spoolOf(w.deps.Data)
	log := runLog(w.deps.Log, run)
	spooled := true
	if err := sp.save(o); err != nil {
		spooled = false // still held in memory below; only a crash now would lose it
		log.Error("run outcome not spooled", "err", err)
	}
	ins := river.ClientFromContext[pgx.Tx](ctx)
	bg := context.WithoutCancel(ctx)
	wait := outcomeRetryFirst
	var firstFail, lastLogged time.Time
	for attempt := 1; ; attempt++ {
		tryCtx, cancel := context.WithTimeout(bg, outcomeTryTimeout)
		err := writeOutcome(tryCtx, w.deps.Pool, ins, o)
		cancel()
		if settledOutcome(err) {
			switch {
			case errors.Is(err, db.ErrRunState) || errors.Is(err, db.ErrNotFound):
				log.Warn("run outcome not recorded: the run had already ended", "status", o.Status, "err", err)
			case err != nil:
				log.Error("run outcome refused by the database", "status", o.Status, "err", err)
			case attempt > 1:
				log.Info("run outcome recorded after a database outage", "status", o.Status, "attempts", attempt,
					"waited_ms", time.Since(firstFail).Milliseconds())
			}
			if rerr := sp.remove(o.RunID); rerr != nil {
				log.Error("spooled run outcome not removed", "err", rerr)
			}
			return nil
		}
		now := time.Now()
		if attempt == 1 {
			firstFail = now
		}
		if now.Sub(lastLogged) >= outcomeLogEvery {
			lastLogged = now
			log.Warn("run outcome not yet recorded: the database is unavailable; retrying", "status", o.Status,
				"attempts", attempt, "spooled", spooled, "err", err)
		}
		select {
		case <-ctx.Done():
			if !spooled {
				return fmt.Errorf("record run %s outcome: %w (the outcome is lost: it could not be spooled)", o.RunID, err)
			}
			return fmt.Errorf("record run %s outcome: %w (left in the spool)", o.RunID, err)
		case <-time.After(wait):
		}
		wait = min(2*wait, outcomeRetryMax)
	}
}

// finalizeOutageWait is how long finalize waits before trying again after the database did not
// answer; River's snooze does not count it as an attempt, so an outage of any length never
// exhausts finalize's attempts (finalize.go).
const finalizeOutageWait = 5 * time.Second

// spoolReplayEvery is how often ReplaySpool looks again while outcomes are left to write.
const spoolReplayEvery = 5 * time.Second

// ReplaySpool writes the run outcomes spooled on this node by a process that stopped before
// the database took them: a run still running gets its spooled end (and finalize); a run that
// has ended or is gone just loses its spool file; a corrupt file is set aside. It returns once
// the spool is empty (outcomes this process is itself still recording are not its business) or
// ctx ends. Start it with the working client, in its own goroutine: while an outcome waits in
// the spool, the orphan sweep leaves its run alone.
func ReplaySpool(ctx context.Context, d Deps) error {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	sp := spoolOf(d.Data)
	sp.sweepTemps()
	var ins Inserter
	for {
		left, err := replayPass(ctx, d, sp, &ins)
		if err == nil && left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("replay spool: %d outcomes left: %w", left, errors.Join(err, ctx.Err()))
		case <-time.After(spoolReplayEvery):
		}
	}
}

// replayPass tries every spooled outcome once and returns how many are left.
func replayPass(ctx context.Context, d Deps, sp spool, ins *Inserter) (int, error) {
	ids, err := sp.list()
	if err != nil {
		return 0, err
	}
	left := 0
	var errs []error
	for _, id := range ids {
		if d.Executing.Has(id) {
			continue // this process's executor is recording it
		}
		o, err := sp.load(id)
		if errors.Is(err, errSpoolCorrupt) {
			d.Log.Error("corrupt run spool file set aside", "run_id", id)
			errs = append(errs, sp.quarantine(id))
			continue
		}
		if err != nil {
			left++
			errs = append(errs, err)
			continue
		}
		if *ins == nil {
			c, cerr := inserter(ctx, d)
			if cerr != nil {
				return len(ids), cerr
			}
			*ins = c
		}
		tryCtx, cancel := context.WithTimeout(ctx, outcomeTryTimeout)
		err = writeOutcome(tryCtx, d.Pool, *ins, o)
		cancel()
		if !settledOutcome(err) {
			left++
			errs = append(errs, fmt.Errorf("run %s: %w", id, err))
			continue
		}
		l := runLogByID(ctx, d.Log, d.Pool, id)
		if err == nil {
			l.Info("spooled run outcome recorded", "status", o.Status, "error_code", o.ErrorCode)
		} else {
			l.Warn("spooled run outcome dropped", "status", o.Status, "err", err)
		}
		errs = append(errs, sp.remove(id))
	}
	return left, errors.Join(errs...)
}
