package handlers

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"berth/handlers/live"
)

// benchSSEClients is how many SSE streams the fan-out benchmark holds open
// (BERTH_BENCH_SSE_CLIENTS, default 200).
func benchSSEClients() int {
	if n, err := strconv.Atoi(os.Getenv("BERTH_BENCH_SSE_CLIENTS")); err == nil && n > 0 {
		return n
	}
	return 200
}

// BenchmarkSSEFanout measures, with benchSSEClients streams of run page viewers connected to one
// node: the time from a run's status change being committed (just before COMMIT) to its event
// arriving at each stream (p50, p99 over every stream and change: b.N changes), and what those
// streams cost while nothing changes (HTTP requests per second and bytes per second the server
// sends, over 5 s).
func BenchmarkSSEFanout(b *testing.B) {
	e := setupLive(b)
	ctx := context.Background()
	var runID string
	if err := e.pool.QueryRow(ctx, `INSERT INTO runs (company_id) VALUES ($1) RETURNING id`, e.r.A.ID).Scan(&runID); err != nil {
		b.Fatal(err)
	}
	// Count every request the streams' server receives.
	var requests atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		e.srv.ServeHTTP(w, r)
	}))
	b.Cleanup(ts.Close)

	n := benchSSEClients()
	c := e.browser(e.r.Board)
	c.Transport = &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: n}
	type arrival struct{ at time.Time }
	arrivals := make(chan arrival, n*4)
	var bytes atomic.Int64
	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	b.Cleanup(func() { cancel(); wg.Wait() })
	for i := 0; i < n; i++ {
		req, _ := http.NewRequestWithContext(sctx, http.MethodGet, ts.URL+"/events?run="+runID, nil)
		resp, err := c.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			b.Fatalf("stream %d: %v %v", i, err, resp)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				line := sc.Text()
				bytes.Add(int64(len(line) + 1))
				if line == "event: run" {
					arrivals <- arrival{at: time.Now()}
				}
			}
		}()
	}
	deadline := time.Now().Add(30 * time.Second)
	for e.events.Subscribers() != n {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d streams subscribed", e.events.Subscribers(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}

	statuses := []string{"preparing", "queued"}
	lat := make([]time.Duration, 0, b.N*n)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `UPDATE runs SET status = $2 WHERE id = $1`, runID, statuses[i%2]); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
		timeout := time.After(10 * time.Second)
		for got := 0; got < n; got++ {
			select {
			case a := <-arrivals:
				lat = append(lat, a.at.Sub(start))
			case <-timeout:
				b.Fatalf("change %d: %d of %d streams got it within 10 s", i, got, n)
			}
		}
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(n), "clients")

	// Idle: nothing changes for 5 s.
	r0, b0 := requests.Load(), bytes.Load()
	const idle = 5 * time.Second
	time.Sleep(idle)
	b.ReportMetric(float64(requests.Load()-r0)/idle.Seconds(), "idle-req/s")
	b.ReportMetric(float64(bytes.Load()-b0)/idle.Seconds(), "idle-bytes/s")
	if d := e.events.Dropped(); d != 0 {
		b.Fatalf("%d streams dropped", d)
	}
}

// BenchmarkTaskPageLive is BenchmarkTaskPage with live pages on (an Events hub: the page carries
// its /events URL and cursor), to show the subscription costs the page nothing measurable.
func BenchmarkTaskPageLive(b *testing.B) {
	w, counter, taskID := benchTaskWorld(b)
	w.e.srv.events = live.New(0) // set before the first request
	client := w.e.browser(w.r.Board)
	req, _ := http.NewRequest(http.MethodGet, w.e.ts.URL+"/tasks/"+taskID, nil)
	resp, err := client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	var body strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		body.WriteString(sc.Text())
	}
	resp.Body.Close()
	if !strings.Contains(body.String(), `sse-connect="/events?after=`) {
		b.Fatal("the task page does not subscribe")
	}
	benchTaskGet(b, client, counter, w.e.ts.URL+"/tasks/"+taskID, http.Header{})
}
