package db_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/db/dbtest"
)

// lockAppName is the application_name WithSourceLock gives its connection.
const lockAppName = "berth-source-lock"

// TestSourceLock runs the source-lock cases in parallel with each other, each on its own
// database, and then checks that they left no goroutine behind. It is not parallel itself, so
// no other test runs while the goroutines are counted.
func TestSourceLock(t *testing.T) {
	dbtest.ConnString(t) // start the cluster (and its goroutines) before taking the baseline
	baseline := runtime.NumGoroutine()
	t.Run("cases", func(t *testing.T) {
		t.Run("KeepaliveHoldsLock", testKeepaliveHoldsLock)
		t.Run("WithoutKeepaliveLockIsLost", testWithoutKeepaliveLockIsLost)
		t.Run("CallbackErrorUnchanged", testCallbackErrorUnchanged)
		t.Run("KeepaliveReportsKilledSession", testKeepaliveReportsKilledSession)
		t.Run("PanicReleases", testPanicReleases)
		t.Run("CancelledWait", testCancelledWait)
		t.Run("ReadsIdleTimeout", testReadsIdleTimeout)
	})
	if t.Failed() {
		return
	}
	pollUntil(t, 10*time.Second, func() (bool, string) {
		n := runtime.NumGoroutine()
		return n <= baseline, fmt.Sprintf("%d goroutines after the cases, %d before", n, baseline)
	})
	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	if strings.Contains(stacks, "berth/db.startKeepalive") || strings.Contains(stacks, "berth/db.WithSourceLock") {
		t.Fatalf("source-lock goroutines left behind:\n%s", stacks)
	}
}

// testKeepaliveHoldsLock is the regression of the source lock's keepalive rule (docs/database.md
// "Source preparation lock"): the server ends sessions idle in a transaction for 1 s, the work
// runs 4 s without touching the lock connection, and still the lock holds: a competitor for the
// same source waits at the server until the work is done, other sources and companies go ahead,
// and the one-connection pool stays usable.
func testKeepaliveHoldsLock(t *testing.T) {
	t.Parallel()
	pool := lockDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const company, source = "company-1", "https://git.example/repo.git"

	var occ occupancy
	type seen struct{ idle, every time.Duration }
	seenCh := make(chan seen, 1)
	firstIn := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		opts := db.SourceLockOptions{Locked: func(idle, every time.Duration) { seenCh <- seen{idle, every} }}
		first <- db.WithSourceLockOptions(ctx, pool, company, source, opts, func(ctx context.Context) error {
			occ.enter("first")
			defer occ.exit("first")
			close(firstIn)
			select {
			case <-time.After(4 * time.Second):
				return nil
			case <-ctx.Done():
				return fmt.Errorf("work interrupted: %w", context.Cause(ctx))
			}
		})
	}()
	recvWithin(t, firstIn, 10*time.Second, "first preparation to start")
	if s := recvWithin(t, seenCh, time.Second, "lock settings"); s.idle != time.Second || s.every != time.Second/3 {
		t.Fatalf("lock session read idle timeout %v and chose keepalive %v, want 1s and 333ms", s.idle, s.every)
	}

	time.Sleep(500 * time.Millisecond) // the competitor starts half a second into the work
	second := make(chan error, 1)
	go func() {
		second <- db.WithSourceLock(ctx, pool, company, source, func(context.Context) error {
			occ.enter("second")
			occ.exit("second")
			return nil
		})
	}()
	for _, k := range []struct{ company, source string }{{company, source + "-other"}, {"company-2", source}} {
		var firstInside int
		err := db.WithSourceLock(ctx, pool, k.company, k.source, func(context.Context) error {
			firstInside = occ.count()
			return nil
		})
		if err != nil || firstInside != 1 {
			t.Fatalf("%s/%s: err %v, first inside %d; want nil and 1 (no wait on another key)", k.company, k.source, err, firstInside)
		}
	}
	pollUntil(t, 5*time.Second, func() (bool, string) {
		n := advisoryWaiters(t, pool)
		return n == 1, fmt.Sprintf("%d sessions waiting for an advisory lock, want the competitor", n)
	})
	qctx, qcancel := context.WithTimeout(ctx, 2*time.Second)
	defer qcancel()
	var one int
	if err := pool.QueryRow(qctx, `SELECT 1`).Scan(&one); err != nil {
		t.Fatalf("the pool of one connection is not usable while the lock is held: %v", err)
	}

	if err := recvWithin(t, first, 15*time.Second, "first preparation"); err != nil {
		t.Fatalf("first preparation: %v", err)
	}
	if err := recvWithin(t, second, 15*time.Second, "competing preparation"); err != nil {
		t.Fatalf("competing preparation: %v", err)
	}
	if log := occ.events(); !slices.Equal(log, []string{"first+", "first-", "second+", "second-"}) || occ.maxInside() != 1 {
		t.Fatalf("preparations overlapped: %v (at most %d inside)", log, occ.maxInside())
	}
	noLockConnections(t, pool)
}

// testWithoutKeepaliveLockIsLost is the negative control: with the keepalive off the server
// ends the idle lock session after 1 s, a competitor gets in while the first preparation still
// runs, and the first learns that its lock was lost.
func testWithoutKeepaliveLockIsLost(t *testing.T) {
	t.Parallel()
	pool := lockDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const company, source = "company-1", "/srv/cache/repo"

	var occ occupancy
	firstIn, secondIn := make(chan struct{}), make(chan struct{})
	var workCtxErr error
	first := make(chan error, 1)
	go func() {
		opts := db.SourceLockOptions{DisableKeepalive: true}
		first <- db.WithSourceLockOptions(ctx, pool, company, source, opts, func(ctx context.Context) error {
			occ.enter("first")
			defer occ.exit("first")
			close(firstIn)
			select {
			case <-secondIn: // the competitor got in while this one is still working
			case <-time.After(3 * time.Second):
			}
			workCtxErr = ctx.Err()
			return nil
		})
	}()
	recvWithin(t, firstIn, 10*time.Second, "first preparation to start")
	second := make(chan error, 1)
	go func() {
		second <- db.WithSourceLock(ctx, pool, company, source, func(context.Context) error {
			occ.enter("second")
			close(secondIn)
			occ.exit("second")
			return nil
		})
	}()
	err := recvWithin(t, first, 15*time.Second, "first preparation")
	if !errors.Is(err, db.ErrSourceLockLost) {
		t.Fatalf("first preparation returned %v, want ErrSourceLockLost", err)
	}
	if workCtxErr != nil {
		t.Fatalf("without keepalive nothing should cancel the work, got %v", workCtxErr)
	}
	if err := recvWithin(t, second, 15*time.Second, "competing preparation"); err != nil {
		t.Fatalf("competing preparation: %v", err)
	}
	if occ.maxInside() != 2 {
		t.Fatalf("no overlap observed without keepalive: %v", occ.events())
	}
	noLockConnections(t, pool)
}

// testCallbackErrorUnchanged: fn's error comes back as the same value, after a work long enough
// for several keepalive pings, and even when the lock session was ended under the work; the lock
// is free afterwards.
func testCallbackErrorUnchanged(t *testing.T) {
	t.Parallel()
	pool := lockDB(t)
	errSentinel := errors.New("clone failed")
	cases := []struct {
		name string
		opts db.SourceLockOptions
		work func(t *testing.T, ctx context.Context)
	}{
		{"after 2s of keepalive", db.SourceLockOptions{}, func(t *testing.T, ctx context.Context) {
			select {
			case <-time.After(2 * time.Second):
			case <-ctx.Done():
				t.Errorf("work cancelled: %v", context.Cause(ctx))
			}
		}},
		{"after the lock session died", db.SourceLockOptions{DisableKeepalive: true}, func(t *testing.T, ctx context.Context) {
			pollUntil(t, 5*time.Second, func() (bool, string) {
				n := lockConnections(t, pool)
				return n == 0, fmt.Sprintf("%d lock sessions, want the server to have ended the idle one", n)
			})
		}},
	}
	for _, tc := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := db.WithSourceLockOptions(ctx, pool, "company-1", tc.name, tc.opts, func(ctx context.Context) error {
			tc.work(t, ctx)
			return errSentinel
		})
		cancel()
		if err != errSentinel { //nolint:errorlint // the contract is the very same value
			t.Fatalf("%s: got %v, want the callback's error itself", tc.name, err)
		}
		mustEnterPromptly(t, pool, "company-1", tc.name)
	}
	noLockConnections(t, pool)
}

// testKeepaliveReportsKilledSession: when the lock session dies under the work (here
// pg_terminate_backend), the keepalive notices, cancels fn's ctx with ErrSourceLockLost, and a
// successful fn still gets ErrSourceLockLost back.
func testKeepaliveReportsKilledSession(t *testing.T) {
	t.Parallel()
	pool := lockDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var cause error
	err := db.WithSourceLock(ctx, pool, "company-1", "repo", func(ctx context.Context) error {
		var killed bool
		if err := pool.QueryRow(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1`, lockAppName).Scan(&killed); err != nil || !killed {
			t.Errorf("terminate the lock session: %v (killed %v)", err, killed)
		}
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
		case <-time.After(5 * time.Second):
		}
		return nil
	})
	if !errors.Is(cause, db.ErrSourceLockLost) {
		t.Fatalf("work ctx cause %v, want ErrSourceLockLost", cause)
	}
	if !errors.Is(err, db.ErrSourceLockLost) {
		t.Fatalf("got %v, want ErrSourceLockLost", err)
	}
	mustEnterPromptly(t, pool, "company-1", "repo")
	noLockConnections(t, pool)
}

// testPanicReleases: a panic in fn propagates unchanged, and the lock and its connection are
// released on the way out.
func testPanicReleases(t *testing.T) {
	t.Parallel()
	pool := lockDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	boom := errors.New("boom")
	got := func() (p any) {
		defer func() { p = recover() }()
		_ = db.WithSourceLock(ctx, pool, "company-1", "repo", func(context.Context) error {
			time.Sleep(500 * time.Millisecond) // let a keepalive ping or two happen
			panic(boom)
		})
		return nil
	}()
	if got != boom { //nolint:errorlint // the panic value itself
		t.Fatalf("recovered %v, want the callback's panic value", got)
	}
	mustEnterPromptly(t, pool, "company-1", "repo")
	noLockConnections(t, pool)
}

// testCancelledWait: a competitor waiting for the lock gives up when its ctx is cancelled,
// without running fn, and its session stops waiting at the server too.
func testCancelledWait(t *testing.T) {
	t.Parallel()
	pool := lockDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	held, release := make(chan struct{}), make(chan struct{})
	holder := make(chan error, 1)
	go func() {
		holder <- db.WithSourceLock(ctx, pool, "company-1", "repo", func(context.Context) error {
			close(held)
			<-release
			return nil
		})
	}()
	defer close(release)
	recvWithin(t, held, 10*time.Second, "holder to take the lock")

	waitCtx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	waiter := make(chan error, 1)
	ran := false
	go func() {
		waiter <- db.WithSourceLock(waitCtx, pool, "company-1", "repo", func(context.Context) error {
			ran = true
			return nil
		})
	}()
	pollUntil(t, 5*time.Second, func() (bool, string) {
		n := advisoryWaiters(t, pool)
		return n == 1, fmt.Sprintf("%d sessions waiting for an advisory lock, want 1", n)
	})
	stopWaiting()
	err := recvWithin(t, waiter, 10*time.Second, "cancelled waiter")
	if !errors.Is(err, context.Canceled) || ran {
		t.Fatalf("waiter returned %v (fn ran: %v), want context.Canceled without running fn", err, ran)
	}
	pollUntil(t, 5*time.Second, func() (bool, string) {
		n := lockConnections(t, pool)
		return n == 1, fmt.Sprintf("%d lock sessions while the holder holds, want only the holder's", n)
	})
	release <- struct{}{}
	if err := recvWithin(t, holder, 10*time.Second, "holder"); err != nil {
		t.Fatalf("holder: %v", err)
	}
	noLockConnections(t, pool)
}

// testReadsIdleTimeout: the keepalive period follows the timeout the lock session reads, in
// each unit PostgreSQL prints it with.
func testReadsIdleTimeout(t *testing.T) {
	t.Parallel()
	connString := dbtest.ConnString(t)
	cases := []struct {
		setting     string
		idle, every time.Duration
	}{
		{"1500ms", 1500 * time.Millisecond, 500 * time.Millisecond},
		{"1s", time.Second, time.Second / 3},
		{"90s", 90 * time.Second, 30 * time.Second},
		{"2min", 2 * time.Minute, 30 * time.Second},
		{"1h", time.Hour, 30 * time.Second},
		{"1d", 24 * time.Hour, 30 * time.Second},
		{"0", 0, 30 * time.Second},
	}
	for _, tc := range cases {
		cfg, err := pgxpool.ParseConfig(connString)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 1
		cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = tc.setting
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		var idle, every time.Duration
		opts := db.SourceLockOptions{Locked: func(i, e time.Duration) { idle, every = i, e }}
		err = db.WithSourceLockOptions(ctx, pool, "company-1", "repo", opts, func(context.Context) error { return nil })
		pool.Close()
		cancel()
		if err != nil || idle != tc.idle || every != tc.every {
			t.Errorf("%s: err %v, read %v, keepalive %v; want %v, %v", tc.setting, err, idle, every, tc.idle, tc.every)
		}
	}
}

// lockDB gives the test a fresh database on which the server ends any session idle in a
// transaction for 1 s (set on the database, so nothing in Berth's connection settings brings
// it), and an ordinary pool of one connection on it.
func lockDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	connString := dbtest.ConnString(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		t.Fatal(err)
	}
	var name string
	if err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{name}.Sanitize()+` SET idle_in_transaction_session_timeout = '1s'`); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// occupancy records, in one total order, who is inside the locked section of one source.
type occupancy struct {
	mu     sync.Mutex
	inside int
	most   int
	log    []string
}

func (o *occupancy) enter(who string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.inside++
	o.most = max(o.most, o.inside)
	o.log = append(o.log, who+"+")
}

func (o *occupancy) exit(who string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.inside--
	o.log = append(o.log, who+"-")
}

func (o *occupancy) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.inside
}

func (o *occupancy) maxInside() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.most
}

func (o *occupancy) events() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.log)
}

// lockConnections counts the lock sessions on the test's database.
func lockConnections(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1`, lockAppName).Scan(&n); err != nil {
		t.Fatalf("count lock sessions: %v", err)
	}
	return n
}

// advisoryWaiters counts the sessions on the test's database waiting for an advisory lock.
func advisoryWaiters(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND NOT granted
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n); err != nil {
		t.Fatalf("count advisory waiters: %v", err)
	}
	return n
}

// noLockConnections waits for the server to have closed every lock session on the test's
// database: the lock left no connection behind.
func noLockConnections(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	pollUntil(t, 5*time.Second, func() (bool, string) {
		n := lockConnections(t, pool)
		return n == 0, fmt.Sprintf("%d lock sessions left", n)
	})
}

// mustEnterPromptly takes the lock of (company, source) with a short deadline: it is free.
func mustEnterPromptly(t *testing.T, pool *pgxpool.Pool, company, source string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.WithSourceLock(ctx, pool, company, source, func(context.Context) error { return nil }); err != nil {
		t.Fatalf("lock of %s/%s not free afterwards: %v", company, source, err)
	}
}

// recvWithin waits for one value from ch, failing the test after d.
func recvWithin[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("timed out after %v waiting for %s", d, what)
		panic("unreachable")
	}
}

// pollUntil polls cond until it holds, failing the test with cond's last message after d.
func pollUntil(t *testing.T, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
