package handlers

import (
	"net/http"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"
)

// reportLatency adds p50 and p99 of the per-iteration durations to the benchmark's output.
func reportLatency(b *testing.B, d []time.Duration) {
	b.Helper()
	if len(d) == 0 {
		return
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(d[len(d)*99/100].Microseconds())/1000, "p99-ms")
}

// BenchmarkLogin measures a full sign-in over loopback: rate-limit check, user lookup, argon2id
// verification, session renewal and the attempt and audit writes.
func BenchmarkLogin(b *testing.B) {
	e := setup(b)
	e.user("ada@example.com", "correct horse battery", false)
	form := url.Values{"email": {"ada@example.com"}, "password": {"correct horse battery"}}.Encode()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	durations := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		req, _ := http.NewRequest(http.MethodPost, e.ts.URL+"/login", strings.NewReader(form))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther {
			b.Fatalf("login = %d", resp.StatusCode)
		}
		durations = append(durations, time.Since(start))
	}
	b.StopTimer()
	reportLatency(b, durations)
}

// BenchmarkMeToken measures GET /api/me authenticated by a bearer token: token lookup, user,
// memberships and the JSON answer.
func BenchmarkMeToken(b *testing.B) {
	e := setup(b)
	u := e.user("ada@example.com", "correct horse battery", false)
	co := e.company("Acme", "acme")
	e.member(co.ID, u.ID, "board")
	tok := e.token(u.ID)
	client := &http.Client{}
	durations := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		req, _ := http.NewRequest(http.MethodGet, e.ts.URL+"/api/me", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("/api/me = %d", resp.StatusCode)
		}
		durations = append(durations, time.Since(start))
	}
	b.StopTimer()
	reportLatency(b, durations)
}
