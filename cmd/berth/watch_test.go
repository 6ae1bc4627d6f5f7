package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
)

// The crash, outage and nodes tests watch real processes through the database the same way.

// waitUntil polls cond every 100 ms and fails the test when it has not held within within.
func waitUntil(t testing.TB, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within %s", what, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runRow reads run id.
func runRow(t testing.TB, pool *pgxpool.Pool, id string) db.Run {
	t.Helper()
	r, err := db.RunForJob(context.Background(), pool, id)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// countRows runs a SELECT count(*) query.
func countRows(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
