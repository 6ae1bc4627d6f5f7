package pgembed

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

// The owner of a cluster supervises its postmaster: when postgres dies without
// Stop having asked it to (SIGKILL, OOM killer, a crash), the owner kills what
// is left of the old server, waits for it to be gone and starts postgres again,
// retrying with backoff until it answers. PostgreSQL runs crash recovery on that
// start; the pools of every process reconnect on their own.

const (
	// restartFirst is the wait before the first restart attempt after a death.
	restartFirst = 500 * time.Millisecond
	// restartMax caps the doubling wait between failed attempts.
	restartMax = 10 * time.Second
	// stableAfter is how long a restarted postmaster must live before a later
	// death starts the backoff from restartFirst again (a crash loop keeps backing off).
	stableAfter = time.Minute
	// leftoversTimeout bounds waiting for the dead postmaster's children to exit.
	leftoversTimeout = 10 * time.Second
)

// supervisor is the goroutine that restarts the postmaster of an owned cluster.
type supervisor struct {
	cancel   context.CancelFunc
	done     chan struct{}
	restarts atomic.Int64
}

// stop ends the supervisor and waits until it returned; a nil supervisor is allowed.
func (s *supervisor) stop() {
	if s == nil {
		return
	}
	s.cancel()
	<-s.done
}

// Pid returns the process id of the postmaster this process owns, 0 for a borrowed cluster.
// After a restart it is the new postmaster's.
func (c *Cluster) Pid() int {
	if !c.owned {
		return 0
	}
	return c.current().cmd.Process.Pid
}

// Restarts counts the times the supervisor restarted a postmaster that had died.
func (c *Cluster) Restarts() int64 {
	if c.sup == nil {
		return 0
	}
	return c.sup.restarts.Load()
}

// current returns the postmaster as of now.
func (c *Cluster) current() *proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.proc
}

// supervise starts the supervisor of an owned cluster.
func (c *Cluster) supervise(bin binaries, fast bool) {
	ctx, cancel := context.WithCancel(context.Background())
	c.sup = &supervisor{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.sup.done)
		c.superviseLoop(ctx, bin, fast)
	}()
}

func (c *Cluster) superviseLoop(ctx context.Context, bin binaries, fast bool) {
	wait := restartFirst
	started := time.Now()
	for {
		pm := c.current()
		select {
		case <-ctx.Done():
			return
		case <-pm.done:
		}
		if c.stopping.Load() {
			return
		}
		died := time.Now()
		if died.Sub(started) >= stableAfter {
			wait = restartFirst
		}
		c.log.Error("embedded PostgreSQL exited unexpectedly; restarting it", "dir", c.paths.dir,
			"pid", pm.cmd.Process.Pid, "status", pm.exitStatus(), "log", c.paths.log, "retry_in", wait)
		for attempt := 1; ; attempt++ {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(wait*2, restartMax)
			next, err := c.restart(ctx, bin, fast)
			if err == nil {
				// Even when Stop began meanwhile: it shuts down the current postmaster once this
				// loop has returned, so the one just started must be the current one.
				c.mu.Lock()
				c.proc = next
				c.mu.Unlock()
			}
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				c.log.Warn("restarting embedded PostgreSQL failed", "dir", c.paths.dir, "attempt", attempt,
					"err", err, "retry_in", wait)
				continue
			}
			c.sup.restarts.Add(1)
			started = time.Now()
			c.log.Info("restarted embedded PostgreSQL", "dir", c.paths.dir, "pid", next.cmd.Process.Pid,
				"attempt", attempt, "down_for", started.Sub(died).Round(time.Millisecond))
			break
		}
	}
}

// restart starts postgres again after the postmaster exited, under start.lock like every start.
func (c *Cluster) restart(ctx context.Context, bin binaries, fast bool) (*proc, error) {
	lock, err := lockFile(ctx, c.paths.startLock, syscall.LOCK_EX, startTimeout)
	if err != nil {
		return nil, err
	}
	defer unlockFile(lock)
	if err := killLeftovers(ctx, c.paths.data); err != nil {
		return nil, err
	}
	// Not cancelled by Stop: a postmaster once started finishes starting and is handed back, so
	// Stop shuts it down instead of leaving it behind (startPostgres bounds the wait itself).
	return startPostgres(context.WithoutCancel(ctx), c.paths, bin, fast)
}

// killLeftovers SIGKILLs what remains of a dead postmaster's server (backends and
// auxiliary processes leave on their own once they notice, but need not have yet; a stopped
// one never does) and waits until none is left. PostgreSQL refuses to start while any of them
// still holds the old shared memory, and must not start while they could still write the data
// directory. They are found by what they are, not by a remembered pid: live postgres processes
// whose working directory is this cluster's data directory (each postmaster child is its own
// process group, so the postmaster's group does not name them). PostgreSQL's own check of the
// stale postmaster.pid then lets the new postmaster in.
func killLeftovers(ctx context.Context, data string) error {
	if real, err := filepath.EvalSymlinks(data); err == nil {
		data = real // /proc/<pid>/cwd names the resolved path
	}
	deadline := time.Now().Add(leftoversTimeout)
	for {
		pids := serverProcesses(data)
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes of the dead server (%v) still run after %s", pids, leftoversTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// serverProcesses lists the live postgres processes working in the data directory data.
func serverProcesses(data string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !postmasterAlive(pid) { // postmasterAlive: a live, non-zombie postgres
			continue
		}
		if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err == nil && cwd == data {
			pids = append(pids, pid)
		}
	}
	return pids
}

// startPostgres runs the postmaster on the cluster in p and waits until it
// accepts connections and database berth exists. The caller holds start.lock.
func startPostgres(ctx context.Context, p paths, bin binaries, fast bool) (*proc, error) {
	logFile, offset, err := openLog(p.log)
	if err != nil {
		return nil, err
	}
	args := []string{"-D", p.data, "-k", p.run, "-c", "listen_addresses=", "-c", fmt.Sprintf("port=%d", port)}
	if fast {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	// SIGINT on parent death is a fast shutdown: open transactions roll back, the data stays consistent.
	pm, err := spawn(command(bin.path("postgres"), p.dir, logFile, syscall.SIGINT, args...))
	logFile.Close() // postgres has its own copy
	if err != nil {
		return nil, fmt.Errorf("run postgres: %w", err)
	}
	if err := waitReady(ctx, pm, p); err != nil {
		pm.abort(ctx)
		return nil, fmt.Errorf("%w%s", err, logTail(p.log, offset))
	}
	return pm, nil
}

// abort stops a postmaster that is not wanted after all, within killAfter.
func (p *proc) abort(ctx context.Context) {
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killAfter)
	defer cancel()
	_ = p.shutdown(stopCtx)
}
