package pgembed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// Sharing rests on flocks, which the kernel drops when their holder dies: the
// owner holds LOCK_EX on the owner file, so "owner alive" needs no pid check
// that a reused pid could fool.

// ownerInfo is the content of the owner file.
type ownerInfo struct {
	Pid        int  `json:"pid"`
	Persistent bool `json:"persistent"`
}

// state is what inspect finds in a cluster directory.
type state struct {
	owner      ownerInfo // valid if ownerAlive
	ownerAlive bool      // a process holds the owner file's lock
	pid        int       // the pid in postmaster.pid, 0 if none
	running    bool      // pid is a live postgres process
	answering  bool      // it serves our socket
}

// inspect looks at the owner file, postmaster.pid and the socket. The caller holds start.lock.
func inspect(ctx context.Context, p paths) state {
	var s state
	s.owner, s.ownerAlive = readOwner(p.owner)
	s.pid = p.postmasterPid()
	s.running = postmasterAlive(s.pid)
	if s.running {
		s.answering = answers(ctx, p.run)
	}
	return s
}

// blocked explains why a start gave up waiting for another process's cluster.
func (s state) blocked(p paths) error {
	switch {
	case s.ownerAlive && s.answering:
		return fmt.Errorf("short-lived berth process %d still runs the cluster after %s; let it finish and retry",
			s.owner.Pid, handoverTimeout)
	case s.ownerAlive:
		return fmt.Errorf("berth process %d owns the cluster but postgres does not accept connections%s",
			s.owner.Pid, logTail(p.log, 0))
	default:
		return fmt.Errorf("postgres (pid %d) still runs in %s after %s although no berth process owns it; stop it (kill -INT %d) and retry",
			s.pid, p.data, handoverTimeout, s.pid)
	}
}

// readOwner reports who owns the cluster and whether that process is alive.
func readOwner(path string) (ownerInfo, bool) {
	f, ok, err := tryLockFile(path, syscall.LOCK_SH)
	if err != nil {
		return ownerInfo{}, false
	}
	if ok { // nobody holds it: a stale file from an owner that died
		unlockFile(f)
		return ownerInfo{}, false
	}
	var o ownerInfo
	if b, err := os.ReadFile(path); err == nil {
		_ = json.Unmarshal(b, &o) // a damaged file still means a live owner
	}
	return o, true
}

// claimOwner records this process as the owner and returns the locked owner
// file, which must stay open while we own the cluster. The caller holds start.lock.
func claimOwner(path string, persistent bool) (*os.File, error) {
	f, ok, err := tryLockFile(path, syscall.LOCK_EX)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%s is locked by another process", path)
	}
	b, _ := json.Marshal(ownerInfo{Pid: os.Getpid(), Persistent: persistent})
	if err := f.Truncate(0); err != nil {
		unlockFile(f)
		return nil, err
	}
	if _, err := f.WriteAt(append(b, '\n'), 0); err != nil {
		unlockFile(f)
		return nil, err
	}
	return f, nil
}

// lockFile opens (creating) path and takes an flock of kind how (LOCK_EX or
// LOCK_SH), polling until it gets it, ctx ends or timeout passes.
func lockFile(ctx context.Context, path string, how int, timeout time.Duration) (*os.File, error) {
	deadline := time.Now().Add(timeout)
	for {
		f, ok, err := tryLockFile(path, how)
		if err != nil || ok {
			return f, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s is still locked by another process after %s", path, timeout)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for lock %s: %w", path, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// tryLockFile opens (creating) path and tries once to take an flock of kind
// how; ok is false if another open file holds a conflicting lock.
func tryLockFile(path string, how int) (f *os.File, ok bool, err error) {
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	switch {
	case err == nil:
		return f, true, nil
	case errors.Is(err, syscall.EWOULDBLOCK):
		f.Close()
		return nil, false, nil
	default:
		f.Close()
		return nil, false, fmt.Errorf("lock %s: %w", path, err)
	}
}

// unlockFile releases the flock explicitly (a forked child may briefly share
// the descriptor) and closes f; nil is allowed.
func unlockFile(f *os.File) {
	if f == nil {
		return
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	f.Close()
}
