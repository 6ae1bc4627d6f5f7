package handlers

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// BenchmarkAttemptsParallel is the wall time of 4 attempts in parallel (one group: 4 worktrees,
// 4 leases, up to the River worker count at once) against 4 sequential runs of the same command
// on the same kind of task (admission to settled finalize, each waited for before the next),
// for a command that waits (sleep 1) and one that computes (a shell loop, about 0.5 s of one
// core). ratio = sequential / parallel: above 1 is the gain. On a 2-core machine the waiting
// command is bounded by Berth's own per-run work (realize under the source lock, commit,
// receipt); the computing one by the 2 cores.
func BenchmarkAttemptsParallel(b *testing.B) {
	re := setupRuns(b)
	re.workspaceWith("")
	ctx := context.Background()
	poll := func(cond func() bool) {
		deadline := time.Now().Add(5 * time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				b.Fatal("timed out")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	settled := func(runID string) bool {
		var n int
		_ = re.pool.QueryRow(ctx, `SELECT count(*) FROM runs r JOIN execution_workspaces w ON w.id = r.execution_workspace_id
			WHERE r.id = $1 AND r.status NOT IN ('queued', 'preparing', 'running') AND w.finalize_state = 'settled'`, runID).Scan(&n)
		return n == 1
	}
	for _, c := range []struct{ name, cmd string }{
		{"sleep", `sleep 1; echo done > "out-$BERTH_RUN_ID.txt"`},
		{"cpu", `i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done; echo $i > "out-$BERTH_RUN_ID.txt"`},
	} {
		b.Run(c.name, func(b *testing.B) {
			var seq, par time.Duration
			for i := 0; i < b.N; i++ {
				task := re.task(c.cmd)
				start := time.Now()
				for range 4 {
					id := re.start(task.ID, nil)
					poll(func() bool { return settled(id) })
				}
				seq += time.Since(start)

				task = re.task(c.cmd)
				start = time.Now()
				code, out := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/attempts", map[string]any{"count": 4})
				if code != http.StatusAccepted {
					b.Fatalf("attempts = %d %v", code, out)
				}
				poll(func() bool {
					_, g := re.call(re.r.Viewer, http.MethodGet, "/api/tasks/"+task.ID+"/attempts", nil)
					return g["status"] == "sealed"
				})
				par += time.Since(start)
			}
			s, p := seq.Seconds()/float64(b.N), par.Seconds()/float64(b.N)
			b.ReportMetric(s, "sequential-s")
			b.ReportMetric(p, "parallel-s")
			b.ReportMetric(s/p, "ratio")
		})
	}
}
