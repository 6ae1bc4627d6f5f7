package pgembed

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// proc is a child process started by spawn.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited; err is set by then
	err  error         // the result of cmd.Wait
}

// spawn starts cmd from a goroutine that stays locked to its OS thread until
// the process has exited. Linux sends the parent-death signal (Pdeathsig) when
// the thread that forked the child exits, not the process; Go ends a thread
// when a goroutine exits while locked to it, so without the lock an unrelated
// goroutine could take that thread, exit locked and kill postgres with it.
// Holding the thread for the child's lifetime leaves only the death of Berth
// itself, as intended.
func spawn(cmd *exec.Cmd) (*proc, error) {
	p := &proc{cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread() // only after Wait: the child is gone by then
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// signal sends sig to the process; a process that already exited is not an error here.
func (p *proc) signal(sig syscall.Signal) { _ = p.cmd.Process.Signal(sig) }

// exitStatus describes how the process ended; call it only after done is closed.
func (p *proc) exitStatus() string {
	if p.err == nil {
		return "exit status 0"
	}
	return p.err.Error()
}

// shutdown stops the postmaster and waits until it exited: fast shutdown
// (SIGINT: sessions end, open transactions roll back, checkpoint), immediate
// shutdown (SIGQUIT: crash recovery at the next start) once ctx ends, SIGKILL if
// even that hangs.
func (p *proc) shutdown(ctx context.Context) error {
	select {
	case <-p.done:
		return fmt.Errorf("postgres had already exited (%s)", p.exitStatus())
	default:
	}
	p.signal(syscall.SIGINT)
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
	}
	p.signal(syscall.SIGQUIT)
	select {
	case <-p.done:
		return fmt.Errorf("fast shutdown did not finish in time, used immediate shutdown: %w", ctx.Err())
	case <-time.After(killAfter):
	}
	p.signal(syscall.SIGKILL)
	select {
	case <-p.done:
		return fmt.Errorf("postgres ignored fast and immediate shutdown, killed it: %w", ctx.Err())
	case <-time.After(killAfter):
		return fmt.Errorf("postgres (pid %d) did not exit even after SIGKILL", p.cmd.Process.Pid)
	}
}

// command prepares one of the PostgreSQL programs: output to out, working
// directory dir, deathSig when Berth dies, own process group (a Ctrl-C meant
// for Berth must not reach postgres before Berth is done with it), and, as
// root, a user namespace.
func command(path, dir string, out *os.File, deathSig syscall.Signal, args ...string) *exec.Cmd {
	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = out, out
	for _, kv := range os.Environ() {
		// PGDATA, PGPORT, ... must not override the explicit arguments.
		if !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: deathSig}
	if os.Geteuid() == 0 {
		// initdb and postgres refuse to run as root. In a new user namespace host
		// root becomes an ordinary user without capabilities, while the files it
		// creates stay owned by host root.
		uid, gid := namespaceIDs()
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: uid, HostID: 0, Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: gid, HostID: os.Getegid(), Size: 1}}
	}
	return cmd
}

// namespaceIDs picks the uid and gid that host root becomes inside the user
// namespace. initdb insists that its uid has a passwd entry, so it prefers the
// postgres account that Debian's server package creates and falls back to 1000.
func namespaceIDs() (uid, gid int) {
	if u, err := user.Lookup("postgres"); err == nil {
		uid, uerr := strconv.Atoi(u.Uid)
		gid, gerr := strconv.Atoi(u.Gid)
		if uerr == nil && gerr == nil && uid > 0 {
			return uid, gid
		}
	}
	return 1000, 1000
}

// initData runs initdb unless the data directory already holds a cluster. It
// initializes into a temporary directory and renames it, so an interrupted
// initdb never leaves a half-made cluster behind. The caller holds start.lock.
func initData(ctx context.Context, p paths, bin binaries, fast bool, log *slog.Logger) error {
	if p.dataVersion() != "" {
		return nil
	}
	entries, err := os.ReadDir(p.data)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	case len(entries) > 0:
		return fmt.Errorf("%s is not empty but holds no PostgreSQL cluster (no PG_VERSION); move it away", p.data)
	default:
		if err := os.Remove(p.data); err != nil {
			return err
		}
	}
	tmp := p.data + ".initdb"
	if err := os.RemoveAll(tmp); err != nil { // left over from an interrupted initdb
		return err
	}
	logFile, offset, err := openLog(p.log)
	if err != nil {
		return err
	}
	defer logFile.Close()
	args := []string{"-D", tmp, "-U", superuser, "--auth=trust", "-E", "UTF8", "--locale=C"}
	if fast {
		args = append(args, "--no-sync")
	}
	began := time.Now()
	initdb, err := spawn(command(bin.path("initdb"), p.dir, logFile, syscall.SIGKILL, args...))
	if err != nil {
		return fmt.Errorf("run initdb: %w", err)
	}
	select {
	case <-initdb.done:
	case <-ctx.Done():
		// The whole group: initdb runs postgres in bootstrap mode as its child.
		_ = syscall.Kill(-initdb.cmd.Process.Pid, syscall.SIGKILL)
		<-initdb.done
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("initdb: %w", ctx.Err())
	}
	if initdb.err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("initdb: %s%s", initdb.exitStatus(), logTail(p.log, offset))
	}
	if err := os.Rename(tmp, p.data); err != nil {
		return err
	}
	if !fast {
		if err := syncDir(p.dir); err != nil {
			return err
		}
	}
	log.Info("initialized embedded PostgreSQL cluster", "dir", p.data, "took", time.Since(began))
	return nil
}

// waitReady waits until the postmaster accepts connections through the socket,
// then creates database berth unless it exists.
func waitReady(ctx context.Context, pm *proc, p paths) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		conn, err := connect(ctx, connString(p.run, "postgres"), time.Second)
		if err == nil {
			defer conn.Close(context.WithoutCancel(ctx))
			return createDatabase(ctx, conn)
		}
		select {
		case <-pm.done:
			return fmt.Errorf("postgres exited during startup (%s)", pm.exitStatus())
		case <-ctx.Done():
			return fmt.Errorf("postgres did not accept connections in time (%w), last attempt: %v", ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func createDatabase(ctx context.Context, conn *pgx.Conn) error {
	var exists bool
	err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", dbName).Scan(&exists)
	if err != nil {
		return fmt.Errorf("look for database %s: %w", dbName, err)
	}
	if exists {
		return nil
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{dbName}.Sanitize()); err != nil {
		return fmt.Errorf("create database %s: %w", dbName, err)
	}
	return nil
}

// connect opens one connection, giving up after timeout.
func connect(ctx context.Context, connString string, timeout time.Duration) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return pgx.Connect(ctx, connString)
}

// answers reports whether a postmaster serves the socket in run: it accepts a
// connection, or refuses one for a reason other than starting up or shutting
// down (e.g. too many clients).
func answers(ctx context.Context, run string) bool {
	conn, err := connect(ctx, connString(run, "postgres"), 2*time.Second)
	if err == nil {
		conn.Close(ctx)
		return true
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code != "57P03" // cannot_connect_now
}

// postmasterAlive reports whether pid is a live postgres process. Zombies and
// unrelated processes that reused the pid of a dead postmaster do not count.
func postmasterAlive(pid int) bool {
	if pid <= 0 || pid == os.Getpid() {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	if err != nil { // no /proc: fall back to a signal probe
		err := syscall.Kill(pid, 0)
		return err == nil || errors.Is(err, syscall.EPERM)
	}
	// "pid (comm) state ...": comm may contain spaces and parentheses.
	s := string(stat)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open || end+2 >= len(s) {
		return true
	}
	comm, state := s[open+1:end], s[end+2]
	return state != 'Z' && (comm == "postgres" || comm == "postmaster")
}

// openLog opens the log for appending and returns its size before this run.
// A log over 16 MiB is first moved to postgres.log.1, replacing the previous one.
func openLog(path string) (*os.File, int64, error) {
	if fi, err := os.Stat(path); err == nil && fi.Size() > 16<<20 {
		if err := os.Rename(path, path+".1"); err != nil {
			return nil, 0, err
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, fi.Size(), nil
}

// logTail returns the last lines of the log written after offset, formatted
// to end an error message, or "" if there are none.
func logTail(path string, offset int64) string {
	const maxBytes, maxLines = 4096, 15
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	from := max(offset, fi.Size()-maxBytes, 0)
	buf := make([]byte, fi.Size()-from)
	n, _ := f.ReadAt(buf, from)
	text := strings.TrimRight(string(buf[:n]), "\n")
	if text == "" {
		return ""
	}
	lines := strings.Split(text, "\n")
	if from > offset && len(lines) > 1 {
		lines = lines[1:] // cut mid-line
	}
	if len(lines) > maxLines {
		lines = lines[len(lines)-maxLines:]
	}
	return fmt.Sprintf("; last lines of %s:\n\t%s", path, strings.Join(lines, "\n\t"))
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// paths names the files of a cluster directory (see the package comment).
type paths struct {
	dir, data, run, log, startLock, owner, users string
}

func newPaths(dir string) paths {
	return paths{
		dir:       dir,
		data:      filepath.Join(dir, "data"),
		run:       filepath.Join(dir, "run"),
		log:       filepath.Join(dir, "postgres.log"),
		startLock: filepath.Join(dir, "start.lock"),
		owner:     filepath.Join(dir, "owner"),
		users:     filepath.Join(dir, "users.lock"),
	}
}

func (p paths) socket() string { return filepath.Join(p.run, fmt.Sprintf(".s.PGSQL.%d", port)) }

// dataVersion returns the major version of the cluster in data, "" if there is none.
func (p paths) dataVersion() string {
	b, err := os.ReadFile(filepath.Join(p.data, "PG_VERSION"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// postmasterPid returns the pid recorded in postmaster.pid, 0 if there is none.
func (p paths) postmasterPid() int {
	b, err := os.ReadFile(filepath.Join(p.data, "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(first))
	return pid
}

// connString builds a keyword/value connection string for db over the socket in run.
func connString(run, db string) string {
	return fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable",
		quoteValue(run), port, superuser, db)
}

// quoteValue quotes a keyword/value connection string value when it needs it.
func quoteValue(v string) string {
	if v != "" && !strings.ContainsAny(v, " \t\n\r'\\") {
		return v
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}
