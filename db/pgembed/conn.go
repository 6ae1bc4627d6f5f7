package pgembed

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

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
