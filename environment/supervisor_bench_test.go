package environment

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"
)

// benchServer is a Go HTTP server's source: it listens on $PORT and answers 200.
const benchServer = `package main

import (
	"net/http"
	"os"
)

func main() {
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })
	http.ListenAndServe("127.0.0.1:"+os.Getenv("PORT"), nil)
}
`

// BenchmarkServiceStartToHealthy: a Go HTTP server binary started as a service (jailed, port
// reserved, readiness polled) until healthy, against the same binary's own startup (exec until
// its first answer, polled every 0.2 ms, no jail). Goal: start→healthy <= its startup + 20 ms.
func BenchmarkServiceStartToHealthy(b *testing.B) {
	f := newServiceFixture(b)
	src := filepath.Join(f.data, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(benchServer), 0o644); err != nil {
		b.Fatal(err)
	}
	bin := filepath.Join(f.root, "server")
	build := exec.Command("go", "build", "-o", bin, "main.go")
	build.Dir = src
	build.Env = append(os.Environ(), "GO111MODULE=off", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("go build: %v %s", err, out)
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		b.Fatal(err)
	}
	own := func() time.Duration {
		port, _ := ReservePort(0, func(int) bool { return false })
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), "PORT="+strconv.Itoa(port))
		t0 := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		for time.Since(t0) < 5*time.Second {
			if resp, err := c.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/"); err == nil {
				resp.Body.Close()
				return time.Since(t0)
			}
			time.Sleep(200 * time.Microsecond)
		}
		b.Fatal("the server did not answer within 5 s")
		return 0
	}
	ctx := context.Background()
	var owns, svcs []time.Duration
	i := 0
	for b.Loop() {
		owns = append(owns, own())
		i++
		id := "svc-bench-" + strconv.Itoa(os.Getpid()) + "-" + strconv.Itoa(i)
		sp := f.spec(b, id, "exec ./server", 10*time.Second)
		t0 := time.Now()
		if _, err := f.sup.Start(ctx, sp); err != nil {
			b.Fatal(err)
		}
		svcs = append(svcs, time.Since(t0))
		if err := f.sup.Stop(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(owns)
	slices.Sort(svcs)
	o, s := owns[len(owns)/2], svcs[len(svcs)/2]
	b.ReportMetric(float64(o)/1e6, "own-startup-p50-ms")
	b.ReportMetric(float64(s)/1e6, "start-to-healthy-p50-ms")
	b.ReportMetric(float64(s-o)/1e6, "added-p50-ms")
}
