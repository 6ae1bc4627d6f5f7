package jobs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"berth/db"
)

// ExpireSetupSessionsInterval is how often the leader times out setup sessions past their ttl.
const ExpireSetupSessionsInterval = 30 * time.Second

// ExpireSetupSessionsArgs asks to time out expired setup sessions.
type ExpireSetupSessionsArgs struct{}

// Kind names the job in River.
func (ExpireSetupSessionsArgs) Kind() string { return "expire_setup_sessions" }

// ExpireSetupSessionsWorker moves live sessions past their expiry (database clock) to timed_out
// and drops their scratch layers (the node's terminal registry ends the shell itself at the same
// expiry), removes scratch layers no live session owns (a cancel or capture interrupted by a
// crash), and prunes old terminal tokens. Running it twice changes nothing more.
type ExpireSetupSessionsWorker struct {
	river.WorkerDefaults[ExpireSetupSessionsArgs]
	deps Deps
}

// Work expires what is due.
func (w *ExpireSetupSessionsWorker) Work(ctx context.Context, _ *river.Job[ExpireSetupSessionsArgs]) error {
	list, err := db.ExpiredSetupSessions(ctx, w.deps.Pool, 100)
	if err != nil {
		return err
	}
	for _, s := range list {
		err := db.InTx(ctx, w.deps.Pool, func(tx pgx.Tx) error {
			s, err := db.MoveSetupSession(ctx, tx, s.CompanyID, s.ID, []string{db.SetupStarting, db.SetupWaitingForUser},
				db.SetupTimedOut, "")
			if err != nil {
				return err
			}
			return db.InsertAudit(ctx, tx, db.AuditEvent{CompanyID: s.CompanyID, ActorType: db.ActorSystem, ActorLabel: "berth",
				Action: "image_setup_session.timed_out", TargetType: "image_setup_session", TargetID: s.ID,
				Details: map[string]any{"environment_id": s.EnvironmentID, "expires_at": s.ExpiresAt}})
		})
		if errors.Is(err, db.ErrConflict) {
			continue // finished or cancelled meanwhile
		}
		if err != nil {
			return err
		}
		removeSetupFiles(w.deps.Data, s)
		if err := ReleaseSetupInstance(ctx, w.deps, s); err != nil && w.deps.Log != nil { // a plugin environment's instance
			w.deps.Log.WarnContext(ctx, "release setup instance", "session_id", s.ID, "err", err)
		}
	}
	if err := w.sweepScratch(ctx); err != nil {
		return err
	}
	_, err = db.PruneTerminalTokens(ctx, w.deps.Pool)
	return err
}

// sweepScratch removes scratch layers whose session is no longer live (or gone).
func (w *ExpireSetupSessionsWorker) sweepScratch(ctx context.Context) error {
	if w.deps.Data.Root == "" {
		return nil
	}
	dirs, err := filepath.Glob(w.deps.Data.ScratchLayers())
	if err != nil {
		return err
	}
	for _, d := range dirs {
		id := scratchSessionID(filepath.Base(d))
		if id == "" {
			continue
		}
		st, err := db.SetupSessionStatus(ctx, w.deps.Pool, id)
		if err != nil && !errors.Is(err, db.ErrNotFound) {
			return err
		}
		if st == db.SetupStarting || st == db.SetupWaitingForUser || st == db.SetupCapturing {
			continue
		}
		_ = os.RemoveAll(d)
		_ = os.RemoveAll(w.deps.Data.SetupWorkspace(id))
	}
	return nil
}
