package db_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/db/dbtest"
)

// TestAcquireTimeoutAndProber (F10 at the pool): with every pooled connection held, a query
// gives up after db.AcquireTimeout, AcquireTimedOut says so (a plain deadline does not), the
// prober still answers on its own connection, and after the release the pool serves again.
func TestAcquireTimeoutAndProber(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	var held []*pgxpool.Conn
	for range int(pool.Config().MaxConns) {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	wctx := db.WatchAcquire(ctx)
	began := time.Now()
	err := db.Ping(wctx, pool)
	waited := time.Since(began)
	if !errors.Is(err, context.DeadlineExceeded) || !db.AcquireTimedOut(wctx) {
		t.Fatalf("ping on an exhausted pool = %v (timed out recorded: %v)", err, db.AcquireTimedOut(wctx))
	}
	if waited < db.AcquireTimeout/2 {
		t.Fatalf("gave up after %s, before the acquire timeout", waited)
	}
	if db.Unavailable(err) {
		t.Fatal("an exhausted pool is not an unavailable database")
	}

	// A caller's own shorter deadline is not a pool timeout.
	short := db.WatchAcquire(ctx)
	sctx, cancel := context.WithTimeout(short, 50*time.Millisecond)
	defer cancel()
	if err := db.Ping(sctx, pool); err == nil || db.AcquireTimedOut(short) {
		t.Fatalf("short deadline: %v, recorded as pool timeout: %v", err, db.AcquireTimedOut(short))
	}

	p := db.NewProber(pool)
	defer p.Close()
	cctx, cancel2 := context.WithTimeout(ctx, time.Second)
	defer cancel2()
	if err := p.Check(cctx); err != nil {
		t.Fatalf("prober with the pool exhausted: %v", err)
	}
	if err := db.Reachable(ctx, pool, time.Second); err != nil {
		t.Fatalf("Reachable with the pool exhausted: %v", err)
	}

	// Background work (an unwatched context) keeps waiting past AcquireTimeout.
	waiting := make(chan error, 1)
	go func() { waiting <- db.Ping(ctx, pool) }()
	select {
	case err := <-waiting:
		t.Fatalf("an unwatched acquire gave up on an exhausted pool: %v", err)
	case <-time.After(db.AcquireTimeout + time.Second):
	}
	for _, c := range held {
		c.Release()
	}
	if err := <-waiting; err != nil {
		t.Fatalf("the unwatched acquire after the release: %v", err)
	}
	if err := db.Ping(db.WatchAcquire(ctx), pool); err != nil {
		t.Fatalf("after the release: %v", err)
	}
}

// TestUnavailableErrors: the errors a dead server produces are recognized; ordinary ones are not.
func TestUnavailableErrors(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()

	// A backend terminated under a session: what a connection sees when its server goes away.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, `SELECT 1`)
	conn.Release()
	if !db.Unavailable(err) {
		t.Fatalf("query on a terminated backend: %v (%T) not recognized", err, err)
	}

	// Nothing listens: a failed connect.
	cfg := pool.Config().Copy()
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "/nonexistent-berth-socket-dir", 5432
	dead, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	err = db.Ping(ctx, dead)
	if !db.Unavailable(err) {
		t.Fatalf("ping with nothing listening: %v not recognized", err)
	}
	if err := db.Reachable(ctx, dead, time.Second); err == nil {
		t.Fatal("Reachable with nothing listening")
	}
	p := db.NewProber(dead)
	if err := p.Check(ctx); err == nil {
		t.Fatal("prober with nothing listening")
	}

	for _, ok := range []error{nil, errors.New("boom"), db.ErrNotFound, context.DeadlineExceeded} {
		if db.Unavailable(ok) {
			t.Fatalf("%v taken for an outage", ok)
		}
	}
	_, err = pool.Exec(ctx, `SELECT * FROM no_such_table`)
	if err == nil || db.Unavailable(err) {
		t.Fatalf("an SQL error taken for an outage: %v", err)
	}
}

// TestPoolChecksIdleConnectionsWithoutAQuery: a connection idle for over a second whose backend
// went away (a restart, a killed backend) is replaced before it is handed out, and a healthy one
// is handed out without a ping: the database sees one transaction for the query, not two. The
// negative control is pgxpool with checks off, which hands out the dead connection.
func TestPoolChecksIdleConnectionsWithoutAQuery(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()

	killIdle := func(p *pgxpool.Pool) {
		t.Helper()
		victim, err := p.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		killer, err := p.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var pid int
		if err := victim.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		if _, err := killer.Exec(ctx, `SELECT pg_terminate_backend($1, 5000)`, pid); err != nil {
			t.Fatal(err)
		}
		killer.Release()
		victim.Release() // last in, first out: the next acquire takes the dead one
		time.Sleep(1100 * time.Millisecond)
	}

	// Negative control: without the check the dead connection is handed out and the query fails.
	cfg := pool.Config()
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	cfg.MaxConns = 2
	unchecked, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer unchecked.Close()
	killIdle(unchecked)
	if _, err := unchecked.Exec(ctx, `SELECT 1`); err == nil {
		t.Fatal("negative control: a pool without checks handed out a live connection; the test cannot tell")
	}

	killIdle(pool)
	if _, err := pool.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatalf("a connection whose backend went away was handed out: %v", err)
	}

	// A healthy connection idle for over a second is handed out without a ping. The pings are
	// counted on the wire: a pool over the same configuration whose connections report what
	// they write.
	var pings atomic.Int64
	counted := pool.Config()
	dial := counted.ConnConfig.DialFunc
	counted.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		return pingCounter{c, &pings}, err
	}
	cp, err := pgxpool.NewWithConfig(ctx, counted)
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	for range 2 {
		if _, err := cp.Exec(ctx, `SELECT 1`); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1100 * time.Millisecond)
	}
	if _, err := cp.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	if n := pings.Load(); n != 0 {
		t.Fatalf("healthy connections idle for over a second were pinged %d times, want 0", n)
	}
}

// pingCounter counts the pgx pings written through a connection.
type pingCounter struct {
	net.Conn
	n *atomic.Int64
}

func (c pingCounter) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte("-- ping")) {
		c.n.Add(1)
	}
	return c.Conn.Write(b)
}
