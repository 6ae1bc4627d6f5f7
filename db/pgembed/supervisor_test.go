package pgembed_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"berth/db/pgembed"
)

// lockedBuffer collects log output written from the supervisor's goroutine.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitAnswers polls until a fresh connection to c answers, within d.
func waitAnswers(t *testing.T, c *pgembed.Cluster, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, c.ConnString())
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("PostgreSQL did not answer again within %s: %v", d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSupervisorRestartsKilledPostmaster: SIGKILL the postmaster (its backends are left to
// notice on their own, as after an OOM kill); the owner restarts it, the data is still there,
// each restart is logged, a second kill is survived too, and Stop stops the restarted server.
func TestSupervisorRestartsKilledPostmaster(t *testing.T) {
	t.Parallel()
	dir := newDir(t)
	logs := &lockedBuffer{}
	c, err := pgembed.Start(context.Background(), pgembed.Options{Dir: dir, Fast: true,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	// Fast turns synchronous_commit off, and a killed server loses WAL it had not written yet.
	execSQL(t, c, "SET synchronous_commit = on", "CREATE TABLE kept (v int)", "INSERT INTO kept VALUES (42)")

	// An open session whose backend the kill orphans.
	ctx := context.Background()
	held, err := pgx.Connect(ctx, c.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close(ctx)

	for round := 1; round <= 2; round++ {
		old := c.Pid()
		if old == 0 || old != postmasterPid(t, dir) {
			t.Fatalf("round %d: Pid() = %d, postmaster.pid says %d", round, old, postmasterPid(t, dir))
		}
		if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitAnswers(t, c, time.Minute)
		// The server answers a moment before the supervisor has recorded the restart.
		for deadline := time.Now().Add(10 * time.Second); c.Restarts() < int64(round) && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		if got := c.Restarts(); got != int64(round) {
			t.Fatalf("round %d: Restarts() = %d", round, got)
		}
		if c.Pid() == old || c.Pid() != postmasterPid(t, dir) {
			t.Fatalf("round %d: after the restart Pid() = %d (old %d), postmaster.pid %d", round, c.Pid(), old, postmasterPid(t, dir))
		}
		if v := queryOne[int](t, c, "SELECT v FROM kept"); v != 42 {
			t.Fatalf("round %d: kept = %d", round, v)
		}
	}
	if err := held.Ping(ctx); err == nil {
		t.Fatal("a session of the killed postmaster still answers")
	}
	out := logs.String()
	if n := strings.Count(out, "embedded PostgreSQL exited unexpectedly"); n != 2 {
		t.Fatalf("%d 'exited unexpectedly' lines, want 2:\n%s", n, out)
	}
	if n := strings.Count(out, "restarted embedded PostgreSQL"); n != 2 {
		t.Fatalf("%d 'restarted' lines, want 2:\n%s", n, out)
	}
	pid := c.Pid()
	mustStop(t, c)
	assertStopped(t, dir)
	if processExists(pid) {
		t.Fatalf("the restarted postmaster %d still runs after Stop", pid)
	}
}

// TestSupervisorWaitsForStartLock: while another process holds start.lock the supervisor does
// not start postgres (every start and stop decision is serialized by it); once it is released
// the cluster comes back by itself. Stop while the supervisor waits returns promptly.
func TestSupervisorWaitsForStartLock(t *testing.T) {
	t.Parallel()
	dir := newDir(t)
	c := mustStart(t, pgembed.Options{Dir: dir, Fast: true, Logger: testLogger()})
	lock, err := os.OpenFile(filepath.Join(dir, "start.lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	old := c.Pid()
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // several backoff periods
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, err = pgx.Connect(ctx, c.ConnString())
	cancel()
	if err == nil || c.Restarts() != 0 {
		t.Fatalf("postgres restarted while start.lock was held (restarts %d, connect err %v)", c.Restarts(), err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	waitAnswers(t, c, time.Minute)
	for deadline := time.Now().Add(10 * time.Second); c.Restarts() < 1 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if c.Restarts() != 1 || c.Pid() == old {
		t.Fatalf("after the release: restarts %d, pid %d (old %d)", c.Restarts(), c.Pid(), old)
	}
}

// TestSupervisorKillsStuckBackend: a backend that cannot notice its postmaster's death (here
// SIGSTOPped) keeps the old shared memory, and PostgreSQL refuses to start beside it; the
// supervisor kills such leftovers of its own data directory before it restarts the server.
func TestSupervisorKillsStuckBackend(t *testing.T) {
	t.Parallel()
	dir := newDir(t)
	c := mustStart(t, pgembed.Options{Dir: dir, Fast: true, Logger: testLogger()})
	ctx := context.Background()
	held, err := pgx.Connect(ctx, c.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close(ctx)
	var backend int
	if err := held.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(backend, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // only while it is still that stopped backend: pids are reused (pid_max may be 32768)
		if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", backend)); err == nil {
			if end := bytes.LastIndexByte(stat, ')'); end > 0 && end+2 < len(stat) && stat[end+2] == 'T' {
				_ = syscall.Kill(backend, syscall.SIGKILL)
			}
		}
	})
	if err := syscall.Kill(c.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitAnswers(t, c, time.Minute)
	if processExists(backend) {
		t.Fatalf("the stopped backend %d of the dead server still exists after the restart", backend)
	}
}

// TestStopDuringOutage: Stop while the postmaster is dead and the supervisor waits to restart
// it returns without starting postgres again.
func TestStopDuringOutage(t *testing.T) {
	t.Parallel()
	dir := newDir(t)
	c, err := pgembed.Start(context.Background(), pgembed.Options{Dir: dir, Fast: true, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "start.lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(c.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stopped <- c.Stop(ctx)
	}()
	time.Sleep(200 * time.Millisecond)
	_ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) // Stop takes start.lock too
	select {
	case <-stopped: // "postgres had already exited" is the honest answer here
	case <-time.After(time.Minute):
		t.Fatal("Stop did not return during an outage")
	}
	if c.Restarts() != 0 {
		t.Fatalf("the supervisor restarted postgres during Stop (%d)", c.Restarts())
	}
	time.Sleep(time.Second) // a wrongly started postmaster would have written its pid by now
	if pid := postmasterPid(t, dir); processExists(pid) {
		t.Fatalf("a postmaster (%d) runs after Stop", pid)
	}
}
