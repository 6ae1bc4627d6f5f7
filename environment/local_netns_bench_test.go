package environment

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"testing"
	"time"

	"berth/environment/netns"
)

// BenchmarkJailStartNetns prices a workspace's own network namespace (DESIGN §15, issue 20):
// Berth's jailed Exec of `true` on the local profile on the host's network (as before the
// namespace), in a namespace of a new workspace each time (taken from the pool, its API bridge
// and proxies set up, ended after the command), and in the namespace of a workspace whose other
// jail holds it already (a run beside its service), alternating the three in one run. It reports
// each p50 and what the namespace adds (goal: ≤ +2 ms p50).
func BenchmarkJailStartNetns(b *testing.B) {
	if !netns.Available() {
		b.Skip("network namespaces need root")
	}
	api, _ := url.Parse("http://127.0.0.1:1")
	nets, err := netns.NewNetworks(netns.Serve(api, nil))
	if err != nil {
		b.Fatal(err)
	}
	defer nets.Close()
	f := newJailFixture(b)
	host := f.d
	own, err := newLocal(Config{Driver: DriverLocal}, Options{Jail: &testJail, DataDir: f.data,
		Masks: []string{f.data, "/root"}, Home: f.home, Networks: nets})
	if err != nil {
		b.Fatal(err)
	}
	_, release, err := nets.Acquire("held")
	if err != nil {
		b.Fatal(err)
	}
	defer release()
	run := func(d *local, key string) time.Duration {
		start := time.Now()
		res, err := d.Exec(context.Background(), ExecRequest{Command: "true", Dir: f.ws, Tag: testTag(), Home: f.home, Network: key})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("jailed true (network %q): %+v %v", key, res, err)
		}
		return time.Since(start)
	}
	var onHost, fresh, held []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		onHost = append(onHost, run(host, ""))
		fresh = append(fresh, run(own, fmt.Sprintf("ws-%d", i)))
		held = append(held, run(own, "held"))
	}
	b.StopTimer()
	p50 := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	h, fr, he := p50(onHost), p50(fresh), p50(held)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(h), "host-net-p50-ms")
	b.ReportMetric(ms(fr), "new-netns-p50-ms")
	b.ReportMetric(ms(he), "held-netns-p50-ms")
	b.ReportMetric(ms(fr-h), "added-new-p50-ms")
	b.ReportMetric(ms(he-h), "added-held-p50-ms")
}
