package spool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"berth/db"
	"berth/environment/datadir"
	"berth/environment/jail/jailtest"
	"berth/jobs/internal/jobstest"
)

// TestSpoolFiles: an outcome is saved atomically with private modes, read back whole, listed,
// replaced, removed; an id that is not a run id never names a file; a corrupt file is refused
// and set aside.
func TestSpoolFiles(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	sp := Of(datadir.At(data))
	id := jobstest.UUID()
	exit := 3
	o := Outcome{RunID: id, Status: db.RunFailed, ErrorCode: "command_failed", ErrorMessage: "exit 3", ExitCode: &exit,
		Log: []byte("first\nLAST\n"), LogHead: 11, LogTotal: 11}
	if sp.Has(id) {
		t.Fatal("empty spool has the run")
	}
	if err := sp.Save(o); err != nil {
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
		got.LogTotal != 11 || got.ErrorCode != "command_failed" {
		t.Fatalf("load = %+v, %v", got, err)
	}
	o.ErrorMessage = "replaced"
	if err := sp.Save(o); err != nil {
		t.Fatal(err)
	}
	if got, _ := sp.load(id); got.ErrorMessage != "replaced" {
		t.Fatalf("second save not read back: %q", got.ErrorMessage)
	}
	entries, _ := os.ReadDir(filepath.Dir(p))
	if len(entries) != 1 {
		t.Fatalf("spool dir holds %d entries after two saves, want 1 (no temporary left)", len(entries))
	}
	if ids, err := sp.List(); err != nil || len(ids) != 1 || ids[0] != id {
		t.Fatalf("list = %v, %v", ids, err)
	}
	if err := sp.Save(Outcome{RunID: "../../etc/x", Status: "failed"}); err == nil {
		t.Fatal("a path-like run id was spooled")
	}
	if sp.Has("../" + id) {
		t.Fatal("has followed a path-like id")
	}
	if err := sp.remove(id); err != nil || sp.Has(id) {
		t.Fatalf("remove: %v, still there %v", err, sp.Has(id))
	}
	if err := sp.remove(id); err != nil {
		t.Fatalf("second remove: %v", err)
	}

	bad := jobstest.UUID()
	if err := os.WriteFile(filepath.Join(data, "spool", "runs", bad+".json"), []byte(`{"run_id":"`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := sp.load(bad); !errors.Is(err, errCorrupt) {
		t.Fatalf("corrupt load = %v, want errCorrupt", err)
	}
	if err := sp.quarantine(bad); err != nil || sp.Has(bad) {
		t.Fatalf("quarantine: %v, has %v", err, sp.Has(bad))
	}
	if _, err := os.Stat(filepath.Join(data, "spool", "runs", bad+".json.corrupt")); err != nil {
		t.Fatalf("quarantined file not kept: %v", err)
	}
	// Without a data dir nothing touches the disk.
	if err := Of(datadir.Layout{}).Save(o); err != nil || Of(datadir.Layout{}).Has(id) {
		t.Fatalf("dataless spool: %v", err)
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
		if got := settled(tc.err); got != tc.settled {
			t.Errorf("settled(%v) = %v, want %v", tc.err, got, tc.settled)
		}
	}
}

// BenchmarkSpoolSave measures what spooling adds to every run's end: one atomic, fsynced save of
// the outcome on the data dir's disk (outside /tmp), and its removal, for a 1 KiB log and for a
// full 1 MiB kept log (ms/save).
func BenchmarkSpoolSave(b *testing.B) {
	for _, size := range []int{1 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("log=%dKiB", size>>10), func(b *testing.B) {
			sp := Of(datadir.At(jailtest.Dir(b)))
			exit := 1
			o := Outcome{RunID: jobstest.UUID(), Status: db.RunFailed, ErrorCode: "command_failed", ExitCode: &exit,
				Log: bytes.Repeat([]byte("x"), size), LogHead: size, LogTotal: int64(size)}
			b.ResetTimer()
			start := time.Now()
			for b.Loop() {
				if err := sp.Save(o); err != nil {
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

// TestReplay: one pass over a spool holding an outcome this process is still recording, a
// corrupt file, an outcome the database takes, one whose run has ended and one the database does
// not answer for: the busy one is left alone, the corrupt one set aside, the taken and ended ones
// removed, the unanswered one kept; the writer is opened once, and a writer that cannot be opened
// leaves every outcome in place. Replay then returns when ctx ends, with what is left.
func TestReplay(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	sp := Of(datadir.At(data))
	busy, taken, ended, down, bad := jobstest.UUID(), jobstest.UUID(), jobstest.UUID(), jobstest.UUID(), jobstest.UUID()
	for _, id := range []string{busy, taken, ended, down} {
		if err := sp.Save(Outcome{RunID: id, Status: db.RunSucceeded}); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(data, "spool", "runs", bad+".json"), []byte(`{`), 0o600); err != nil {
		t.Fatal(err)
	}
	var written []string
	opened := 0
	r := Replayer{
		Log:    jobstest.Log(),
		Busy:   func(id string) bool { return id == busy },
		RunLog: func(context.Context, string) *slog.Logger { return jobstest.Log() },
		Open: func(context.Context) (Writer, error) {
			return nil, errors.New("no client")
		},
	}
	var write Writer
	if left, err := sp.replayPass(context.Background(), r, &write); err == nil || left != 5 || write != nil {
		t.Fatalf("a writer that cannot be opened: left %d, %v", left, err)
	}
	r.Open = func(context.Context) (Writer, error) {
		opened++
		return func(_ context.Context, o Outcome) error {
			written = append(written, o.RunID)
			switch o.RunID {
			case ended:
				return fmt.Errorf("run %s: %w", o.RunID, db.ErrRunState)
			case down:
				return &pgconn.PgError{Code: "57P01"}
			}
			return nil
		}, nil
	}
	left, err := sp.replayPass(context.Background(), r, &write)
	if left != 1 || err == nil || opened != 1 {
		t.Fatalf("pass: left %d, opened %d, %v", left, opened, err)
	}
	if len(written) != 3 || slices.Contains(written, busy) {
		t.Fatalf("written %v", written)
	}
	ids, _ := sp.List()
	slices.Sort(ids)
	want := []string{busy, down}
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Fatalf("left in the spool %v, want %v", ids, want)
	}
	if _, err := os.Stat(filepath.Join(data, "spool", "runs", bad+".json.corrupt")); err != nil {
		t.Fatalf("corrupt file not set aside: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := sp.Replay(ctx, r); err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Replay with an outcome left = %v, want the deadline", err)
	}
	if opened != 2 {
		t.Fatalf("Replay opened %d writers in all, want one more", opened)
	}
}

// TestRecord: an outcome whose write fails (the database does not answer) is kept in the spool
// and tried again until the write lands, then removed; when ctx ends first it stays for the
// node's next process.
func TestRecord(t *testing.T) {
	t.Parallel()
	sp := Of(datadir.At(t.TempDir()))
	o := Outcome{RunID: jobstest.UUID(), Status: db.RunSucceeded}
	tries := 0
	write := func(ctx context.Context, got Outcome) error {
		tries++
		if !sp.Has(got.RunID) {
			t.Error("written before it was spooled")
		}
		if _, ok := ctx.Deadline(); !ok {
			t.Error("a try without a deadline")
		}
		if tries < 3 {
			return errors.New("dial: connection refused")
		}
		return nil
	}
	if err := sp.Record(context.Background(), o, write, jobstest.Log()); err != nil || tries != 3 || sp.Has(o.RunID) {
		t.Fatalf("Record = %v after %d tries, still spooled %v", err, tries, sp.Has(o.RunID))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	never := func(context.Context, Outcome) error { return errors.New("dial: connection refused") }
	if err := sp.Record(ctx, o, never, jobstest.Log()); err == nil || !sp.Has(o.RunID) {
		t.Fatalf("Record past its context = %v, spooled %v", err, sp.Has(o.RunID))
	}
}
