package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/db/pgembed"
	"berth/environment/datadir"
)

// database is an open pool plus whatever must be stopped after it closes.
type database struct {
	Pool    *pgxpool.Pool
	cluster *pgembed.Cluster
}

// openDatabase connects to DATABASE_URL, or else to the embedded cluster in the data dir
// (starting it if no other berth process already has), and applies migrations. persistent marks
// long-lived processes (serve, worker); short commands borrow a running cluster.
func openDatabase(ctx context.Context, c *config, log *slog.Logger, persistent bool) (*database, error) {
	d := &database{}
	conn := c.DatabaseURL
	if conn == "" {
		if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
			return nil, fmt.Errorf("data dir: %w", err)
		}
		cl, err := pgembed.Start(ctx, pgembed.Options{Dir: datadir.At(c.DataDir).Postgres(), Persistent: persistent, Logger: log})
		if err != nil {
			if errors.Is(err, pgembed.ErrNoBinaries) {
				return nil, err
			}
			return nil, fmt.Errorf("embedded postgres: %w", err)
		}
		d.cluster = cl
		conn = cl.ConnString()
	}
	pool, err := db.Open(ctx, conn)
	if err != nil {
		d.close()
		return nil, err
	}
	d.Pool = pool
	if err := db.Migrate(ctx, pool, log); err != nil {
		d.close()
		return nil, err
	}
	return d, nil
}

// close closes the pool, then stops the embedded cluster if this process started it.
func (d *database) close() {
	if d.Pool != nil {
		d.Pool.Close()
	}
	if d.cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = d.cluster.Stop(ctx)
	}
}
