package pgembed_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"berth/db/pgembed"
)

// Environment of TestHelperProcess, which other tests run as a second OS process.
const (
	helperModeEnv = "PGEMBED_TEST_HELPER" // borrow, own, nonroot
	helperDirEnv  = "PGEMBED_TEST_DIR"
)

// nobody is the unprivileged uid/gid of the non-root test.
const nobody = 65534

func TestStartRestartKeepsData(t *testing.T) {
	t.Parallel()
	dir := newDir(t)
	opts := pgembed.Options{Dir: dir, Logger: testLogger()} // not Fast: the production path

	began := time.Now()
	c := mustStart(t, opts)
	first := time.Since(began)
	if !c.Owned() {
		t.Fatal("first Start on an empty dir does not own the cluster")
	}
	want := fmt.Sprintf("host=%s/run port=5432 user=berth dbname=berth sslmode=disable", dir)
	if got := c.ConnString(); got != want {
		t.Fatalf("ConnString() = %q, want %q", got, want)
	}
	if got := queryOne[int](t, c, "SELECT 1"); got != 1 {
		t.Fatalf("SELECT 1 = %d", got)
	}
	for _, name := range []string{dir, filepath.Join(dir, "run")} {
		if fi, err := os.Stat(name); err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("%s: mode %v, err %v; want 0700", name, fi.Mode().Perm(), err)
		}
	}
	execSQL(t, c, "CREATE TABLE notes (body text)", "INSERT INTO notes VALUES ('kept')")
	mustStop(t, c)
	if err := c.Stop(context.Background()); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	assertStopped(t, dir)

	began = time.Now()
	c = mustStart(t, opts)
	second := time.Since(began)
	if !c.Owned() {
		t.Fatal("Start on a stopped cluster does not own it")
	}
	if got := queryOne[string](t, c, "SELECT body FROM notes"); got != "kept" {
		t.Fatalf("after restart: body = %q, want kept", got)
	}
	t.Logf("Start with initdb: %v; Start with existing data: %v", first.Round(time.Millisecond), second.Round(time.Millisecond))

	execSQL(t, c, "INSERT INTO notes VALUES ('recovered')")
	mustStop(t, c)

	// A Stop whose context has already ended escalates to immediate shutdown;
	// the next Start runs crash recovery and keeps committed data.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	crashed, err := pgembed.Start(ctx, opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = crashed.Stop(context.Background()) }) // repeats the result below
	execSQL(t, crashed, "INSERT INTO notes VALUES ('after immediate shutdown')")
	ended, end := context.WithCancel(ctx)
	end()
	err = crashed.Stop(ended)
	t.Logf("Stop with an ended context: %v", err)
	assertStopped(t, dir)
	c = mustStart(t, opts)
	if got := queryOne[int](t, c, "SELECT count(*) FROM notes"); got != 3 {
		t.Fatalf("after immediate shutdown: %d rows, want 3", got)
	}
}

func TestBorrowInSameProcess(t *testing.T) {
	t.Parallel()
	dir := newDir(t)
	opts := pgembed.Options{Dir: dir, Fast: true, Logger: testLogger()}
	owner := mustStart(t, opts)

	borrower := mustStart(t, opts)
	if borrower.Owned() {
		t.Fatal("second Start on a running cluster owns it")
	}
	if borrower.ConnString() != owner.ConnString() {
		t.Fatalf("borrower ConnString %q differs from owner's %q", borrower.ConnString(), owner.ConnString())
	}
	if got := queryOne[int](t, borrower, "SELECT 1"); got != 1 {
		t.Fatalf("SELECT 1 via borrower = %d", got)
	}
	mustStop(t, borrower)
	if got := queryOne[int](t, owner, "SELECT 1"); got != 1 {
		t.Fatalf("SELECT 1 after the borrower stopped = %d", got)
	}

	// The owner's Stop waits for a borrower that still uses the cluster.
	borrower = mustStart(t, opts)
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stopped <- owner.Stop(ctx)
	}()
	select {
	case err := <-stopped:
		t.Fatalf("owner's Stop returned (%v) while a borrower still used the cluster", err)
	case <-time.After(500 * time.Millisecond):
	}
	if got := queryOne[int](t, borrower, "SELECT 1"); got != 1 {
		t.Fatalf("SELECT 1 via borrower while the owner waits = %d", got)
	}
	mustStop(t, borrower)
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("owner's Stop: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("owner's Stop did not return after the borrower stopped")
	}
	assertStopped(t, dir)
}

func TestPersistentWaitsForShortLivedOwner(t *testing.T) {
	t.Parallel()
	dir := newDir(t)
	short := mustStart(t, pgembed.Options{Dir: dir, Fast: true, Logger: testLogger()})

	persistentOpts := pgembed.Options{Dir: dir, Fast: true, Persistent: true, Logger: testLogger()}
	type result struct {
		c   *pgembed.Cluster
		err error
	}
	started := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, err := pgembed.Start(ctx, persistentOpts)
		started <- result{c, err}
	}()
	var r result
	select {
	case r = <-started:
		if r.c != nil {
			t.Cleanup(func() { mustStop(t, r.c) })
		}
		t.Fatalf("persistent Start returned (owned %v, err %v) while a short-lived process ran the cluster", r.c != nil && r.c.Owned(), r.err)
	case <-time.After(500 * time.Millisecond):
	}
	mustStop(t, short)
	select {
	case r = <-started:
	case <-time.After(time.Minute):
		t.Fatal("persistent Start did not return after the short-lived owner stopped")
	}
	if r.err != nil {
		t.Fatalf("persistent Start: %v", r.err)
	}
	t.Cleanup(func() { mustStop(t, r.c) })
	if !r.c.Owned() {
		t.Fatal("persistent Start does not own the cluster after the short-lived owner stopped")
	}

	// Everyone borrows from a persistent owner, persistent or not.
	for _, persistent := range []bool{false, true} {
		b := mustStart(t, pgembed.Options{Dir: dir, Fast: true, Persistent: persistent})
		if b.Owned() {
			t.Fatalf("Start (persistent %v) owns a cluster a persistent owner runs", persistent)
		}
		mustStop(t, b)
	}
	if got := queryOne[int](t, r.c, "SELECT 1"); got != 1 {
		t.Fatalf("SELECT 1 = %d", got)
	}
}

func TestSecondProcessBorrows(t *testing.T) {
	t.Parallel()
	dir := newDir(t)
	c := mustStart(t, pgembed.Options{Dir: dir, Fast: true, Logger: testLogger()})
	execSQL(t, c, "CREATE TABLE visits (who text)")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := helperCommand(ctx, os.Args[0], "borrow", dir).CombinedOutput(); err != nil {
		t.Fatalf("helper process: %v\n%s", err, out)
	}
	if got := queryOne[string](t, c, "SELECT string_agg(who, ',') FROM visits"); got != "helper" {
		t.Fatalf("visits = %q, want the helper's row", got)
	}
	if got := queryOne[int](t, c, "SELECT 1"); got != 1 {
		t.Fatal("cluster unusable after the borrowing process stopped")
	}
}

func TestParentDeathStopsPostgres(t *testing.T) {
	t.Parallel()
	dir := newDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	cmd := helperCommand(ctx, os.Args[0], "own", dir)
	stdin, err := cmd.StdinPipe() // kept open: the helper waits for EOF
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "ready" {
				ready <- nil
				return
			}
		}
		ready <- errors.New("helper exited before it was ready")
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("helper not ready within a minute\n%s", stderr.String())
	}
	pid := postmasterPid(t, dir)
	if !processExists(pid) {
		t.Fatalf("postmaster %d of the helper is not running", pid)
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for processExists(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("postmaster %d still runs 30 s after its parent was killed", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}

	c := mustStart(t, pgembed.Options{Dir: dir, Fast: true, Logger: testLogger()})
	if !c.Owned() {
		t.Fatal("Start after the owner died does not own the cluster")
	}
	if got := queryOne[int](t, c, "SELECT 1"); got != 1 {
		t.Fatalf("SELECT 1 = %d", got)
	}
}

// TestDirNeedingQuotes checks that ConnString quotes a socket directory with
// a space and a quote in its path.
func TestDirNeedingQuotes(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(newDir(t), "a b'c")
	c := mustStart(t, pgembed.Options{Dir: dir, Fast: true, Logger: testLogger()})
	if got := queryOne[string](t, c, "SELECT current_database()"); got != "berth" {
		t.Fatalf("current_database() = %q, want berth", got)
	}
}

func TestNoBinaries(t *testing.T) {
	t.Parallel()
	dir := newDir(t)
	_, err := pgembed.Start(context.Background(), pgembed.Options{Dir: dir, BinDir: newDir(t)})
	if !errors.Is(err, pgembed.ErrNoBinaries) {
		t.Fatalf("Start with an empty BinDir: %v, want ErrNoBinaries", err)
	}
	for _, want := range []string{"apt-get install postgresql", "DATABASE_URL"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestSocketPathTooLong(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(newDir(t), strings.Repeat("d", 100))
	_, err := pgembed.Start(context.Background(), pgembed.Options{Dir: dir})
	if err == nil {
		t.Fatal("Start with a too long socket path succeeded")
	}
	for _, want := range []string{filepath.Join(dir, "run", ".s.PGSQL.5432"), "BERTH_DATA_DIR"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Start created %s before failing (stat: %v)", dir, err)
	}
}

// TestNonRoot runs the non-root path when the tests run as root (otherwise
// every other test already takes it): a copy of the test binary runs as nobody.
func TestNonRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: the other tests already run PostgreSQL without a user namespace")
	}
	t.Parallel()
	binDir := newDir(t)
	if err := os.Chmod(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(binDir, "pgembed.test")
	copyFile(t, self, bin, 0o755)
	dir := newDir(t)
	if err := os.Chown(dir, nobody, nobody); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := helperCommand(ctx, bin, "nonroot", dir)
	cmd.Dir = binDir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helper process as uid %d: %v\n%s", nobody, err, out)
	}
	fi, err := os.Stat(filepath.Join(dir, "data", "PG_VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != nobody {
		t.Fatalf("data files owned by uid %d, want %d", uid, nobody)
	}
}

// TestHelperProcess is not a test: the tests above run it as a second OS process.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(helperModeEnv)
	if mode == "" {
		t.Skip("helper process for the other tests")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := runHelper(ctx, mode, os.Getenv(helperDirEnv)); err != nil {
		t.Fatalf("helper %s: %v", mode, err)
	}
}

func runHelper(ctx context.Context, mode, dir string) error {
	opts := pgembed.Options{Dir: dir, Fast: true, Logger: testLogger()}
	switch mode {
	case "borrow": // borrow the parent's cluster and write a row
		c, err := pgembed.Start(ctx, opts)
		if err != nil {
			return err
		}
		defer c.Stop(ctx)
		if c.Owned() {
			return errors.New("owns the cluster its parent runs")
		}
		return execConn(ctx, c, "INSERT INTO visits VALUES ('helper')")
	case "own": // own a cluster until stdin closes (or we get killed)
		c, err := pgembed.Start(ctx, opts)
		if err != nil {
			return err
		}
		if !c.Owned() {
			return errors.New("does not own a fresh cluster")
		}
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return c.Stop(ctx)
	case "nonroot": // start, write, stop, start again, read, stop: as an unprivileged user
		if os.Geteuid() == 0 {
			return errors.New("runs as root")
		}
		for i, sql := range []string{"CREATE TABLE t AS SELECT 42 AS n", "SELECT n FROM t"} {
			c, err := pgembed.Start(ctx, opts)
			if err != nil {
				return err
			}
			if !c.Owned() {
				return fmt.Errorf("start %d does not own the cluster", i)
			}
			err = execConn(ctx, c, sql)
			if stopErr := c.Stop(ctx); err == nil {
				err = stopErr
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown helper mode %q", mode)
}

func helperCommand(ctx context.Context, bin, mode, dir string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, bin, "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperModeEnv+"="+mode, helperDirEnv+"="+dir)
	return cmd
}

// newDir returns a fresh directory with a short path (t.TempDir's long paths
// can exceed the unix socket limit).
func newDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pge")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// mustStart starts a cluster that the test stops at cleanup (Stop is idempotent).
func mustStart(t *testing.T, opts pgembed.Options) *pgembed.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgembed.Start(ctx, opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { mustStop(t, c) })
	return c
}

func mustStop(t *testing.T, c *pgembed.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Errorf("Stop: %v", err)
	}
}

// assertStopped checks that no postmaster runs in dir any more.
func assertStopped(t *testing.T, dir string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, "data", "postmaster.pid")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("postmaster.pid after Stop: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "owner")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("owner file after Stop: %v", err)
	}
}

func queryOne[T any](t *testing.T, c *pgembed.Cluster, sql string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.ConnString())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	var v T
	if err := conn.QueryRow(ctx, sql).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

func execSQL(t *testing.T, c *pgembed.Cluster, sqls ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := execConn(ctx, c, sqls...); err != nil {
		t.Fatal(err)
	}
}

func execConn(ctx context.Context, c *pgembed.Cluster, sqls ...string) error {
	conn, err := pgx.Connect(ctx, c.ConnString())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, sql := range sqls {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	return nil
}

func postmasterPid(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(first)
	if err != nil {
		t.Fatalf("postmaster.pid: %v", err)
	}
	return pid
}

// processExists reports whether pid is a process that has not exited; a
// zombie (exited, not yet reaped by init) has.
func processExists(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist)
	}
	end := bytes.LastIndexByte(stat, ')')
	return end < 0 || end+2 >= len(stat) || stat[end+2] != 'Z'
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, mode); err != nil {
		t.Fatal(err)
	}
}

// testLogger shows warnings and errors of the package on stderr (visible with -v or on failure).
func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
