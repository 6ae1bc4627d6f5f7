package jobs

import (
	"context"
	"io"
	"log/slog"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"berth/db/dbtest"
)

// pingArgs is a no-op job for measuring pickup latency.
type pingArgs struct {
	Enqueued time.Time `json:"enqueued"`
}

func (pingArgs) Kind() string { return "bench_ping" }

type pingWorker struct {
	river.WorkerDefaults[pingArgs]
	picked chan time.Duration
}

func (w *pingWorker) Work(ctx context.Context, job *river.Job[pingArgs]) error {
	w.picked <- time.Since(job.Args.Enqueued)
	return nil
}

// BenchmarkRiverPickup measures the time from committing an insert through Enqueue (Berth's one
// door) to a worker starting the job, with the client tuned exactly as NewClient tunes it
// (FetchCooldown, FetchPollInterval): a job after job, each inserted once the last was picked up.
func BenchmarkRiverPickup(b *testing.B) {
	ctx := context.Background()
	pool := dbtest.New(b)
	w := &pingWorker{picked: make(chan time.Duration, 1)}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	cfg := tunedConfig(Deps{Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, workers)
	cfg.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}}
	client := startClient(b, pool, cfg)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := Enqueue(ctx, client, tx, pingArgs{Enqueued: time.Now()})
			return err
		}); err != nil {
			b.Fatal(err)
		}
		select {
		case d := <-w.picked:
			lat = append(lat, d)
		case <-time.After(10 * time.Second):
			b.Fatalf("job %d not picked up within 10 s", i)
		}
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// startClient starts a River client of cfg on pool, stopped when tb ends.
func startClient(tb testing.TB, pool *pgxpool.Pool, cfg *river.Config) *river.Client[pgx.Tx] {
	tb.Helper()
	client, err := river.NewClient(riverpgxv5.New(pool), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if err := client.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.Stop(stopCtx)
	})
	return client
}
