package db

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrSourceLockLost is returned by WithSourceLock when fn succeeded but the lock could not be
// confirmed held for the whole of fn, so another process may have prepared the same source at
// the same time; fn's ctx carries it as the cancellation cause when the keepalive notices first.
var ErrSourceLockLost = errors.New("source lock lost")

const (
	// sourceLockAppName is the application_name of the lock connections, so operators (and the
	// tests) can tell them apart in pg_stat_activity.
	sourceLockAppName = "berth-source-lock"
	// maxKeepalivePeriod caps the keepalive period, and is the period when the server has no
	// idle-in-transaction timeout: a ping every 30 s still notices a dead lock connection and
	// keeps NATs and proxies from dropping it.
	maxKeepalivePeriod = 30 * time.Second
	// keepaliveQueryTimeout bounds one keepalive ping; a ping that takes longer counts as a lost
	// lock (the connection is then broken off, which ends the transaction).
	keepaliveQueryTimeout = 10 * time.Second
	// sourceLockCleanupTimeout bounds the commit, rollback and close at the end, which run even
	// when the caller's ctx is done.
	sourceLockCleanupTimeout = 10 * time.Second
)

// SourceLockOptions adjusts WithSourceLockOptions; the zero value is what WithSourceLock uses.
type SourceLockOptions struct {
	// DisableKeepalive leaves the lock connection idle while fn runs, so the server's
	// idle_in_transaction_session_timeout can end it mid-work. It exists for the regression
	// test's negative control only; production callers never set it.
	DisableKeepalive bool
	// Locked, if set, is called once the lock is held and before fn runs, with the lock
	// session's idle_in_transaction_session_timeout (0: disabled) and the keepalive period
	// chosen from it (0: keepalive disabled). It must not block.
	Locked func(idleTimeout, keepalive time.Duration)
}

// WithSourceLock runs fn while holding the preparation lock of (companyID, source), so that no
// two Berth processes prepare one shared source (a git clone cache, a worktree base) at once.
//
// The lock is a transaction-scoped advisory lock on a dedicated connection opened from pool's
// connection settings (never one of pool's connections, so the lock cannot starve the pool; pool
// hooks such as AfterConnect do not run on it). While fn runs, a keepalive runs SELECT 1 on that
// transaction every idle_in_transaction_session_timeout/3 (at most 30 s, and 30 s when the
// timeout is disabled), so the server never ends the session, and so the lock, under fn. fn
// never sees the lock connection.
//
// The contract for callers:
//   - Waiting for the lock honours ctx: when ctx ends first, fn does not run and the error
//     satisfies errors.Is(err, ctx.Err()). Settings such as lock_timeout or statement_timeout in
//     pool's configuration also bound the wait.
//   - An error from fn is returned as is (the same value, never wrapped or replaced), whatever
//     happened to the lock or the connection meanwhile.
//   - When fn returns nil but the lock could not be confirmed held throughout (a keepalive ping
//     failed, or the commit that releases the lock did), the error wraps ErrSourceLockLost.
//   - fn's ctx is cancelled with cause ErrSourceLockLost as soon as a keepalive ping fails; fn
//     that gives up because of it can return context.Cause(ctx). When the caller's ctx ends
//     while fn runs, fn sees it, and the keepalive goes on: the lock stays held until fn returns.
//   - A panic in fn stops the keepalive, releases the lock and the connection, and propagates.
//   - On return the keepalive has stopped, the lock is released (by commit or rollback, or by
//     the server when the connection had died) and the connection is closed.
func WithSourceLock(ctx context.Context, pool *pgxpool.Pool, companyID, source string, fn func(ctx context.Context) error) error {
	return WithSourceLockOptions(ctx, pool, companyID, source, SourceLockOptions{}, fn)
}

// WithSourceLockOptions is WithSourceLock with options, for tests that must see or switch off
// the keepalive.
func WithSourceLockOptions(ctx context.Context, pool *pgxpool.Pool, companyID, source string, opts SourceLockOptions, fn func(ctx context.Context) error) error {
	if companyID == "" || source == "" {
		return errors.New("db: source lock: empty company or source")
	}
	cfg := pool.Config().ConnConfig
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = sourceLockAppName
	// A cancelled lock wait (or a keepalive ping past its deadline) breaks the connection off;
	// pgx then sends the server a cancel request and closes in the background, which the
	// deferred close below waits for, so no backend goes on waiting for the lock.
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return sourceLockFailed(ctx, "connect", err)
	}
	defer func() {
		cctx, cancel := cleanupContext(ctx)
		defer cancel()
		_ = conn.Close(cctx) // the server ends the transaction, if any is left, with the session
		select {
		case <-conn.PgConn().CleanupDone():
		case <-cctx.Done():
		}
	}()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return sourceLockFailed(ctx, "begin", err)
	}
	defer func() {
		cctx, cancel := cleanupContext(ctx)
		defer cancel()
		_ = tx.Rollback(cctx) // releases the lock when fn failed or panicked; no-op after commit
	}()

	var setting string
	err = tx.QueryRow(ctx,
		`SELECT pg_advisory_xact_lock($1), current_setting('idle_in_transaction_session_timeout')`,
		sourceLockKey(companyID, source)).Scan(nil, &setting)
	if err != nil {
		return sourceLockFailed(ctx, "acquire", err)
	}
	idle, err := parseSettingDuration(setting)
	if err != nil {
		return fmt.Errorf("db: source lock: idle_in_transaction_session_timeout: %w", err)
	}
	var period time.Duration
	if !opts.DisableKeepalive {
		period = keepalivePeriod(idle)
	}
	if opts.Locked != nil {
		opts.Locked(idle, period)
	}

	workCtx, stopWork := context.WithCancelCause(ctx)
	defer stopWork(nil)
	var ka *keepalive
	if period > 0 {
		ka = startKeepalive(ctx, tx, period, stopWork)
	}
	defer ka.stop() // on a panic in fn: no ping may be in flight when the rollback runs

	fnErr := fn(workCtx)
	kaErr := ka.stop()
	if fnErr != nil {
		return fnErr
	}
	if kaErr != nil {
		return fmt.Errorf("db: source lock: %w: keepalive: %w", ErrSourceLockLost, kaErr)
	}
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	if err := tx.Commit(cctx); err != nil {
		// The transaction did not survive until now (typically: the server ended the idle
		// session), so nothing shows the lock was held all along.
		return fmt.Errorf("db: source lock: %w: commit: %w", ErrSourceLockLost, err)
	}
	return nil
}

// sourceLockKey is the advisory-lock key of (companyID, source): the first 8 bytes, big-endian,
// of SHA-256 over "berth source lock", NUL, the company id, NUL, the source. The prefix keeps it
// clear of Berth's fixed lock numbers, the NULs keep ("a", "b\x00c")-style pairs from meeting,
// and a hash nobody can aim keeps crafted sources from colliding on purpose; a collision would
// only make two preparations take turns.
func sourceLockKey(companyID, source string) int64 {
	sum := sha256.Sum256([]byte("berth source lock\x00" + companyID + "\x00" + source))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// keepalivePeriod is how often the lock connection must run a statement so that a server with
// the given idle_in_transaction_session_timeout (0: none) never ends it: a third of the timeout,
// at most maxKeepalivePeriod.
func keepalivePeriod(idle time.Duration) time.Duration {
	if idle <= 0 || idle/3 > maxKeepalivePeriod {
		return maxKeepalivePeriod
	}
	return idle / 3
}

// settingUnits are the units PostgreSQL prints time settings in, in an order where no suffix is
// checked before a longer one that ends with it.
var settingUnits = []struct {
	suffix string
	unit   time.Duration
}{
	{"ms", time.Millisecond},
	{"us", time.Microsecond},
	{"min", time.Minute},
	{"s", time.Second},
	{"h", time.Hour},
	{"d", 24 * time.Hour},
}

// parseSettingDuration reads a time setting as current_setting prints it ("0", "500ms", "1s",
// "2min", "1h"); a bare number is in milliseconds, the unit of the timeouts.
func parseSettingDuration(s string) (time.Duration, error) {
	num, unit := s, time.Millisecond
	for _, u := range settingUnits {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, unit = n, u.unit
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > int64(1<<62)/int64(unit) {
		return 0, fmt.Errorf("unreadable value %q", s)
	}
	return time.Duration(n) * unit, nil
}

// sourceLockFailed wraps an error from before fn ran, preferring ctx's own error when ctx is
// what ended the attempt.
func sourceLockFailed(ctx context.Context, op string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("db: source lock: %s: %w", op, ctxErr)
	}
	return fmt.Errorf("db: source lock: %s: %w", op, err)
}

// cleanupContext bounds the end-of-lock statements, which must run even when ctx is done.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), sourceLockCleanupTimeout)
}

// keepalive pings the lock transaction so the session never stays idle in transaction long
// enough for the server to end it. While it runs it is the only user of the transaction.
type keepalive struct {
	quit     chan struct{}
	done     chan struct{}
	quitOnce sync.Once
	err      error // the failed ping, if any; written before done is closed
}

// startKeepalive pings tx every period until stop; on a failed ping it calls lost with
// ErrSourceLockLost and stops pinging (the transaction is gone or broken).
func startKeepalive(ctx context.Context, tx pgx.Tx, period time.Duration, lost context.CancelCauseFunc) *keepalive {
	k := &keepalive{quit: make(chan struct{}), done: make(chan struct{})}
	base := context.WithoutCancel(ctx) // the lock must outlive the caller's ctx until fn returns
	go func() {
		defer close(k.done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-k.quit:
				return
			case <-tick.C:
			}
			select {
			case <-k.quit: // a tick that raced with stop does not ping
				return
			default:
			}
			pingCtx, cancel := context.WithTimeout(base, keepaliveQueryTimeout)
			_, err := tx.Exec(pingCtx, `SELECT 1`)
			cancel()
			if err != nil {
				k.err = err
				lost(fmt.Errorf("db: source lock: %w: keepalive: %w", ErrSourceLockLost, err))
				return
			}
		}
	}()
	return k
}

// stop ends the pings and waits for one in flight to finish, then reports the failed ping, if
// any. It may be called more than once, and on a nil keepalive (none was started).
func (k *keepalive) stop() error {
	if k == nil {
		return nil
	}
	k.quitOnce.Do(func() { close(k.quit) })
	<-k.done
	return k.err
}
