// Package db owns Berth's PostgreSQL schema and every query against it: embedded migrations, the
// transaction helper, and small hand-written pgx functions grouped by table. Every query on
// company-owned rows takes the company id; callers never build SQL.
package db

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNotFound is returned when a row does not exist or is not visible to the caller; handlers
// turn it into the same 404 either way.
var ErrNotFound = errors.New("not found")

// ErrConflict is returned when a write collides with a uniqueness rule (an existing email, slug…).
var ErrConflict = errors.New("conflict")

// Querier is what the query functions need: a pool, a connection or a transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// AcquireTimeout is how long a request (a context made by WatchAcquire) waits for a pooled
// connection when every one is in use; after it the call fails and AcquireTimedOut reports it
// (handlers answer 503 database_busy). Background work (jobs, heartbeats) keeps waiting.
const AcquireTimeout = 2 * time.Second

// Open connects a pool to the database named by connString and checks that it answers.
//
// The pool outlives database restarts: a connection idle for over a second is checked before it
// is handed out and replaced if dead (shouldPing), one that fails mid-query is discarded, and new
// ones are dialled on demand (each within ConnectTimeout), so after an outage the next callers
// get fresh connections without anything restarting the pool.
func Open(ctx context.Context, connString string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("db: parse connection string: %w", err)
	}
	if cfg.MaxConns < 8 {
		cfg.MaxConns = 8
	}
	cfg.MaxConnIdleTime = 5 * time.Minute
	cfg.HealthCheckPeriod = 10 * time.Second
	cfg.ShouldPing = shouldPing
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	cfg.ConnConfig.Tracer = acquireTimeout{} // pgxpool takes its AcquireTracer from here
	cfg.ConnConfig.RuntimeParams["application_name"] = "berth"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("db: open: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("db: connect: %w", err)
	}
	return pool, nil
}

// pingAfter is how long a connection may sit idle before it is pinged, not only checked, when
// it is handed out.
const pingAfter = time.Minute

// shouldPing decides whether the pool pings a connection before handing it out. One idle for
// over pingAfter is pinged: a round trip is what finds a silently dead network path. One idle for
// less is checked without a query: a database restart or a killed backend closes the socket,
// which a read with a 1 ms deadline sees (pgconn's CheckConn); only a connection found broken is
// pinged, the ping fails and the pool dials a fresh one. pgxpool's default pings after a second
// idle, which doubled what an idle server's heartbeats cost the database (BenchmarkIdleServer).
func shouldPing(_ context.Context, p pgxpool.ShouldPingParams) bool {
	switch {
	case p.IdleDuration <= time.Second:
		return false
	case p.IdleDuration > pingAfter:
		return true
	default:
		//lint:ignore SA1019 deprecated because a read cannot see every broken TCP path; the ping after pingAfter covers those
		return p.Conn.PgConn().CheckConn() != nil
	}
}

// acquireTimeout bounds the pool acquires of watched contexts by AcquireTimeout (pgxpool
// acquires with the context its AcquireTracer returns) and records a timeout for AcquireTimedOut.
type acquireTimeout struct{}

type acquireKey struct{}

// TraceQueryStart and TraceQueryEnd do nothing: a pgx tracer must be a QueryTracer.
func (acquireTimeout) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (acquireTimeout) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// acquireState is what TraceAcquireStart leaves in the acquire's context.
type acquireState struct {
	cancel context.CancelFunc
	parent context.Context
}

// errAcquireTimeout is the cause of an acquire context that ran out of AcquireTimeout.
var errAcquireTimeout = errors.New("no pooled database connection became free in time")

func (acquireTimeout) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	if _, watched := ctx.Value(acquireWatchKey{}).(*acquireWatch); !watched {
		return ctx
	}
	actx, cancel := context.WithTimeoutCause(ctx, AcquireTimeout, errAcquireTimeout)
	return context.WithValue(actx, acquireKey{}, acquireState{cancel: cancel, parent: ctx})
}

func (acquireTimeout) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, data pgxpool.TraceAcquireEndData) {
	st, ok := ctx.Value(acquireKey{}).(acquireState)
	if !ok {
		return
	}
	if data.Err != nil && errors.Is(context.Cause(ctx), errAcquireTimeout) {
		if w, ok := st.parent.Value(acquireWatchKey{}).(*acquireWatch); ok {
			w.timedOut.Store(true)
		}
	}
	st.cancel()
}

type acquireWatchKey struct{}

// acquireWatch records that an acquire under a context timed out.
type acquireWatch struct{ timedOut atomic.Bool }

// WatchAcquire returns a context whose pool acquires give up after AcquireTimeout, and under
// which AcquireTimedOut can later tell that this happened (the error itself is a plain
// context.DeadlineExceeded). Handlers mark every request with it.
func WatchAcquire(ctx context.Context) context.Context {
	return context.WithValue(ctx, acquireWatchKey{}, &acquireWatch{})
}

// AcquireTimedOut reports whether a pool acquire under ctx (made by WatchAcquire) timed out
// because every connection stayed in use.
func AcquireTimedOut(ctx context.Context) bool {
	w, ok := ctx.Value(acquireWatchKey{}).(*acquireWatch)
	return ok && w.timedOut.Load()
}

// InTx runs fn in a transaction that commits when fn returns nil and rolls back otherwise.
func InTx(ctx context.Context, pool *pgxpool.Pool, fn func(tx pgx.Tx) error) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("db: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("db: commit: %w", err)
	}
	return nil
}

// notFound turns pgx.ErrNoRows into ErrNotFound and leaves other errors alone.
func notFound(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	return err
}

// isUniqueViolation reports whether err is PostgreSQL's unique_violation (23505).
func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}
