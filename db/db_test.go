package db_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"

	"berth/db"
	"berth/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestMigrateConcurrentAndTwice applies the migrations from four processes' worth of goroutines
// at once on an empty database, then again: every run succeeds, each migration is applied once.
func TestMigrateConcurrentAndTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := db.Open(ctx, dbtest.EmptyConnString(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- db.Migrate(ctx, pool, quiet()) }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent migrate: %v", err)
		}
	}
	migs, err := db.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	count := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM berth_migrations`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n != len(migs) {
		t.Fatalf("ledger has %d rows, want %d", n, len(migs))
	}
	if err := db.Migrate(ctx, pool, quiet()); err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	if n := count(); n != len(migs) {
		t.Fatalf("second migrate changed the ledger to %d rows", n)
	}
	var riverTables int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_name = 'river_job'`).Scan(&riverTables); err != nil || riverTables != 1 {
		t.Fatalf("river_job table missing (%v)", err)
	}
}

// TestMigrateRefusesNewerDatabase: a database migrated by a newer binary is not touched.
func TestMigrateRefusesNewerDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := db.Open(ctx, dbtest.ConnString(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `INSERT INTO berth_migrations (version, name) VALUES (9999, 'future')`); err != nil {
		t.Fatal(err)
	}
	if err := db.Migrate(ctx, pool, quiet()); err == nil {
		t.Fatal("migrate accepted a database newer than the binary")
	}
}

func TestPasswords(t *testing.T) {
	t.Parallel()
	h, err := db.HashPassword("correct horse battery")
	if err != nil {
		t.Fatal(err)
	}
	if err := db.CheckPassword(h, "correct horse battery"); err != nil {
		t.Fatalf("right password: %v", err)
	}
	if err := db.CheckPassword(h, "correct horse batterY"); !errors.Is(err, db.ErrBadPassword) {
		t.Fatalf("wrong password: %v", err)
	}
	h2, _ := db.HashPassword("correct horse battery")
	if h == h2 {
		t.Fatal("two hashes of one password are equal: no salt")
	}
	for _, bad := range []string{"", "plain", "$argon2id$v=19$m=1,t=1,p=1$!!$!!", "$bcrypt$x$y$z$w"} {
		if err := db.CheckPassword(bad, "x"); err == nil || errors.Is(err, db.ErrBadPassword) {
			t.Errorf("malformed hash %q: err = %v, want a format error", bad, err)
		}
	}
}

func TestTokens(t *testing.T) {
	t.Parallel()
	a, ha, err := db.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	b, _, _ := db.NewToken()
	if a == b || len(a) < 40 || !bytes.Equal(ha, db.HashToken(a)) || len(ha) != 32 {
		t.Fatalf("tokens %q %q hash %x", a, b, ha)
	}
}
