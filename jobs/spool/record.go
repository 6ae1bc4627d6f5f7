package spool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"berth/db"
)

// Writing a run's outcome through a database outage: the executor spools the outcome, then
// retries its final transaction with backoff for as long as its process lives; River never sees a
// failed attempt, so the job is not discarded while it holds the outcome. A process that stops
// first leaves the spool file, and Replay in its successor writes it.

const (
	// retryFirst and retryMax bound the backoff between tries of a final write.
	retryFirst = 200 * time.Millisecond
	retryMax   = 2 * time.Second
	// TryTimeout bounds one try of a final write, so a database that hangs (rather than refuses)
	// is asked again instead of waited on forever.
	TryTimeout = 15 * time.Second
	// logEvery is how often a write still failing is logged again.
	logEvery = 30 * time.Second
	// replayEvery is how often Replay looks again while outcomes are left to write.
	replayEvery = 5 * time.Second
)

// Writer is a run's final transaction (package jobs: the kept log, the running → terminal
// transition, finalize enqueued). A run no longer running is db.ErrRunState and nothing changes.
type Writer func(ctx context.Context, o Outcome) error

// settled reports whether a final write's error ends the retries: nil (written), the run
// already ended or gone, or the database refusing the data itself (retrying cannot help).
func settled(err error) bool {
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

// Record spools a run's outcome and writes it with write, retrying with backoff until the
// database takes it or ctx (the process's working life) ends; log is the run's logger. It returns
// nil once the outcome is in the database or can never be (logged), and an error only when ctx
// ended first, the outcome then staying in the spool for the next process of this node.
func (s Dir) Record(ctx context.Context, o Outcome, write Writer, log *slog.Logger) error {
	spooled := true
	if err := s.Save(o); err != nil {
		spooled = false // still held in memory below; only a crash now would lose it
		log.Error("run outcome not spooled", "err", err)
	}
	bg := context.WithoutCancel(ctx)
	wait := retryFirst
	var firstFail, lastLogged time.Time
	for attempt := 1; ; attempt++ {
		tryCtx, cancel := context.WithTimeout(bg, TryTimeout)
		err := write(tryCtx, o)
		cancel()
		if settled(err) {
			switch {
			case errors.Is(err, db.ErrRunState) || errors.Is(err, db.ErrNotFound):
				log.Warn("run outcome not recorded: the run had already ended", "status", o.Status, "err", err)
			case err != nil:
				log.Error("run outcome refused by the database", "status", o.Status, "err", err)
			case attempt > 1:
				log.Info("run outcome recorded after a database outage", "status", o.Status, "attempts", attempt,
					"waited_ms", time.Since(firstFail).Milliseconds())
			}
			if rerr := s.remove(o.RunID); rerr != nil {
				log.Error("spooled run outcome not removed", "err", rerr)
			}
			return nil
		}
		now := time.Now()
		if attempt == 1 {
			firstFail = now
		}
		if now.Sub(lastLogged) >= logEvery {
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
		wait = min(2*wait, retryMax)
	}
}

// Replayer is what Replay needs from the process that replays: package jobs provides it.
type Replayer struct {
	// Log takes the spool's own lines (a corrupt file set aside).
	Log *slog.Logger
	// Busy reports whether this process is itself recording runID's outcome (Record): Replay
	// leaves such a file alone.
	Busy func(runID string) bool
	// RunLog is the logger for a line about run runID.
	RunLog func(ctx context.Context, runID string) *slog.Logger
	// Open gives the writer of the final transaction. Replay calls it once, when it first has an
	// outcome to write; an error ends that pass.
	Open func(ctx context.Context) (Writer, error)
}

// Replay writes the run outcomes spooled on this node by a process that stopped before the
// database took them: a run still running gets its spooled end (and finalize); a run that has
// ended or is gone just loses its spool file; a corrupt file is set aside. It returns once the
// spool is empty (outcomes r.Busy names are not its business) or ctx ends.
func (s Dir) Replay(ctx context.Context, r Replayer) error {
	s.sweepTemps()
	var write Writer
	for {
		left, err := s.replayPass(ctx, r, &write)
		if err == nil && left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("replay spool: %d outcomes left: %w", left, errors.Join(err, ctx.Err()))
		case <-time.After(replayEvery):
		}
	}
}

// replayPass tries every spooled outcome once and returns how many are left.
func (s Dir) replayPass(ctx context.Context, r Replayer, write *Writer) (int, error) {
	ids, err := s.List()
	if err != nil {
		return 0, err
	}
	left := 0
	var errs []error
	for _, id := range ids {
		if r.Busy(id) {
			continue // this process's executor is recording it
		}
		o, err := s.load(id)
		if errors.Is(err, errCorrupt) {
			r.Log.Error("corrupt run spool file set aside", "run_id", id)
			errs = append(errs, s.quarantine(id))
			continue
		}
		if err != nil {
			left++
			errs = append(errs, err)
			continue
		}
		if *write == nil {
			w, werr := r.Open(ctx)
			if werr != nil {
				return len(ids), werr
			}
			*write = w
		}
		tryCtx, cancel := context.WithTimeout(ctx, TryTimeout)
		err = (*write)(tryCtx, o)
		cancel()
		if !settled(err) {
			left++
			errs = append(errs, fmt.Errorf("run %s: %w", id, err))
			continue
		}
		l := r.RunLog(ctx, id)
		if err == nil {
			l.Info("spooled run outcome recorded", "status", o.Status, "error_code", o.ErrorCode)
		} else {
			l.Warn("spooled run outcome dropped", "status", o.Status, "err", err)
		}
		errs = append(errs, s.remove(id))
	}
	return left, errors.Join(errs...)
}
