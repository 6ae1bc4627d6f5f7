package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"

	"berth/db"
)

// HousekeepingInterval is how often the leader enqueues housekeeping.
const HousekeepingInterval = 10 * time.Minute

// loginAttemptRetention keeps login attempts long enough for rate limiting and for an operator to
// look back at an attack, and no longer.
const loginAttemptRetention = 7 * 24 * time.Hour

// HousekeepingArgs asks for one housekeeping pass: pruning data whose use has passed.
type HousekeepingArgs struct{}

// Kind names the job in River.
func (HousekeepingArgs) Kind() string { return "housekeeping" }

// InsertOpts makes concurrent enqueues (several nodes starting at once) collapse into one job.
func (HousekeepingArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByPeriod: time.Minute}}
}

// HousekeepingWorker prunes old login attempts and expired browser sessions. Running it twice is
// harmless: both deletes are conditional on age.
type HousekeepingWorker struct {
	river.WorkerDefaults[HousekeepingArgs]
	deps Deps
}

// Work runs one pass.
func (w *HousekeepingWorker) Work(ctx context.Context, job *river.Job[HousekeepingArgs]) error {
	attempts, err := db.PruneLoginAttempts(ctx, w.deps.Pool, loginAttemptRetention)
	if err != nil {
		return err
	}
	sessions, err := db.PruneSessions(ctx, w.deps.Pool)
	if err != nil {
		return fmt.Errorf("housekeeping: %w", err)
	}
	w.deps.Log.Info("housekeeping done", "login_attempts_pruned", attempts, "sessions_pruned", sessions)
	return nil
}
