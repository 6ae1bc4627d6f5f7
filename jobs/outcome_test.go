package jobs

import (
	"bytes"
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"berth/db"
	"berth/db/dbtest"
	"berth/environment/datadir"
	"berth/jobs/executing"
	"berth/jobs/internal/jobstest"
	"berth/jobs/spool"
)

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
	sp := spool.Of(datadir.At(data))

	spooled := w.run(db.RunRunning, "n1", 0)
	w.job(ExecuteRunArgs{RunID: spooled}, "n1@dead", 0)
	exit := 3
	if err := sp.Save(spool.Outcome{RunID: spooled, Status: db.RunFailed, ErrorCode: codeCommandFailed,
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
	if err := sp.Save(spool.Outcome{RunID: ended, Status: db.RunSucceeded, ExitCode: &zero}); err != nil {
		t.Fatal(err)
	}

	e := executing.New("n1")
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
	if ids, _ := sp.List(); len(ids) != 0 {
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
