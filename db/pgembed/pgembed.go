// Package pgembed runs Berth's default database: a private PostgreSQL cluster
// in a directory of its own, started from the machine's PostgreSQL binaries and
// reachable only through a unix socket inside that directory.
//
// Several processes may use one directory at once. The first to start
// PostgreSQL owns it and stops it again; the others borrow the running cluster
// and leave it alone. A long-lived owner (Options.Persistent) never borrows
// from a short-lived one: it waits for the short one to finish and then starts
// its own cluster, so a server never depends on a CLI command.
//
// The owner supervises its postmaster (supervisor.go): one that dies without Stop
// asking is restarted with backoff, and every process's pool reconnects by itself.
//
// Layout of the cluster directory:
//
//	data/         the PostgreSQL data directory (initdb on first start)
//	run/          the socket directory; mode 0700, so file permissions are the access control
//	postgres.log  initdb and postgres output, appended (moved to postgres.log.1 at a start when over 16 MiB)
//	start.lock    flock that serializes every start and stop decision
//	owner         pid and Persistent flag of the owner, which holds an flock on it while alive
//	users.lock    borrowers hold a shared flock on it; an owner's Stop waits briefly for them
package pgembed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	port      = 5432
	superuser = "berth"
	dbName    = "berth"

	// maxSocketPath is the longest socket path a sockaddr_un holds (108 bytes with the NUL).
	maxSocketPath = 107
	// startTimeout bounds waiting for start.lock and for postgres to accept connections
	// (long enough for crash recovery after an unclean stop).
	startTimeout = 2 * time.Minute
	// handoverTimeout bounds waiting for another process's cluster to go away.
	handoverTimeout = 30 * time.Second
	// borrowerGrace bounds how long an owner's Stop waits for borrowers to finish.
	borrowerGrace = 10 * time.Second
	// killAfter is how long Stop waits after SIGQUIT before SIGKILL, and after SIGKILL.
	killAfter = 5 * time.Second
)

// ErrNoBinaries means the PostgreSQL server binaries (initdb, postgres) are missing,
// so no embedded cluster can run.
var ErrNoBinaries = errors.New("no PostgreSQL server binaries (initdb, postgres) found: " +
	"install them (Debian/Ubuntu: apt-get install postgresql) or set DATABASE_URL to use an existing server")

// Options configures Start.
type Options struct {
	// Dir is the cluster directory, e.g. <data dir>/pg; Start creates it with mode 0700 if missing.
	Dir string
	// BinDir is the PostgreSQL bin directory; "" discovers it (the version matching an
	// existing cluster, then `pg_config --bindir`, then the newest /usr/lib/postgresql/*/bin).
	BinDir string
	// Persistent marks a long-lived owner (berth serve, berth worker), which never
	// borrows a cluster that a short-lived process started.
	Persistent bool
	// Fast trades crash safety for speed and is for tests only: initdb --no-sync,
	// fsync, synchronous_commit and full_page_writes off.
	Fast bool
	// Logger receives start and stop events; nil discards them.
	Logger *slog.Logger
}

// Cluster is a running embedded PostgreSQL that this process either owns or borrows.
type Cluster struct {
	paths      paths
	connString string
	owned      bool
	log        *slog.Logger

	mu        sync.Mutex  // owned: guards proc, which the supervisor replaces after a restart
	proc      *proc       // owned: the postmaster
	ownerFile *os.File    // owned: holds LOCK_EX on the owner file while we own the cluster
	stopping  atomic.Bool // owned: set once Stop shuts postgres down on purpose
	sup       *supervisor // owned: restarts a postmaster that died (supervisor.go)
	usersFile *os.File    // borrowed: holds LOCK_SH on users.lock while we use the cluster
	stopOnce  sync.Once
	stopErr   error
}

// Start returns a running cluster in opts.Dir, either started by this process
// (after initdb if Dir is new) or borrowed from the process already running it.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	c, err := start(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("pgembed: start %s: %w", opts.Dir, err)
	}
	return c, nil
}

// ConnString returns the pgx/libpq keyword/value string that reaches database
// berth as superuser berth over the cluster's unix socket.
func (c *Cluster) ConnString() string { return c.connString }

// Owned reports whether this process started PostgreSQL and will stop it in Stop.
func (c *Cluster) Owned() bool { return c.owned }

// Stop gives the cluster up: an owner waits briefly for borrowers, then shuts
// PostgreSQL down (fast shutdown, escalating to immediate shutdown and SIGKILL
// once ctx ends) and returns after it exited; a borrower only releases its
// claim. Calling Stop again returns the first result.
func (c *Cluster) Stop(ctx context.Context) error {
	c.stopOnce.Do(func() {
		var err error
		if c.owned {
			err = c.stopOwned(ctx)
		} else {
			unlockFile(c.usersFile)
		}
		if err != nil {
			c.stopErr = fmt.Errorf("pgembed: stop %s: %w", c.paths.dir, err)
		}
	})
	return c.stopErr
}

func start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Dir == "" {
		return nil, errors.New("Options.Dir is empty")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	p := newPaths(dir)
	if n := len(p.socket()); n > maxSocketPath {
		return nil, fmt.Errorf("socket path %s is %d bytes, longer than the %d bytes a unix socket allows; use a shorter BERTH_DATA_DIR",
			p.socket(), n, maxSocketPath)
	}
	bin, err := findBinaries(ctx, opts.BinDir, p.dataVersion())
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// The socket directory's mode is the access control, so enforce it even if it exists.
	if err := os.MkdirAll(p.run, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(p.run, 0o700); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Cluster{paths: p, connString: connString(p.run, dbName), log: log}

	lock, err := lockFile(ctx, p.startLock, syscall.LOCK_EX, startTimeout)
	if err != nil {
		return nil, err
	}
	defer func() { unlockFile(lock) }()

	handover := time.Now().Add(handoverTimeout)
	logged := false
	for {
		s := inspect(ctx, p)
		switch {
		case s.ownerAlive && s.answering && !(opts.Persistent && !s.owner.Persistent):
			ok, err := c.borrow(s.owner)
			if err != nil {
				return nil, err
			}
			if ok {
				return c, nil
			}
		case !s.ownerAlive && !s.running:
			if err := c.own(ctx, bin, opts); err != nil {
				return nil, err
			}
			return c, nil
		}
		// Another process's cluster is in the way: poll without holding the
		// lock, so that its owner can stop it.
		if time.Now().After(handover) {
			return nil, s.blocked(p)
		}
		if !logged {
			log.Info("waiting for another process's embedded PostgreSQL to stop",
				"dir", dir, "owner_pid", s.owner.Pid, "owner_alive", s.ownerAlive, "postmaster_pid", s.pid)
			logged = true
		}
		unlockFile(lock)
		lock = nil
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for another process's cluster to stop: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
		if lock, err = lockFile(ctx, p.startLock, syscall.LOCK_EX, startTimeout); err != nil {
			return nil, err
		}
	}
}

// borrow registers c as a user of the cluster another process owns. It reports
// false when the owner is already stopping (users.lock held exclusively).
func (c *Cluster) borrow(owner ownerInfo) (bool, error) {
	f, ok, err := tryLockFile(c.paths.users, syscall.LOCK_SH)
	if err != nil || !ok {
		return false, err
	}
	c.usersFile = f
	c.log.Info("using embedded PostgreSQL of another process",
		"dir", c.paths.dir, "owner_pid", owner.Pid, "owner_persistent", owner.Persistent)
	return true, nil
}

// own starts postgres (after initdb if needed), waits until it accepts
// connections, creates database berth and records this process as the owner.
// The caller holds start.lock.
func (c *Cluster) own(ctx context.Context, bin binaries, opts Options) error {
	p := c.paths
	if err := initData(ctx, p, bin, opts.Fast, c.log); err != nil {
		return err
	}
	began := time.Now()
	pm, err := startPostgres(ctx, p, bin, opts.Fast)
	if err != nil {
		return err
	}
	owner, err := claimOwner(p.owner, opts.Persistent)
	if err != nil {
		pm.abort(ctx)
		return err
	}
	c.owned, c.proc, c.ownerFile = true, pm, owner
	c.log.Info("started embedded PostgreSQL", "dir", p.dir, "pid", pm.cmd.Process.Pid, "took", time.Since(began))
	c.supervise(bin, opts.Fast)
	return nil
}

func (c *Cluster) stopOwned(ctx context.Context) error {
	p := c.paths
	// The supervisor first: once it has returned, nothing starts postgres again behind Stop.
	c.stopping.Store(true)
	c.sup.stop()
	// Hold start.lock so no other process decides to borrow a cluster that is going away.
	lock, err := lockFile(ctx, p.startLock, syscall.LOCK_EX, startTimeout)
	if err != nil {
		c.log.Warn("stopping embedded PostgreSQL without the start lock", "dir", p.dir, "err", err)
	}
	defer unlockFile(lock)

	grace := borrowerGrace
	if deadline, ok := ctx.Deadline(); ok {
		grace = min(grace, time.Until(deadline)/2) // leave time for the shutdown itself
	}
	users, err := lockFile(ctx, p.users, syscall.LOCK_EX, grace)
	if err != nil {
		c.log.Warn("stopping embedded PostgreSQL while other processes still use it", "dir", p.dir, "err", err)
	}
	defer unlockFile(users)

	began := time.Now()
	err = c.current().shutdown(ctx)
	c.log.Info("stopped embedded PostgreSQL", "dir", p.dir, "took", time.Since(began), "err", err)
	// The owner file is ours while we hold its lock: nobody else can have replaced it.
	if rmErr := os.Remove(p.owner); rmErr != nil && err == nil {
		err = rmErr
	}
	unlockFile(c.ownerFile)
	return err
}
