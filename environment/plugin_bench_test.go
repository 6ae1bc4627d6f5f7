package environment

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"
)

// BenchmarkPluginExec compares Exec of `true` through a plugin (the test plugin: gRPC over
// go-plugin, the stream of started/exited events, the plugin's own sh -c) with the in-tree local
// driver running the same `sh -c true` uncontained, and with a bare fork/exec of `sh -c true`,
// alternating all of them. overhead-p50-ms is plugin minus in-tree (goal ≤ 2 ms);
// protocol-p50-ms is plugin minus bare (what the plugin round trip itself costs, since the
// in-tree driver does more per command: its sweep for leftover processes). The jailed local p50
// is reported for scale.
func BenchmarkPluginExec(b *testing.B) {
	ctx := context.Background()
	dir, state := pluginDir(b), pluginDir(b)
	sum := benchPlugin(b, dir)
	runAs, err := PluginRunAs(ctx)
	if err != nil {
		b.Fatal(err)
	}
	host := NewPluginHost(PluginHostOptions{Dir: dir, StateDir: state, RunAs: runAs})
	defer host.Close()
	pd, err := New(Config{Driver: DriverPlugin, Plugin: PluginConfig{Name: "bench", SHA256: sum, Settings: []byte("{}"), TimeoutS: 60}},
		Options{Plugins: host})
	if err != nil {
		b.Fatal(err)
	}
	inst, err := pd.Acquire(ctx, AcquireRequest{Key: "bench:1", Tag: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer pd.Release(ctx, inst)
	ws := workDir(b)
	if err := os.WriteFile(filepath.Join(ws, "f"), []byte("x"), 0o644); err != nil {
		b.Fatal(err)
	}
	real, err := pd.Realize(ctx, RealizeRequest{Instance: inst, WorkspaceRef: "ws-bench", HostPath: ws})
	if err != nil {
		b.Fatal(err)
	}
	ld, err := New(Config{Driver: DriverLocal, Containment: ContainmentNone}, Options{})
	if err != nil {
		b.Fatal(err)
	}
	jf := newJailFixture(b)
	plug := make([]time.Duration, 0, b.N)
	intree := make([]time.Duration, 0, b.N)
	jailed := make([]time.Duration, 0, b.N)
	bare := make([]time.Duration, 0, b.N)
	run := func(d Driver, dir, home string, into *[]time.Duration) {
		t0 := time.Now()
		res, err := d.Exec(ctx, ExecRequest{Command: "true", Dir: dir, Tag: testTag(), Home: home})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec true: %+v %v", res, err)
		}
		*into = append(*into, time.Since(t0))
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		run(pd, real.Root, "", &plug)
		run(ld, ws, "", &intree)
		run(jf.d, jf.ws, jf.home, &jailed)
		t0 := time.Now()
		if err := exec.Command("/bin/sh", "-c", "true").Run(); err != nil {
			b.Fatal(err)
		}
		bare = append(bare, time.Since(t0))
	}
	b.StopTimer()
	p50 := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	pp, ip, jp, bp := p50(plug), p50(intree), p50(jailed), p50(bare)
	b.ReportMetric(float64(bp.Microseconds())/1000, "bare-p50-ms")
	b.ReportMetric(float64((pp-bp).Microseconds())/1000, "protocol-p50-ms")
	b.ReportMetric(float64(pp.Microseconds())/1000, "plugin-p50-ms")
	b.ReportMetric(float64(ip.Microseconds())/1000, "intree-p50-ms")
	b.ReportMetric(float64((pp-ip).Microseconds())/1000, "overhead-p50-ms")
	b.ReportMetric(float64(jp.Microseconds())/1000, "intree-jailed-p50-ms")
}

// benchPlugin builds the test plugin as dir/bench.
func benchPlugin(b *testing.B, dir string) string {
	b.Helper()
	return testPluginB(b, dir, "bench")
}
