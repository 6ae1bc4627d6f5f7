package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// traceStatements, with BERTH_IDLE_TRACE=1, turns on PostgreSQL's log of every statement for
// w's database (log_min_duration_statement = 0, which also logs what log_statement does not:
// pings, empty transactions) and returns a report that logs, for a window, each statement the
// server sent with its count per minute: what an idle server still asks (docs/jobs.md "Idle").
// It reads the log of the test cluster dbtest starts; with BERTH_TEST_DATABASE_URL it says it
// cannot. Set it before the server connects: the setting applies to new sessions.
func traceStatements(b *testing.B, w *crashWorld) (report func(from, to time.Time)) {
	b.Helper()
	if os.Getenv("BERTH_IDLE_TRACE") == "" {
		return func(time.Time, time.Time) {}
	}
	ctx := context.Background()
	if _, err := w.pool.Exec(ctx, `DO $$ BEGIN
		EXECUTE format('ALTER DATABASE %I SET log_min_duration_statement = 0', current_database()); END $$`); err != nil {
		b.Fatal(err)
	}
	var data string
	if err := w.pool.QueryRow(ctx, `SHOW data_directory`).Scan(&data); err != nil {
		b.Fatal(err)
	}
	logPath := filepath.Join(filepath.Dir(data), "postgres.log") // db/pgembed's layout
	return func(from, to time.Time) {
		raw, err := os.ReadFile(logPath)
		if err != nil {
			b.Logf("trace: the cluster's log is not readable here (%v)", err)
			return
		}
		counts := statementCounts(raw, from, to)
		keys := make([]string, 0, len(counts))
		for k := range counts {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool {
			return counts[keys[i]] > counts[keys[j]] || counts[keys[i]] == counts[keys[j]] && keys[i] < keys[j]
		})
		perMin := 60 / to.Sub(from).Seconds()
		for _, k := range keys {
			b.Logf("trace: %5.1f/min  %s", float64(counts[k])*perMin, k)
		}
	}
}

// logLine is a statement's line in the server log: its time, and a simple-protocol statement or
// an extended-protocol execute (its bind and parse are the same query's, not counted).
var logLine = regexp.MustCompile(`^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \S+) \[\d+\] LOG:  duration: [\d.]+ ms  (statement|execute [^:]+): (.*)$`)

// statementCounts counts the statements logged between from and to, by their first 70 bytes.
func statementCounts(raw []byte, from, to time.Time) map[string]int {
	counts := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		m := logLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		at, err := time.Parse("2006-01-02 15:04:05.000 MST", m[1])
		if err != nil || at.Before(from) || at.After(to) {
			continue
		}
		text := strings.Join(strings.Fields(m[3]), " ")
		if len(text) > 70 {
			text = text[:70]
		}
		counts[text]++
	}
	return counts
}
