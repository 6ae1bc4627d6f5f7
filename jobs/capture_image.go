package jobs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"berth/db"
	"berth/environment/datadir"
	"berth/workspace"
)

// captureAttempts is how often a capture is tried before its session is marked failed (the
// previous version then stays active).
const captureAttempts = 5

// CaptureImageArgs asks to turn a finished setup session's scratch layer into the environment's
// next image version.
type CaptureImageArgs struct {
	CompanyID string `json:"company_id"`
	SessionID string `json:"session_id"`
}

// Kind names the job in River.
func (CaptureImageArgs) Kind() string { return "capture_image" }

// InsertOpts bounds the retries.
func (CaptureImageArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: captureAttempts}
}

// CaptureImageWorker packs the scratch layer into a capsule (deterministic tar, manifest, tree
// digest), imports it as directory <number> (staged, verified, fsynced, renamed into place only
// when complete) and, in one transaction, records the version active, makes the previous active
// one available and the session promoted. A crash anywhere before that commit leaves the old
// version active and no version row: a directory left under the next number belongs to no row,
// and the retry replaces it.
type CaptureImageWorker struct {
	river.WorkerDefaults[CaptureImageArgs]
	deps Deps
	// crash, when set (tests), runs after the layer is in place and before the commit; an error
	// stands for a crash at that point.
	crash func() error
}

// Work captures the session's layer; a session that is no longer capturing is left alone.
func (w *CaptureImageWorker) Work(ctx context.Context, job *river.Job[CaptureImageArgs]) error {
	err := w.capture(ctx, job.Args)
	if err != nil && job.Attempt >= job.MaxAttempts {
		w.fail(ctx, job.Args, err)
	}
	return err
}

func (w *CaptureImageWorker) capture(ctx context.Context, a CaptureImageArgs) error {
	sess, err := db.SetupSessionByID(ctx, w.deps.Pool, a.CompanyID, a.SessionID)
	if errors.Is(err, db.ErrNotFound) || err == nil && sess.Status != db.SetupCapturing {
		return nil
	}
	if err != nil {
		return err
	}
	if w.deps.Data.Root == "" {
		return fmt.Errorf("capture image: no data dir")
	}
	scratch := w.deps.Data.ScratchLayer(sess.EnvironmentID, sess.ID)
	if fi, err := os.Stat(scratch); err != nil || !fi.IsDir() {
		w.fail(ctx, a, fmt.Errorf("the scratch layer is gone"))
		return nil
	}
	envDir := filepath.Dir(scratch)
	capsule := filepath.Join(envDir, ".capture-"+sess.ID+".tar")
	defer os.Remove(capsule)
	c, err := packFile(ctx, scratch, capsule)
	if err != nil {
		return fmt.Errorf("capture image: %w", err)
	}

	var number int
	var layer string
	err = db.InTx(ctx, w.deps.Pool, func(tx pgx.Tx) error {
		if _, err := db.LockEnvironment(ctx, tx, sess.CompanyID, sess.EnvironmentID); err != nil {
			return err
		}
		var err error
		if number, err = db.NextImageVersionNumber(ctx, tx, sess.EnvironmentID); err != nil {
			return fmt.Errorf("capture image: next number: %w", err)
		}
		layer = w.deps.Data.ImageLayer(sess.EnvironmentID, number)
		// No row has this number: whatever is there is a crashed attempt's leftover.
		if err := os.RemoveAll(layer); err != nil {
			return fmt.Errorf("capture image: clear %d: %w", number, err)
		}
		f, err := os.Open(capsule)
		if err != nil {
			return fmt.Errorf("capture image: %w", err)
		}
		err = workspace.Import(ctx, f, c.Manifest, layer, workspace.Limits{})
		f.Close()
		if err != nil {
			return fmt.Errorf("capture image: %w", err)
		}
		if w.crash != nil {
			if err := w.crash(); err != nil {
				return err
			}
		}
		v, err := db.CreateImageVersion(ctx, tx, db.NewImageVersion{CompanyID: sess.CompanyID, EnvironmentID: sess.EnvironmentID,
			Digest: c.TreeDigest, Size: c.Manifest.TotalSize(), Status: db.ImageAvailable, CreatedBySession: sess.ID,
			CreatedBy: sess.UserID})
		if err != nil {
			return err
		}
		if v.Number != number {
			return fmt.Errorf("capture image: numbered %d, expected %d: %w", v.Number, number, db.ErrConflict)
		}
		prev, _, err := db.ActivateImageVersion(ctx, tx, sess.CompanyID, sess.EnvironmentID, number)
		if err != nil {
			return err
		}
		if _, err := db.PromoteSetupSession(ctx, tx, sess.CompanyID, sess.ID, number); err != nil {
			return err
		}
		skipped := make([]string, 0, len(c.Skipped))
		for _, s := range c.Skipped {
			skipped = append(skipped, s.Path)
		}
		return db.InsertAudit(ctx, tx, db.AuditEvent{CompanyID: sess.CompanyID, ActorType: db.ActorSystem,
			ActorLabel: "berth", Action: "image_setup_session.promoted", TargetType: "image_setup_session", TargetID: sess.ID,
			Details: map[string]any{"environment_id": sess.EnvironmentID, "version": number, "previous_version": prev.Number,
				"digest": c.TreeDigest, "size": c.Manifest.TotalSize(), "skipped": skipped}})
	})
	if err != nil {
		if layer != "" {
			_ = os.RemoveAll(layer) // never recorded: nothing points at it
		}
		return err
	}
	removeSetupFiles(w.deps.Data, sess)
	w.deps.Log.InfoContext(ctx, "image captured", "environment_id", sess.EnvironmentID, "version", number, "digest", c.TreeDigest)
	return nil
}

// packFile packs dir into a capsule file, fsynced.
func packFile(ctx context.Context, dir, path string) (workspace.Capsule, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return workspace.Capsule{}, err
	}
	c, err := workspace.Pack(ctx, dir, f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return c, err
}

// fail marks the session failed (its scratch layer is dropped; the active version is unchanged).
func (w *CaptureImageWorker) fail(ctx context.Context, a CaptureImageArgs, cause error) {
	ctx = context.WithoutCancel(ctx)
	err := db.InTx(ctx, w.deps.Pool, func(tx pgx.Tx) error {
		s, err := db.MoveSetupSession(ctx, tx, a.CompanyID, a.SessionID, []string{db.SetupCapturing}, db.SetupFailed,
			"capture failed: "+cause.Error())
		if err != nil {
			return err
		}
		return db.InsertAudit(ctx, tx, db.AuditEvent{CompanyID: s.CompanyID, ActorType: db.ActorSystem, ActorLabel: "berth",
			Action: "image_setup_session.failed", TargetType: "image_setup_session", TargetID: s.ID,
			Details: map[string]any{"environment_id": s.EnvironmentID, "error": cause.Error()}})
	})
	if err != nil {
		w.deps.Log.ErrorContext(ctx, "mark setup session failed", "session_id", a.SessionID, "err", err)
	}
}

// removeSetupFiles drops a session's scratch layer and shell workspace; the transcript stays.
func removeSetupFiles(data datadir.Layout, s db.SetupSession) {
	if data.Root == "" || !db.ValidID(s.ID) {
		return
	}
	_ = os.RemoveAll(data.ScratchLayer(s.EnvironmentID, s.ID))
	_ = os.RemoveAll(data.SetupWorkspace(s.ID))
}

// RemoveSetupFiles is removeSetupFiles for the handlers (cancel).
func RemoveSetupFiles(data datadir.Layout, s db.SetupSession) { removeSetupFiles(data, s) }

// scratchSessionID is the session id in a scratch layer's directory name, "" for other names.
func scratchSessionID(name string) string {
	id, ok := strings.CutPrefix(name, "scratch-")
	if !ok || !db.ValidID(id) {
		return ""
	}
	return id
}
