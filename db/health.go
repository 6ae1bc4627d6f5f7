package db

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Ping reports whether the database answers a query.
func Ping(ctx context.Context, q Querier) error {
	var one int
	if err := q.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
		return fmt.Errorf("ping database: %w", err)
	}
	return nil
}

// Unavailable reports whether err says the database could not be reached or the connection to
// it broke (refused or failed connects, a server starting up or shutting down, a connection
// that went away mid-query), as opposed to an error the database answered. Handlers answer
// such errors with 503 database_unavailable instead of 500.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case len(pgErr.Code) == 5 && pgErr.Code[:2] == "08": // connection_exception
			return true
		case pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03": // admin/crash shutdown, cannot connect now
			return true
		}
		return false
	}
	// What pgconn returns once the socket of an established connection broke.
	return errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// Reachable opens one fresh connection to the pool's database (not through the pool) and
// pings it within timeout. It tells an outage from a bug when a request failed in a way
// Unavailable does not recognize.
func Reachable(ctx context.Context, pool *pgxpool.Pool, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.Ping(ctx)
}

// Prober checks the database over a dedicated connection of its own, so that the health
// endpoint answers even while every pooled connection is taken or broken. It opens the
// connection at the first check and again after it broke; checks take turns on it (a
// pgx.Conn serves one caller at a time).
type Prober struct {
	config *pgx.ConnConfig
	turn   chan struct{} // a one-slot semaphore held while conn is in use
	conn   *pgx.Conn
}

// NewProber makes a prober for the pool's database; it connects lazily.
func NewProber(pool *pgxpool.Pool) *Prober {
	cfg := pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = "berth health"
	return &Prober{config: cfg, turn: make(chan struct{}, 1)}
}

// Check reports whether the database answers on the prober's connection before ctx ends.
// Concurrent checks wait for their turn within their own deadline.
func (p *Prober) Check(ctx context.Context) error {
	select {
	case p.turn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("database check: %w", ctx.Err())
	}
	defer func() { <-p.turn }()
	if p.conn == nil || p.conn.IsClosed() {
		conn, err := pgx.ConnectConfig(ctx, p.config)
		if err != nil {
			return fmt.Errorf("database check: connect: %w", err)
		}
		p.conn = conn
	}
	if err := p.conn.Ping(ctx); err != nil {
		// A ping cut short by the deadline leaves the connection in an unknown state.
		closeCtx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		p.conn.Close(closeCtx)
		cancel()
		p.conn = nil
		return fmt.Errorf("database check: %w", err)
	}
	return nil
}

// Close closes the prober's connection once no check uses it.
func (p *Prober) Close() {
	p.turn <- struct{}{}
	defer func() { <-p.turn }()
	if p.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		p.conn.Close(ctx)
		p.conn = nil
	}
}
