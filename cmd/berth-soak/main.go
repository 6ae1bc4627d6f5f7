// Command berth-soak is `make soak`: it runs a real `berth serve` (owning its embedded
// PostgreSQL) and a separate `berth worker` on a fresh data dir, drives mixed runs through the
// API for a while (short successes and failures, sleepers, cancels, workspace closes, in
// isolated and shared workspaces) while SIGKILLing the worker and the postmaster at random,
// lets everything settle, and then counts what must never happen: lost runs, duplicate
// workspaces, active leases without a live run, orphan processes (and, besides, HTTP 500s).
// It exits 1 if any count is above zero.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "berth-soak:", err)
		os.Exit(1)
	}
}

// options of one soak.
type options struct {
	bin        string
	duration   time.Duration
	settle     time.Duration
	seed       uint64
	keep       bool
	workerKill time.Duration // mean interval between worker SIGKILLs
	pgKill     time.Duration // mean interval between postmaster SIGKILLs
}

func run(ctx context.Context) error {
	minutes := 10.0
	if v := os.Getenv("SOAK_MINUTES"); v != "" {
		m, err := strconv.ParseFloat(v, 64)
		if err != nil || m <= 0 {
			return fmt.Errorf("SOAK_MINUTES=%q: want a positive number of minutes", v)
		}
		minutes = m
	}
	var o options
	flag.StringVar(&o.bin, "berth", "bin/berth", "the berth binary to soak")
	flag.DurationVar(&o.duration, "duration", time.Duration(minutes*float64(time.Minute)), "how long to drive load and faults (SOAK_MINUTES)")
	flag.DurationVar(&o.settle, "settle", 4*time.Minute, "how long to wait afterwards for every run to end")
	flag.Uint64Var(&o.seed, "seed", uint64(time.Now().UnixNano()), "random seed (printed, to repeat a soak)")
	flag.BoolVar(&o.keep, "keep", false, "keep the data dir and logs afterwards")
	flag.DurationVar(&o.workerKill, "worker-kill-every", 60*time.Second, "mean interval between worker SIGKILLs")
	flag.DurationVar(&o.pgKill, "pg-kill-every", 90*time.Second, "mean interval between postmaster SIGKILLs")
	flag.Parse()
	bin, err := filepath.Abs(o.bin)
	if err != nil {
		return err
	}
	o.bin = bin
	if _, err := os.Stat(o.bin); err != nil {
		return fmt.Errorf("%s: %w (run make build first)", o.bin, err)
	}

	// Jailed commands may not use directories under /tmp: the data dir lives in /var/tmp.
	root, err := os.MkdirTemp("/var/tmp", "berth-soak-")
	if err != nil {
		return err
	}
	if err := os.Chmod(root, 0o755); err != nil {
		return err
	}
	s := &soak{opts: o, root: root, rng: rand.New(rand.NewPCG(o.seed, o.seed^0x9e3779b97f4a7c15)),
		runs: map[string]*runRecord{}, statuses: map[int]int{}, reopen: map[string]reopening{}}
	s.http.Timeout = 15 * time.Second
	fmt.Printf("soak: %s of load and faults, seed %d, data in %s\n", o.duration, o.seed, root)
	defer func() {
		s.shutdown()
		if o.keep {
			fmt.Printf("soak: kept %s (serve.log, worker.log, data/pg/postgres.log)\n", root)
		} else {
			_ = os.RemoveAll(root)
		}
	}()
	if err := s.start(ctx); err != nil {
		return err
	}
	if err := s.setup(ctx); err != nil {
		return err
	}
	s.drive(ctx)
	s.settleRuns(ctx)
	r := s.check(ctx)
	s.shutdown()
	r.orphans += s.leftoverProcesses()
	s.print(r)
	if r.failed() {
		if !o.keep {
			fmt.Printf("soak: logs kept in %s\n", root)
			o.keep = true
		}
		return fmt.Errorf("the soak found problems")
	}
	return nil
}
