package jobs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"berth/db"
	"berth/db/dbtest"
	"berth/environment/jail/jailtest"

	"berth/environment/datadir"
	"berth/jobs/internal/jobstest"
)

// TestSpoolFiles: an outcome is saved atomically with private modes, read back whole, listed,
// replaced, removed; an id that is not a run id never names a file; a corrupt file is refused
// and set aside.
func TestSpoolFiles(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	sp := spoolOf(datadir.At(data))
	id := jobstest.UUID()
	exit := 3
	o := runOutcome{RunID: id, Status: db.RunFailed, ErrorCode: codeCommandFailed, ErrorMessage: "exit 3", ExitCode: &exit,
		Log: []byte("first\nLAST\n"), LogHead: 11, LogTotal: 11}
	if sp.has(id) {
		t.Fatal("empty spool has the run")
	}
	if err := sp.save(o); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(data, "spool", "runs", id+".json")
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("spool file %v mode %v, want 0600", err, fi)
	}
	if di, err := os.Stat(filepath.Dir(p)); err != nil || di.Mode().Perm() != 0o700 {
		t.Fatalf("spool dir mode %v (%v), want 0700", di, err)
	}
	got, err := sp.load(id)
	if err != nil || got.Status != o.Status || got.ExitCode == nil || *got.ExitCode != 3 || !bytes.Equal(got.Log, o.Log) ||
		got.LogTotal != 11 || got.ErrorCode != codeCommandFailed {
		t.Fatalf("load = %+v, %v", got, err)
	}
	o.ErrorMessage = "replaced"
	if err := sp.save(o); err != nil {
		t.Fatal(err)
	}
	if got, _ := sp.load(id); got.ErrorMessage != "replaced" {
		t.Fatalf("second save not read back: %q", got.ErrorMessage)
	}
	entries, _ := os.ReadDir(filepath.Dir(p))
	if len(entries) != 1 {
		t.Fatalf("spool dir holds %d entries after two saves, want 1 (no temporary left)", len(entries))
	}
	if ids, err := sp.list(); err != nil || len(ids) != 1 || ids[0] != id {
		t.Fatalf("list = %v, %v", ids, err)
	}
	if err := sp.save(runOutcome{RunID: "../../etc/x", Status: "failed"}); err == nil {
		t.Fatal("a path-like run id was spooled")
	}
	if sp.has("../" + id) {
		t.Fatal("has followed a path-like id")
	}
	if err := sp.remove(id); err != nil || sp.has(id) {
		t.Fatalf("remove: %v, still there %v", err, sp.has(id))
	}
	if err := sp.remove(id); err != nil {
		t.Fatalf("second remove: %v", err)
	}

	bad := jobstest.UUID()
	if err := os.WriteFile(filepath.Join(data, "spool", "runs", bad+".json"), []byte(`{"run_id":"`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := sp.load(bad); !errors.Is(err, errSpoolCorrupt) {
		t.Fatalf("corrupt load = %v, want errSpoolCorrupt", err)
	}
	if err := sp.quarantine(bad); err != nil || sp.has(bad) {
		t.Fatalf("quarantine: %v, has %v", err, sp.has(bad))
	}
	if _, err := os.Stat(filepath.Join(data, "spool", "runs", bad+".json.corrupt")); err != nil {
		t.Fatalf("quarantined file not kept: %v", err)
	}
	// Without a data dir nothing touches the disk.
	if err := spoolOf(datadir.Layout{}).save(o); err != nil || spoolOf(datadir.Layout{}).has(id) {
		t.Fatalf("dataless spool: %v", err)
	}
}

// TestSpoolReplayAfterRestart (fault F-spool): node n1's executor finished a run during an
// outage and died before the database took the outcome; its successor on the node starts. The
// startup sweep leaves the spooled run alone (a run of the dead process without a spool file is
// orphaned at once, proving the sweep would have), ReplaySpool writes the spooled end with its
// own exit and error codes and last log line and enqueues finalize, and removes the file; a
// spool file of a run that has ended meanwhile is dropped without touching the run.
func TestSpoolReplayAfterRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newSweepWorld(t)
	data := t.TempDir()
	sp := spoolOf(datadir.At(data))

	spooled := w.run(db.RunRunning, "n1", 0)
	w.job(ExecuteRunArgs{RunID: spooled}, "n1@dead", 0)
	exit := 3
	if err := sp.save(runOutcome{RunID: spooled, Status: db.RunFailed, ErrorCode: codeCommandFailed,
		ErrorMessage: "The command exited with status 3.", ExitCode: &exit, Log: []byte("working\nLAST LINE\n"),
		LogHead: 18, LogTotal: 18}); err != nil {
		t.Fatal(err)
	}
	unspooled := w.run(db.RunRunning, "n1", 0)
	w.job(ExecuteRunArgs{RunID: unspooled}, "n1@dead", 0)
	ended := w.run(db.RunRunning, "n1", 0)
	if _, err := w.pool.Exec(ctx, `UPDATE runs SET status = 'cancelled', error_code = 'cancelled', finished_at = now()
		WHERE id = $1`, ended); err != nil {
		t.Fatal(err)
	}
	zero := 0
	if err := sp.save(runOutcome{RunID: ended, Status: db.RunSucceeded, ExitCode: &zero}); err != nil {
		t.Fatal(err)
	}

	e := NewExecuting("n1")
	if err := e.Claim(ctx, w.pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	d := Deps{Pool: w.pool, Log: jobstest.Log(), NodeID: "n1", Executing: e, Data: datadir.At(data)}
	if err := SweepOrphans(ctx, d); err != nil {
		t.Fatal(err)
	}
	if r := w.runRow(spooled); r.Status != db.RunRunning {
		t.Fatalf("spooled run swept: %s/%s", r.Status, r.ErrorCode)
	}
	if r := w.runRow(unspooled); r.Status != db.RunFailed || r.ErrorCode != codeOrphaned {
		t.Fatalf("the dead process's unspooled run = %s/%s, want failed/orphaned", r.Status, r.ErrorCode)
	}

	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := ReplaySpool(rctx, d); err != nil {
		t.Fatal(err)
	}
	r := w.runRow(spooled)
	if r.Status != db.RunFailed || r.ErrorCode != codeCommandFailed || r.ExitCode == nil || *r.ExitCode != 3 || r.FinishedAt == nil {
		t.Fatalf("replayed run = %s/%s exit %v", r.Status, r.ErrorCode, r.ExitCode)
	}
	log, err := db.RunLogOf(ctx, w.pool, w.company, spooled)
	if err != nil || !bytes.HasSuffix(log.Data, []byte("LAST LINE\n")) || log.Total != 18 {
		t.Fatalf("replayed log = %q (%d), %v", log.Data, log.Total, err)
	}
	if n := w.count(`SELECT count(*) FROM river_job WHERE kind = 'finalize' AND args->>'run_id' = $1`, spooled); n != 1 {
		t.Fatalf("%d finalize jobs for the replayed run, want 1", n)
	}
	if n := w.count(`SELECT count(*) FROM execution_workspaces WHERE id = $1 AND finalize_state = 'pending'`, r.ExecutionWorkspaceID); n != 1 {
		t.Fatal("the replayed run's workspace finalize is not pending")
	}
	if r := w.runRow(ended); r.Status != db.RunCancelled {
		t.Fatalf("replay rewrote an ended run: %s", r.Status)
	}
	if n := w.count(`SELECT count(*) FROM river_job WHERE kind = 'finalize' AND args->>'run_id' = $1`, ended); n != 0 {
		t.Fatal("replay enqueued finalize for a run that had ended")
	}
	if ids, _ := sp.list(); len(ids) != 0 {
		t.Fatalf("spool after replay = %v, want empty", ids)
	}
	// A later sweep still leaves the replayed run's own verdict alone.
	if err := SweepOrphans(ctx, d); err != nil {
		t.Fatal(err)
	}
	if r := w.runRow(spooled); r.ErrorCode != codeCommandFailed {
		t.Fatalf("after a second sweep the run says %s", r.ErrorCode)
	}
}

// TestFinalizeOutageCostsNoAttempt: a finalize attempt whose database cannot be reached (a real
// pgx pool whose every connect is refused) snoozes, which River does not count as an attempt,
// instead of failing towards its last attempt; so does its last attempt, which therefore never
// marks the workspace's finalize failed.
func TestFinalizeOutageCostsNoAttempt(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(dbtest.ConnString(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DialFunc = func(context.Context, string, string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	cfg.ConnConfig.ConnectTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	w := &FinalizeWorker{runWorker: runWorker{deps: Deps{Pool: pool, Log: jobstest.Log()}}}
	for _, attempt := range []int{1, finalizeAttempts} {
		job := &river.Job[FinalizeArgs]{JobRow: &rivertype.JobRow{Attempt: attempt, MaxAttempts: finalizeAttempts},
			Args: FinalizeArgs{RunID: jobstest.UUID()}}
		var snooze *rivertype.JobSnoozeError
		if err := w.Work(context.Background(), job); !errors.As(err, &snooze) {
			t.Fatalf("attempt %d against an unreachable database = %v, want a snooze", attempt, err)
		}
	}
	// execute_run has one attempt, the command's: an outage before the command starts snoozes
	// it too instead of spending that attempt (and leaving the run to the orphan sweep).
	ew := &ExecuteRunWorker{runWorker: runWorker{deps: Deps{Pool: pool, Log: jobstest.Log()}}}
	ejob := &river.Job[ExecuteRunArgs]{JobRow: &rivertype.JobRow{Attempt: 1, MaxAttempts: 1}, Args: ExecuteRunArgs{RunID: jobstest.UUID()}}
	var snooze *rivertype.JobSnoozeError
	if err := ew.Work(context.Background(), ejob); !errors.As(err, &snooze) {
		t.Fatalf("execute_run against an unreachable database = %v, want a snooze", err)
	}
}

// TestSettledOutcome: the final write stops retrying on success, on a run that already ended or
// is gone, and on the database refusing the data; it keeps retrying on anything else (a refused
// connection, a broken one, a timeout).
func TestSettledOutcome(t *testing.T) {
	t.Parallel()
	cases := []struct {
		err     error
		settled bool
	}{
		{nil, true},
		{fmt.Errorf("run x to failed: %w", db.ErrRunState), true},
		{db.ErrNotFound, true},
		{&pgconn.PgError{Code: "23505"}, true},
		{&pgconn.PgError{Code: "22P02"}, true},
		{&pgconn.PgError{Code: "57P01"}, false},
		{&pgconn.PgError{Code: "08006"}, false},
		{&pgconn.PgError{Code: "40001"}, false},
		{context.DeadlineExceeded, false},
		{errors.New("dial: connection refused"), false},
	}
	for _, tc := range cases {
		if got := settledOutcome(tc.err); got != tc.settled {
			t.Errorf("settledOutcome(%v) = %v, want %v", tc.err, got, tc.settled)
		}
	}
}

// BenchmarkSpoolSave measures what spooling adds to every run's end: one atomic, fsynced save of
// the outcome on the data dir's disk (outside /tmp), and its removal, for a 1 KiB log and for a
// full 1 MiB kept log (ms/save).
func BenchmarkSpoolSave(b *testing.B) {
	for _, size := range []int{1 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("log=%dKiB", size>>10), func(b *testing.B) {
			sp := spoolOf(datadir.At(jailtest.Dir(b)))
			exit := 1
			o := runOutcome{RunID: jobstest.UUID(), Status: db.RunFailed, ErrorCode: codeCommandFailed, ExitCode: &exit,
				Log: bytes.Repeat([]byte("x"), size), LogHead: size, LogTotal: int64(size)}
			b.ResetTimer()
			start := time.Now()
			for b.Loop() {
				if err := sp.save(o); err != nil {
					b.Fatal(err)
				}
				if err := sp.remove(o.RunID); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N), "ms/save")
		})
	}
}
