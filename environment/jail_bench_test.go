package environment

import (
	"context"
	"os/exec"
	"sort"
	"testing"
	"time"
)

// BenchmarkJailStart compares a bare `bwrap --unshare-all --ro-bind / / true` with Berth's whole
// jailed Exec of `true` on the local profile (argv, ownership hand-over and back, the jail with its
// masks and binds, the wait, the sweep for leftovers), alternating the two in one run. It reports
// both p50s and their ratio (goal: Berth ≤ 1.5× bare).
func BenchmarkJailStart(b *testing.B) {
	f := newJailFixture(b)
	bare := make([]time.Duration, 0, b.N)
	berth := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if out, err := exec.Command(testJail.Bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true").CombinedOutput(); err != nil {
			b.Fatalf("bare bwrap: %v %s", err, out)
		}
		bare = append(bare, time.Since(start))
		start = time.Now()
		res, err := f.d.Exec(context.Background(), ExecRequest{Command: "true", Dir: f.ws, Tag: testTag(), Home: f.home})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("jailed true: %+v %v", res, err)
		}
		berth = append(berth, time.Since(start))
	}
	b.StopTimer()
	p50 := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	bp, jp := p50(bare), p50(berth)
	b.ReportMetric(float64(bp.Microseconds())/1000, "bare-p50-ms")
	b.ReportMetric(float64(jp.Microseconds())/1000, "berth-p50-ms")
	b.ReportMetric(float64(jp)/float64(bp), "ratio-p50")
}
