// Package dbtest gives each test its own real PostgreSQL database: one cluster per test binary
// (the embedded starter, or the server in BERTH_TEST_DATABASE_URL), one migrated template
// database, and a fresh clone of it per test. Packages that use it call Main from TestMain.
package dbtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/db/pgembed"
)

// server is the test binary's PostgreSQL server and its migrated template.
type server struct {
	once     sync.Once
	err      error
	admin    string // connection string of a maintenance database
	template string // template database name
	cluster  *pgembed.Cluster
	dir      string
}

// the one server of this test binary; tests share it, as they share the binary.
var srv server

// Main runs the tests and then stops the embedded cluster, if one was started.
func Main(m *testing.M) {
	code := m.Run()
	if srv.cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = srv.cluster.Stop(ctx)
		cancel()
		_ = os.RemoveAll(srv.dir)
	}
	os.Exit(code)
}

func (s *server) start() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s.admin = os.Getenv("BERTH_TEST_DATABASE_URL")
	if s.admin == "" {
		dir, err := os.MkdirTemp("", "berthdb")
		if err != nil {
			s.err = err
			return
		}
		s.dir = dir
		s.cluster, err = pgembed.Start(ctx, pgembed.Options{Dir: dir + "/pg", Persistent: true, Fast: true})
		if err != nil {
			s.err = fmt.Errorf("dbtest: start embedded cluster: %w", err)
			return
		}
		s.admin = s.cluster.ConnString()
	}
	s.err = s.makeTemplate(ctx)
}

// makeTemplate creates the migrated template database once per schema version; concurrent test
// binaries on one external server wait for each other on an advisory lock.
func (s *server) makeTemplate(ctx context.Context) error {
	migs, err := db.Migrations()
	if err != nil {
		return err
	}
	h := sha256.New()
	for _, m := range migs {
		fmt.Fprintf(h, "%d %s\n%s\n", m.Version, m.Name, m.SQL)
	}
	s.template = "berth_tmpl_" + hex.EncodeToString(h.Sum(nil))[:16]

	conn, err := pgx.Connect(ctx, s.admin)
	if err != nil {
		return fmt.Errorf("dbtest: connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(7253001)`); err != nil {
		return fmt.Errorf("dbtest: lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(7253001)`) //nolint:errcheck // released with the connection anyway
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, s.template).Scan(&exists); err != nil {
		return fmt.Errorf("dbtest: %w", err)
	}
	if exists {
		return nil
	}
	building := s.template + "_building"
	_, _ = conn.Exec(ctx, `DROP DATABASE IF EXISTS `+building+` WITH (FORCE)`)
	if _, err := conn.Exec(ctx, `CREATE DATABASE `+building); err != nil {
		return fmt.Errorf("dbtest: create template: %w", err)
	}
	pool, err := db.Open(ctx, withDatabase(s.admin, building))
	if err != nil {
		return err
	}
	err = db.Migrate(ctx, pool, slog.New(slog.NewTextHandler(io.Discard, nil)))
	pool.Close()
	if err != nil {
		return fmt.Errorf("dbtest: migrate template: %w", err)
	}
	if _, err := conn.Exec(ctx, `ALTER DATABASE `+building+` RENAME TO `+s.template); err != nil {
		return fmt.Errorf("dbtest: publish template: %w", err)
	}
	return nil
}

// withDatabase is the connection string conn pointed at another database: a URL gets a new
// path, a keyword/value string a trailing dbname (the last value of a keyword wins).
func withDatabase(conn string, name string) string {
	if strings.HasPrefix(conn, "postgres://") || strings.HasPrefix(conn, "postgresql://") {
		if u, err := url.Parse(conn); err == nil {
			u.Path = "/" + name
			return u.String()
		}
	}
	return conn + " dbname=" + name
}

// ConnString returns the connection string of a fresh, migrated database that is dropped when
// the test ends.
func ConnString(t testing.TB) string {
	t.Helper()
	return create(t, "")
}

// EmptyConnString returns the connection string of a fresh database with no schema at all (for
// migration tests), dropped when the test ends.
func EmptyConnString(t testing.TB) string {
	t.Helper()
	return create(t, "template0")
}

// create makes a database from template (the migrated template when empty).
func create(t testing.TB, template string) string {
	t.Helper()
	srv.once.Do(srv.start)
	if srv.err != nil {
		t.Fatalf("dbtest: %v", srv.err)
	}
	ctx := context.Background()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "berth_t_" + hex.EncodeToString(b)
	conn, err := pgx.Connect(ctx, srv.admin)
	if err != nil {
		t.Fatalf("dbtest: connect: %v", err)
	}
	defer conn.Close(ctx)
	if template == "" {
		template = srv.template
	}
	if _, err := conn.Exec(ctx, `CREATE DATABASE `+name+` TEMPLATE `+template); err != nil {
		t.Fatalf("dbtest: clone template: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, srv.admin)
		if err != nil {
			t.Errorf("dbtest: drop %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`); err != nil {
			t.Errorf("dbtest: drop %s: %v", name, err)
		}
	})
	return withDatabase(srv.admin, name)
}

// New returns a pool on a fresh, migrated database that is closed and dropped when the test ends.
func New(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := db.Open(context.Background(), ConnString(t))
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}
