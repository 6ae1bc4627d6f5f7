package main

import (
	"context"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// BenchmarkNodesRunsPerSecond measures runs/s end to end, admission through the web node to
// finalize settled, with 1 and then 2 `berth worker` nodes on the same database (a fresh one
// each; every node a process of its own, as in production), BERTH_BENCH_NODE_RUNS runs (default
// 60) admitted from 8 concurrent clients, in two workloads:
//   - cpu: `true` in a shared workspace, 20 workers a node. On this 2-core machine the database,
//     the web node and the workers share the same cores, which bounds the ratio;
//   - sleep: `sleep 0.5`, 4 workers a node, twice the runs, admitted at 20 a second (more than
//     two such nodes run, so every node stays busy, and the admissions do not crowd the 2 cores
//     in one burst): the cores are not the limit, and the ratio is the coordination cost of the
//     second node (issue 26: ≥ 1.8x).
//
// docs/scaling.md "Figures".
func BenchmarkNodesRunsPerSecond(b *testing.B) {
	runs := 60
	if v, err := strconv.Atoi(os.Getenv("BERTH_BENCH_NODE_RUNS")); err == nil && v > 0 {
		runs = v
	}
	for _, wl := range []nodeWorkload{
		{name: "cpu", command: "true", maxWorkers: "20", runs: runs},
		{name: "sleep", command: "sleep 0.5", maxWorkers: "4", runs: 2 * runs, pace: 50 * time.Millisecond},
	} {
		b.Run(wl.name, func(b *testing.B) {
			rates := map[int]float64{}
			for i := 0; i < b.N; i++ {
				for _, workers := range []int{1, 2} {
					rates[workers] = nodesThroughput(b, workers, wl)
				}
			}
			b.ReportMetric(rates[1], "runs/s-1node")
			b.ReportMetric(rates[2], "runs/s-2nodes")
			b.ReportMetric(rates[2]/rates[1], "ratio")
		})
	}
}

// nodeWorkload is what BenchmarkNodesRunsPerSecond admits: runs runs of command, to nodes of
// maxWorkers workers each, one every pace (0: as fast as 8 clients can).
type nodeWorkload struct {
	name, command, maxWorkers string
	runs                      int
	pace                      time.Duration
}

// nodesThroughput starts a cluster with workers worker nodes and returns the runs/s of wl.
func nodesThroughput(b *testing.B, workers int, wl nodeWorkload) float64 {
	b.StopTimer()
	c := newNodeCluster(b)
	c.startNodes(workers, wl.maxWorkers)
	if _, err := c.pool.Exec(context.Background(),
		`UPDATE projects SET execution_policy = execution_policy || '{"default_mode":"shared"}'`); err != nil {
		b.Fatal(err)
	}
	runs := wl.runs
	tasks := make([]string, runs)
	for i := range tasks {
		tasks[i], _ = c.task(wl.command)
	}
	ids := make([]string, runs)
	admits := make([]time.Duration, runs)
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
				began := time.Now()
				if code := c.api("POST", "/api/tasks/"+tasks[i]+"/runs", c.token, nil, &out); code != http.StatusAccepted {
					b.Errorf("admit: %d", code)
					return
				}
				ids[i], admits[i] = out.ID, time.Since(began)
			}
		})
	}
	for i := range runs {
		next <- i
		if wl.pace > 0 {
			time.Sleep(time.Until(start.Add(time.Duration(i+1) * wl.pace)))
		}
	}
	close(next)
	wg.Wait()
	admitted := time.Since(start)
	c.waitFor("every run to settle", 5*time.Minute, func() bool {
		return c.count(`SELECT count(*) FROM runs r JOIN execution_workspaces w ON w.id = r.execution_workspace_id
			WHERE r.status IN ('succeeded', 'failed', 'cancelled', 'timed_out') AND w.finalize_state = 'settled'`) == runs
	})
	elapsed := time.Since(start)
	b.StopTimer()
	if n := c.count(`SELECT count(*) FROM runs WHERE status = 'succeeded'`); n != runs {
		b.Fatalf("%d of %d runs succeeded", n, runs)
	}
	if workers == 2 {
		b.Logf("2 nodes: runs per node %d and %d", c.count(`SELECT count(*) FROM runs WHERE node_id = (SELECT min(node_id) FROM runs)`),
			c.count(`SELECT count(*) FROM runs WHERE node_id = (SELECT max(node_id) FROM runs)`))
	}
	slices.Sort(admits)
	b.Logf("%d node(s): %d runs admitted in %v, POST p50 %v p90 %v; all settled after %v", workers, runs,
		admitted.Round(time.Millisecond), admits[runs/2].Round(time.Millisecond), admits[runs*9/10].Round(time.Millisecond),
		elapsed.Round(time.Millisecond))
	c.logJobPhases(workers)
	c.stopAll() // the next cluster gets the cores to itself
	return float64(runs) / elapsed.Seconds()
}

// logJobPhases logs, per River job kind, the p50 and p90 wait (available → a worker took it)
// and work (taken → done) of this cluster's jobs, and per ledger phase its steps' p50 and p90:
// where a run's time went.
func (c *nodeCluster) logJobPhases(workers int) {
	rows, err := c.pool.Query(context.Background(), `SELECT kind, count(*),
		percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM attempted_at - scheduled_at)) * 1000,
		percentile_cont(0.9) WITHIN GROUP (ORDER BY extract(epoch FROM attempted_at - scheduled_at)) * 1000,
		percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finalized_at - attempted_at)) * 1000,
		percentile_cont(0.9) WITHIN GROUP (ORDER BY extract(epoch FROM finalized_at - attempted_at)) * 1000
		FROM river_job WHERE finalized_at IS NOT NULL AND attempted_at IS NOT NULL GROUP BY kind
		UNION ALL SELECT 'step ' || phase, count(*), 0, 0,
		percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at)) * 1000,
		percentile_cont(0.9) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at)) * 1000
		FROM workspace_operations WHERE finished_at IS NOT NULL GROUP BY phase ORDER BY 1`)
	if err != nil {
		c.t.Logf("job phases: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var kind string
		var n int
		var w50, w90, d50, d90 float64
		if err := rows.Scan(&kind, &n, &w50, &w90, &d50, &d90); err != nil {
			c.t.Logf("job phases: %v", err)
			return
		}
		c.t.Logf("%d node(s): %-16s %4d jobs, wait p50 %6.1f ms p90 %6.1f ms, work p50 %6.1f ms p90 %6.1f ms", workers, kind, n, w50, w90, d50, d90)
	}
}
