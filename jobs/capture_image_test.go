package jobs

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"berth/db"
	"berth/db/dbtest"
	"berth/workspace"

	"berth/environment/datadir"
)

// imageWorld is a sandbox environment with version 1 active and a setup session in progress
// whose scratch layer holds a tool.
type imageWorld struct {
	pool    *pgxpool.Pool
	deps    Deps
	company string
	env     string
	sess    db.SetupSession
}

func newImageWorld(t *testing.T) imageWorld {
	t.Helper()
	ctx := context.Background()
	w := imageWorld{pool: dbtest.New(t)}
	w.deps = Deps{Pool: w.pool, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Data: datadir.At(t.TempDir())}
	if err := w.pool.QueryRow(ctx, `INSERT INTO companies (name, slug) VALUES ('Acme', 'acme') RETURNING id`).Scan(&w.company); err != nil {
		t.Fatal(err)
	}
	if err := w.pool.QueryRow(ctx, `INSERT INTO environments (company_id, name, driver) VALUES ($1, 'box', 'sandbox') RETURNING id`,
		w.company).Scan(&w.env); err != nil {
		t.Fatal(err)
	}
	if _, err := db.CreateImageVersion(ctx, w.pool, db.NewImageVersion{CompanyID: w.company, EnvironmentID: w.env,
		Digest: workspace.Manifest{}.Digest(), Status: db.ImageActive}); err != nil {
		t.Fatal(err)
	}
	var err error
	w.sess, err = db.CreateSetupSession(ctx, w.pool, db.NewSetupSession{CompanyID: w.company, EnvironmentID: w.env,
		BaseVersion: 1, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	scratch := w.deps.Data.ScratchLayer(w.env, w.sess.ID)
	if err := os.MkdirAll(filepath.Join(scratch, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(scratch, "bin", "mytool"), []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if w.sess, err = db.MoveSetupSession(ctx, w.pool, w.company, w.sess.ID, []string{db.SetupStarting}, db.SetupCapturing, ""); err != nil {
		t.Fatal(err)
	}
	return w
}

func (w imageWorld) capture(worker *CaptureImageWorker, attempt int) error {
	return worker.Work(context.Background(), &river.Job[CaptureImageArgs]{JobRow: &rivertype.JobRow{Attempt: attempt, MaxAttempts: captureAttempts},
		Args: CaptureImageArgs{CompanyID: w.company, SessionID: w.sess.ID}})
}

func (w imageWorld) active(t *testing.T) db.ImageVersion {
	t.Helper()
	v, err := db.ActiveImageVersion(context.Background(), w.pool, w.company, w.env)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestCaptureCrashLeavesTheOldVersion: a capture that dies after the layer is in place and
// before the commit leaves version 1 active, no version 2 row and no layer 2 (a leftover of a
// harder crash is replaced by the retry); the retry then promotes version 2, idempotently.
func TestCaptureCrashLeavesTheOldVersion(t *testing.T) {
	t.Parallel()
	w := newImageWorld(t)
	crash := errors.New("crash")
	worker := &CaptureImageWorker{deps: w.deps, crash: func() error { return crash }}
	if err := w.capture(worker, 1); !errors.Is(err, crash) {
		t.Fatalf("capture = %v, want the crash", err)
	}
	if v := w.active(t); v.Number != 1 {
		t.Fatalf("active after the crash = %d, want 1", v.Number)
	}
	var n int
	if err := w.pool.QueryRow(context.Background(), `SELECT count(*) FROM image_versions WHERE environment_id = $1`, w.env).Scan(&n); err != nil || n != 1 {
		t.Fatalf("versions after the crash = %d %v, want 1", n, err)
	}
	layer2 := w.deps.Data.ImageLayer(w.env, 2)
	if _, err := os.Stat(layer2); !os.IsNotExist(err) {
		t.Fatalf("layer 2 after the crash: %v", err)
	}
	// A harder crash (the process died) could leave a half layer 2 behind: the retry replaces it.
	if err := os.MkdirAll(filepath.Join(layer2, "half"), 0o755); err != nil {
		t.Fatal(err)
	}

	worker.crash = nil
	if err := w.capture(worker, 2); err != nil {
		t.Fatal(err)
	}
	v := w.active(t)
	c, err := workspace.Pack(context.Background(), layer2, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if v.Number != 2 || v.Digest != c.TreeDigest || v.CreatedBySession != w.sess.ID || len(c.Manifest.Entries) != 2 {
		t.Fatalf("active = %+v, layer %v", v, c.Manifest.Entries)
	}
	if fi, err := os.Stat(filepath.Join(layer2, "bin", "mytool")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("tool in layer 2: %v %v", fi, err)
	}
	s, err := db.SetupSessionByID(context.Background(), w.pool, w.company, w.sess.ID)
	if err != nil || s.Status != db.SetupPromoted || s.ResultVersion != 2 {
		t.Fatalf("session = %+v %v", s, err)
	}
	if _, err := os.Stat(w.deps.Data.ScratchLayer(w.env, w.sess.ID)); !os.IsNotExist(err) {
		t.Fatalf("scratch after the capture: %v", err)
	}
	// Running it again changes nothing.
	if err := w.capture(worker, 3); err != nil {
		t.Fatal(err)
	}
	if v := w.active(t); v.Number != 2 {
		t.Fatalf("active after a repeat = %d", v.Number)
	}
}

// TestCaptureGivesUpAsFailed: the last attempt's failure marks the session failed; version 1
// stays active.
func TestCaptureGivesUpAsFailed(t *testing.T) {
	t.Parallel()
	w := newImageWorld(t)
	worker := &CaptureImageWorker{deps: w.deps, crash: func() error { return errors.New("disk full") }}
	if err := w.capture(worker, captureAttempts); err == nil {
		t.Fatal("capture succeeded")
	}
	s, err := db.SetupSessionByID(context.Background(), w.pool, w.company, w.sess.ID)
	if err != nil || s.Status != db.SetupFailed || s.Error == "" {
		t.Fatalf("session = %+v %v", s, err)
	}
	if v := w.active(t); v.Number != 1 {
		t.Fatalf("active = %d", v.Number)
	}
}

// TestExpireSetupSessions: a session past its ttl times out and loses its scratch layer; a
// scratch layer no live session owns is swept; a live session's is kept.
func TestExpireSetupSessions(t *testing.T) {
	t.Parallel()
	w := newImageWorld(t)
	ctx := context.Background()
	// The world's session is capturing: make it a cancelled one whose scratch was left behind.
	if _, err := w.pool.Exec(ctx, `UPDATE image_setup_sessions SET status = 'cancelled' WHERE id = $1`, w.sess.ID); err != nil {
		t.Fatal(err)
	}
	live, err := db.CreateSetupSession(ctx, w.pool, db.NewSetupSession{CompanyID: w.company, EnvironmentID: w.env, BaseVersion: 1, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.CreateSetupSession(ctx, w.pool, db.NewSetupSession{CompanyID: w.company, EnvironmentID: w.env, BaseVersion: 1, TTL: time.Hour}); !errors.Is(err, db.ErrConflict) {
		t.Fatalf("a second live session: %v, want ErrConflict", err)
	}
	for _, id := range []string{live.ID} {
		if err := os.MkdirAll(w.deps.Data.ScratchLayer(w.env, id), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	worker := &ExpireSetupSessionsWorker{deps: w.deps}
	work := func() {
		t.Helper()
		if err := worker.Work(ctx, &river.Job[ExpireSetupSessionsArgs]{JobRow: &rivertype.JobRow{}}); err != nil {
			t.Fatal(err)
		}
	}
	work()
	if _, err := os.Stat(w.deps.Data.ScratchLayer(w.env, w.sess.ID)); !os.IsNotExist(err) {
		t.Fatalf("orphan scratch kept: %v", err)
	}
	if _, err := os.Stat(w.deps.Data.ScratchLayer(w.env, live.ID)); err != nil {
		t.Fatalf("live scratch removed: %v", err)
	}
	if _, err := w.pool.Exec(ctx, `UPDATE image_setup_sessions SET expires_at = now() - interval '1 second' WHERE id = $1`, live.ID); err != nil {
		t.Fatal(err)
	}
	work()
	s, err := db.SetupSessionByID(ctx, w.pool, w.company, live.ID)
	if err != nil || s.Status != db.SetupTimedOut || s.FinishedAt == nil {
		t.Fatalf("expired session = %+v %v", s, err)
	}
	if _, err := os.Stat(w.deps.Data.ScratchLayer(w.env, live.ID)); !os.IsNotExist(err) {
		t.Fatalf("expired scratch kept: %v", err)
	}
	work() // nothing more to do
	var n int
	if err := w.pool.QueryRow(ctx, `SELECT count(*) FROM audit_events WHERE action = 'image_setup_session.timed_out'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("timed_out audited %d times", n)
	}
}
