package main

import (
	"context"
	"net/http"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

// BenchmarkNodesRunsPerSecond measures runs/s end to end, admission through the web node to
// finalize settled, for `true` in a shared workspace, with 1 and then 2 `berth worker` nodes on
// the same database (a fresh one each; every node a process of its own, as in production). It
// admits BERTH_BENCH_NODE_RUNS runs (default 60) from 8 concurrent clients and reports both
// rates and their ratio. On this 2-core machine the database, the web node and the workers share
// the same cores, which bounds the ratio (docs/scaling.md "Figures").
func BenchmarkNodesRunsPerSecond(b *testing.B) {
	runs := 60
	if v, err := strconv.Atoi(os.Getenv("BERTH_BENCH_NODE_RUNS")); err == nil && v > 0 {
		runs = v
	}
	rates := map[int]float64{}
	for i := 0; i < b.N; i++ {
		for _, workers := range []int{1, 2} {
			rates[workers] = nodesThroughput(b, workers, runs)
		}
	}
	b.ReportMetric(rates[1], "runs/s-1node")
	b.ReportMetric(rates[2], "runs/s-2nodes")
	b.ReportMetric(rates[2]/rates[1], "ratio")
}

// nodesThroughput starts a cluster with workers worker nodes and returns the runs/s of runs runs.
func nodesThroughput(b *testing.B, workers, runs int) float64 {
	b.StopTimer()
	c := newNodeCluster(b)
	c.startNodes(workers, "20")
	if _, err := c.pool.Exec(context.Background(),
		`UPDATE projects SET execution_policy = execution_policy || '{"default_mode":"shared"}'`); err != nil {
		b.Fatal(err)
	}
	tasks := make([]string, runs)
	for i := range tasks {
		tasks[i], _ = c.task("true")
	}
	ids := make([]string, runs)
	next := make(chan int)
	b.StartTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range next {
				var out struct {
					ID string `json:"id"`
				}
				if code := c.api("POST", "/api/tasks/"+tasks[i]+"/runs", c.token, nil, &out); code != http.StatusAccepted {
					b.Errorf("admit: %d", code)
					return
				}
				ids[i] = out.ID
			}
		})
	}
	for i := range runs {
		next <- i
	}
	close(next)
	wg.Wait()
	c.waitFor("every run to settle", 5*time.Minute, func() bool {
		return c.count(`SELECT count(*) FROM runs r JOIN execution_workspaces w ON w.id = r.execution_workspace_id
			WHERE r.status IN ('succeeded', 'failed', 'cancelled', 'timed_out') AND w.finalize_state = 'settled'`) == runs
	})
	elapsed := time.Since(start)
	b.StopTimer()
	if n := c.count(`SELECT count(*) FROM runs WHERE status = 'succeeded'`); n != runs {
		b.Fatalf("%d of %d runs succeeded", n, runs)
	}
	if workers == 2 && c.count(`SELECT count(DISTINCT node_id) FROM runs`) != 2 {
		b.Logf("only one worker took runs")
	}
	c.stopAll() // the next cluster gets the cores to itself
	return float64(runs) / elapsed.Seconds()
}
