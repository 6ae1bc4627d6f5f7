package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"berth/environment"
	"berth/environment/plugincheck"
	"berth/environment/plugincheck/plugintest"
)

// BenchmarkPodmanAdmissionToStart measures, per lease, Berth's path from acquiring an instance
// to the start of the run's command (Acquire: the container from the image layer; Realize: the
// capsule verified and copied in; Exec of `true` until its started event), against a bare
// `podman run --rm --rootfs IMAGE:O /bin/sh -c true` on the same service, alternating the two.
func BenchmarkPodmanAdmissionToStart(b *testing.B) {
	ctx := context.Background()
	runAs, err := environment.PluginRunAs(ctx)
	if err != nil {
		b.Fatal(err)
	}
	sock := plugintest.Podman(b, runAs)
	dir := plugintest.Dir(b)
	sum := plugintest.Build(b, "./cmd/berth-driver-podman", dir, "berth-driver-podman")
	image := filepath.Join(plugintest.Dir(b), "image")
	if err := plugincheck.MinimalImage(image); err != nil {
		b.Fatal(err)
	}
	host := environment.NewPluginHost(environment.PluginHostOptions{Dir: dir, StateDir: plugintest.Dir(b), RunAs: runAs})
	defer host.Close()
	settings, _ := json.Marshal(map[string]any{"socket": sock})
	drv, err := environment.New(environment.Config{Driver: environment.DriverPlugin, Plugin: environment.PluginConfig{
		Name: "berth-driver-podman", SHA256: sum, Settings: settings, TimeoutS: 600}},
		environment.Options{Plugins: host, ImageDir: image, ImageDigest: "sha256:" + sum, Grace: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	ws := plugintest.Dir(b)
	if err := os.WriteFile(filepath.Join(ws, "README"), []byte("bench\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	// The first lease also sends the image; it is not measured.
	lease := func(i int) (time.Duration, environment.Instance) {
		t0 := time.Now()
		inst, err := drv.Acquire(ctx, environment.AcquireRequest{Key: fmt.Sprintf("bench-%d:1", i), Tag: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		real, err := drv.Realize(ctx, environment.RealizeRequest{Instance: inst, WorkspaceRef: "ws-bench", HostPath: ws})
		if err != nil {
			b.Fatal(err)
		}
		var started time.Duration
		res, err := drv.Exec(ctx, environment.ExecRequest{Command: "true", Dir: real.Root, Tag: fmt.Sprintf("bench-%d", i),
			OnStart: func(int) { started = time.Since(t0) }})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec: %+v %v", res, err)
		}
		return started, inst
	}
	_, warm := lease(-1)
	_ = drv.Release(ctx, warm)
	rootfs := filepath.Join(image)
	berth := make([]time.Duration, 0, b.N)
	bare := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d, inst := lease(i)
		berth = append(berth, d)
		b.StopTimer()
		_ = drv.Release(ctx, inst)
		b.StartTimer()
		t0 := time.Now()
		args := append([]string{"--remote", "--url", "unix://" + sock, "run", "--rm", "--network", "none"}, ulimits()...)
		args = append(args, "--rootfs", rootfs+":O", "/bin/sh", "-c", "true")
		if out, err := exec.Command("podman", args...).CombinedOutput(); err != nil {
			b.Fatalf("bare podman run: %v %s", err, out)
		}
		bare = append(bare, time.Since(t0))
	}
	b.StopTimer()
	p50 := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	bp, pp := p50(bare), p50(berth)
	b.ReportMetric(float64(pp.Milliseconds()), "berth-p50-ms")
	b.ReportMetric(float64(bp.Milliseconds()), "bare-run-p50-ms")
	b.ReportMetric(float64(pp)/float64(bp), "ratio-p50")
}
