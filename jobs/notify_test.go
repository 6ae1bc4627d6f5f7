package jobs

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"berth/db/dbtest"
)

// TestEnqueueNotifiesEveryInsert: a job enqueued through Enqueue is picked up at its commit even
// when River skipped its own insert notification, so the fallback poll can be long. The inserting
// client's FetchCooldown is an hour, so River notifies its first insert and no later one; the
// working client polls once an hour. Negative control: a later insert straight through River is
// not picked up; the next insert through Enqueue brings both.
func TestEnqueueNotifiesEveryInsert(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	quiet := slog.New(slog.DiscardHandler)
	w := &pingWorker{picked: make(chan time.Duration, 4)}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	startClient(t, pool, &river.Config{Logger: quiet, Workers: workers, FetchCooldown: time.Millisecond,
		FetchPollInterval: time.Hour, Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}}})
	ins, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quiet, Workers: workers,
		FetchCooldown: time.Hour, FetchPollInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	inTx := func(f func(tx pgx.Tx) error) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, pool, f); err != nil {
			t.Fatal(err)
		}
	}
	picked := func(what string, n int) {
		t.Helper()
		for i := range n {
			select {
			case <-w.picked:
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: %d of %d jobs picked up in 30 s", what, i, n)
			}
		}
	}

	// The first insert: River notifies it.
	inTx(func(tx pgx.Tx) error {
		_, err := ins.InsertTx(ctx, tx, pingArgs{Enqueued: time.Now()}, nil)
		return err
	})
	picked("River's first notified insert", 1)

	// The second straight through River: its notification is skipped, nothing fetches it.
	inTx(func(tx pgx.Tx) error {
		_, err := ins.InsertTx(ctx, tx, pingArgs{Enqueued: time.Now()}, nil)
		return err
	})
	select {
	case <-w.picked:
		t.Fatal("an insert River did not notify was picked up: the control no longer shows the skipped notification")
	case <-time.After(2 * time.Second):
	}

	// Through Enqueue: notified at commit; the fetch takes the waiting one too.
	inTx(func(tx pgx.Tx) error { _, err := Enqueue(ctx, ins, tx, pingArgs{Enqueued: time.Now()}); return err })
	picked("inserts through Enqueue", 2)
}
