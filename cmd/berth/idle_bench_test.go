package main

import (
	"bufio"
	"context"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"berth/db"
)

// BenchmarkIdleServer is the idle cost of a server (issue 21): a real `berth serve` process with
// one finished run is left alone for BERTH_IDLE_SECONDS (default 60) while a browser-like client
// holds an SSE stream open, and the benchmark reports the database transactions per second of
// its database (pg_stat_database xact_commit + xact_rollback; the measuring pool adds two) and
// the process's CPU as a percentage of one core (utime + stime from /proc/<pid>/stat). Targets:
// ≤ 1 query/s and ≤ 0.5 % of one core. Run it with -benchtime 1x; BERTH_IDLE_TRACE=1 also logs
// every statement the server sent in the window (traceStatements).
func BenchmarkIdleServer(b *testing.B) {
	idle := 60 * time.Second
	if v, err := strconv.Atoi(os.Getenv("BERTH_IDLE_SECONDS")); err == nil && v > 0 {
		idle = time.Duration(v) * time.Second
	}
	for range b.N {
		w := newCrashWorld(b, "")
		trace := traceStatements(b, w)
		addr := freeAddr(b)
		cmd := berthProc(b, map[string]string{"DATABASE_URL": w.conn, "BERTH_DATA_DIR": w.dataDir, "BERTH_ADDR": addr,
			"BERTH_LOG_LEVEL": "warn", "BERTH_ADMIN_EMAIL": "root@example.com", "BERTH_ADMIN_PASSWORD": "a long admin password"}, "", "serve")
		out := &syncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		b.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		})
		base := "http://" + addr
		waitHealthy(b, base, time.Minute)

		_, runID := w.admit("echo idle-bench")
		waitUntil(b, "the run to finish and settle", 2*time.Minute, func() bool {
			r := runRow(b, w.pool, runID)
			var fin string
			_ = w.pool.QueryRow(context.Background(), `SELECT finalize_state FROM execution_workspaces WHERE id = $1`,
				r.ExecutionWorkspaceID).Scan(&fin)
			return r.Status == db.RunSucceeded && fin == "settled"
		})

		// A page left open: the SSE stream of a signed-in browser.
		stop := holdSSE(b, base)
		time.Sleep(12 * time.Second) // the run's last jobs drain, and an idle backend flushes its stats within 10 s
		b.ResetTimer()
		tx0, cpu0, t0 := dbTransactions(b, w), processCPU(b, cmd.Process.Pid), time.Now()
		tables0 := tableScans(b, w)
		time.Sleep(idle)
		trace(t0, time.Now())
		tx1, cpu1, t1 := dbTransactions(b, w), processCPU(b, cmd.Process.Pid), time.Now()
		for name, n := range tableScans(b, w) {
			if d := n - tables0[name]; d > 0 {
				b.Logf("idle: %-28s %5d scans and writes", name, d)
			}
		}
		b.StopTimer()
		events := stop()
		secs := t1.Sub(t0).Seconds()
		b.ReportMetric(float64(tx1-tx0-2)/secs, "queries/s")
		b.ReportMetric(100*(cpu1-cpu0)/secs, "%core")
		b.ReportMetric(float64(events), "sse-beats")
		if events < 0 || (idle >= 30*time.Second && events == 0) {
			b.Fatalf("the SSE stream was not live while idle (%d heartbeats); server output:\n%s", events, out.String())
		}
	}
}

// dbTransactions is the world database's committed and rolled-back transactions so far.
func dbTransactions(b *testing.B, w *crashWorld) int64 {
	b.Helper()
	time.Sleep(1100 * time.Millisecond) // PostgreSQL flushes backend stats at most once a second
	var n int64
	if err := w.pool.QueryRow(context.Background(), `SELECT xact_commit + xact_rollback FROM pg_stat_database
		WHERE datname = current_database()`).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// tableScans is, per table of the world database, its scans plus rows written so far: which
// tables an idle server still touches (logged, for finding what polls).
func tableScans(b *testing.B, w *crashWorld) map[string]int64 {
	b.Helper()
	rows, err := w.pool.Query(context.Background(), `SELECT relname, coalesce(seq_scan, 0) + coalesce(idx_scan, 0) +
		n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables`)
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			b.Fatal(err)
		}
		out[name] = n
	}
	return out
}

// processCPU is the user plus system CPU seconds process pid has used.
func processCPU(b *testing.B, pid int) float64 {
	b.Helper()
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	s := string(raw)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // fields from 3 (state) on
	ut, _ := strconv.ParseFloat(fields[11], 64)                   // field 14 utime
	st, _ := strconv.ParseFloat(fields[12], 64)                   // field 15 stime
	return (ut + st) / 100                                        // USER_HZ is 100 on Linux
}

// holdSSE signs in as the admin and keeps /events open; stop closes it and answers how many
// heartbeats and events arrived (-1 when the stream ended by itself): the page stayed live.
func holdSSE(b *testing.B, base string) (stop func() int) {
	b.Helper()
	c := signedIn(b, base)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/events", nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		cancel()
		b.Fatalf("SSE: %v %v", resp, err)
	}
	counted := make(chan int, 1)
	go func() {
		n, sc := 0, bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), ": heartbeat") || strings.HasPrefix(sc.Text(), "event:") {
				n++
			}
		}
		if ctx.Err() == nil {
			n = -1
		}
		counted <- n
	}()
	return func() int {
		cancel()
		resp.Body.Close()
		return <-counted
	}
}

// signedIn is an HTTP client with the admin's session cookie.
func signedIn(b *testing.B, base string) *http.Client {
	b.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	resp, err := c.PostForm(base+"/login", url.Values{"email": {"root@example.com"}, "password": {"a long admin password"}})
	if err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("login = %d", resp.StatusCode)
	}
	return c
}
