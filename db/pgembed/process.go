package pgembed

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
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
	cmd.Env = []string{} // not nil, which would mean the whole environment
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
