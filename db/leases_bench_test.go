package db_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
)

// The lease benchmarks compare a full AcquireLease + ReleaseLease cycle with the cheapest way
// PostgreSQL can hand out slots (a raw FOR UPDATE SKIP LOCKED loop), on the same database with the
// same workers and slots. Both count double grants: a slot handed to a worker while another still
// believes it holds it.
const (
	benchWorkers = 8
	benchEnvs    = 2
	benchWSPer   = 16 // workspaces per environment: benchEnvs × benchWSPer slots
)

// benchRun spreads b.N cycles over benchWorkers goroutines, each with its own connection, and
// reports cycles/s and double grants. cycle does one cycle for worker w, with holders to count
// who holds each slot, and returns how many busy attempts it needed.
func benchRun(b *testing.B, pool *pgxpool.Pool, slots int,
	cycle func(ctx context.Context, conn *pgxpool.Conn, w int, rng *rand.Rand, holders []atomic.Int32, doubles *atomic.Int64) (busy int, err error),
) (doubles int64) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	conns := make([]*pgxpool.Conn, benchWorkers)
	for w := range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Release()
		conns[w] = c
	}
	pids := make([]int, benchWorkers)
	for w, c := range conns {
		if err := c.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pids[w]); err != nil {
			b.Fatal(err)
		}
	}
	holders := make([]atomic.Int32, slots)
	var next, busy, double atomic.Int64
	errs := make([]error, benchWorkers)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for w := range benchWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(b.N)))
			<-gate
			for next.Add(1) <= int64(b.N) {
				n, err := cycle(ctx, conns[w], w, rng, holders, &double)
				if err != nil {
					errs[w] = err
					cancel()
					return
				}
				busy.Add(int64(n))
			}
		}()
	}
	b.ResetTimer()
	dbCPU, dbOK := backendsCPU(pids)
	clientCPU := processCPU()
	start := time.Now()
	close(gate)
	wg.Wait()
	elapsed := time.Since(start)
	clientCPU = processCPU() - clientCPU
	dbCPUAfter, dbOKAfter := backendsCPU(pids)
	b.StopTimer()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "cycles/s")
	b.ReportMetric(float64(busy.Load())/float64(b.N), "busy/cycle")
	b.ReportMetric(float64(double.Load()), "double-grants")
	// CPU per cycle is the cost figure that survives a busy machine, where wall-clock cycles/s
	// depends on what else runs; the database side is known only for a local server.
	b.ReportMetric(float64(clientCPU.Microseconds())/float64(b.N), "client-cpu-µs/cycle")
	if dbOK && dbOKAfter {
		b.ReportMetric(float64((dbCPUAfter-dbCPU).Microseconds())/float64(b.N), "db-cpu-µs/cycle")
	}
	if double.Load() != 0 {
		b.Errorf("%d double grants", double.Load())
	}
	return double.Load()
}

// processCPU is the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// backendsCPU is the CPU time the PostgreSQL backends with these pids have used, read from /proc;
// false when the server is not on this machine.
func backendsCPU(pids []int) (time.Duration, bool) {
	var ticks int64
	for _, pid := range pids {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return 0, false
		}
		// Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
		_, rest, ok := strings.Cut(string(stat), ") ")
		f := strings.Fields(rest)
		if !ok || len(f) < 13 {
			return 0, false
		}
		for _, s := range f[11:13] {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return 0, false
			}
			ticks += n
		}
	}
	return time.Duration(ticks) * time.Second / 100, true // USER_HZ is 100 on Linux
}

// hold marks slot s taken by the caller for as long as it believes it holds it; a second holder
// at once is a double grant.
func hold(holders []atomic.Int32, s int, doubles *atomic.Int64) {
	if holders[s].Add(1) != 1 {
		doubles.Add(1)
	}
}

// BenchmarkLeaseCycle: 8 workers, each iteration an AcquireLease on a random slot of a shared
// pool of environment × workspace slots (another random one while it is busy) and ReleaseLease.
// At the end no slot may have more than one live lease and every cycle left one released lease.
func BenchmarkLeaseCycle(b *testing.B) {
	f := setupLeases(b, benchEnvs, benchWSPer, benchWorkers)
	slots := benchEnvs * benchWSPer
	benchRun(b, f.pool, slots, func(ctx context.Context, conn *pgxpool.Conn, w int, rng *rand.Rand, holders []atomic.Int32, doubles *atomic.Int64) (int, error) {
		for busy := 0; ; busy++ {
			s := rng.IntN(slots)
			l, err := db.AcquireLease(ctx, conn, f.request(s/benchWSPer, s%benchWSPer, w))
			if errors.Is(err, db.ErrLeaseBusy) {
				continue
			}
			if err != nil {
				return busy, err
			}
			hold(holders, s, doubles)
			holders[s].Add(-1)
			_, err = db.ReleaseLease(ctx, conn, l.ID, l.Generation, "bench")
			return busy, err
		}
	})
	var doubleSlots, live, released int
	err := f.pool.QueryRow(context.Background(), `SELECT
			(SELECT count(*) FROM (SELECT 1 FROM environment_leases WHERE status IN ('acquiring', 'active', 'releasing')
				GROUP BY environment_id, execution_workspace_id HAVING count(*) > 1) d),
			count(*) FILTER (WHERE status IN ('acquiring', 'active', 'releasing')),
			count(*) FILTER (WHERE status = 'released')
		FROM environment_leases`).Scan(&doubleSlots, &live, &released)
	if err != nil {
		b.Fatal(err)
	}
	if doubleSlots != 0 || live != 0 || released != b.N {
		b.Fatalf("after %d cycles: %d slots with two live leases, %d live, %d released", b.N, doubleSlots, live, released)
	}
}

// BenchmarkRawSkipLocked is the baseline: the same 8 workers and slot count, each iteration one
// transaction that claims a free slot with SELECT … FOR UPDATE SKIP LOCKED LIMIT 1, updates it
// and commits.
func BenchmarkRawSkipLocked(b *testing.B) {
	f := setupLeases(b, 0, 0, 0)
	slots := benchEnvs * benchWSPer
	ctx := context.Background()
	if _, err := f.pool.Exec(ctx, `CREATE TABLE bench_slots (id int PRIMARY KEY, holder int, cycles bigint NOT NULL DEFAULT 0)`); err != nil {
		b.Fatal(err)
	}
	if _, err := f.pool.Exec(ctx, `INSERT INTO bench_slots (id) SELECT g FROM generate_series(0, $1 - 1) g`, slots); err != nil {
		b.Fatal(err)
	}
	benchRun(b, f.pool, slots, func(ctx context.Context, conn *pgxpool.Conn, w int, _ *rand.Rand, holders []atomic.Int32, doubles *atomic.Int64) (int, error) {
		for busy := 0; ; busy++ {
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				var s int
				if err := tx.QueryRow(ctx, `SELECT id FROM bench_slots LIMIT 1 FOR UPDATE SKIP LOCKED`).Scan(&s); err != nil {
					return err
				}
				hold(holders, s, doubles)
				defer holders[s].Add(-1)
				_, err := tx.Exec(ctx, `UPDATE bench_slots SET holder = $2, cycles = cycles + 1 WHERE id = $1`, s, w)
				return err
			})
			if errors.Is(err, pgx.ErrNoRows) {
				continue // every slot locked by the other workers
			}
			return busy, err
		}
	})
	var cycles int
	if err := f.pool.QueryRow(ctx, `SELECT sum(cycles) FROM bench_slots`).Scan(&cycles); err != nil || cycles != b.N {
		b.Fatalf("slots record %d cycles (%v), want %d", cycles, err, b.N)
	}
}
