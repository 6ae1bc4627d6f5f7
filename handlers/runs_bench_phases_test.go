package handlers

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// stampCommand is a run command whose first output is the time it started (seconds since the
// epoch), so admissionPhases can tell when the command really began, past started_at.
const stampCommand = "date +%s.%N"

// admissionPhases are the steps between admission and the command's start, in order, as the rows
// of a run record them (the run, its provision and execute_run jobs, its realize ledger step), all
// on the database clock; cmd is from started_at to the command's own first output (stampCommand),
// the same clock on this one machine.
var admissionPhases = []struct{ name, what string }{
	{"queue", "admission → provision picked up (the admission transaction's tail, River's notify and fetch)"},
	{"prep", "provision picked up → realize started (the run's, task's and project's rows, preparing)"},
	{"realize", "the realize ledger step (worktree, private git store, checkout in the git jail)"},
	{"lease", "realize ended → execute_run enqueued (workspace row, lease, setup command, enqueue)"},
	{"pickup", "execute_run enqueued → picked up"},
	{"start", "execute_run picked up → started_at (workspace, lease and driver reads, run token)"},
	{"cmd", "started_at → the command's first output (git store, jail, hand-over, bwrap, sh)"},
}

// phaseP50s reads the phases of every run of the benchmark that started and returns the p50 of
// each, in the order of admissionPhases. A run without a realize step or a stamp is skipped.
func phaseP50s(b *testing.B, re *runEnv) []time.Duration {
	b.Helper()
	rows, err := re.pool.Query(context.Background(), `SELECT
		extract(epoch FROM p.attempted_at - r.created_at)::float8,
		extract(epoch FROM o.started_at - p.attempted_at)::float8,
		extract(epoch FROM o.finished_at - o.started_at)::float8,
		extract(epoch FROM e.created_at - o.finished_at)::float8,
		extract(epoch FROM e.attempted_at - e.created_at)::float8,
		extract(epoch FROM r.started_at - e.attempted_at)::float8,
		extract(epoch FROM r.started_at)::float8, r.log
		FROM runs r
		JOIN river_job p ON p.kind = 'provision' AND p.args->>'run_id' = r.id::text
		JOIN river_job e ON e.kind = 'execute_run' AND e.args->>'run_id' = r.id::text
		JOIN workspace_operations o ON o.run_id = r.id AND o.phase = 'realize'
		WHERE r.started_at IS NOT NULL AND o.finished_at IS NOT NULL`)
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	cols := make([][]time.Duration, len(admissionPhases))
	for rows.Next() {
		v := make([]float64, len(admissionPhases)) // the last is started_at, then the command's stamp
		var log []byte
		if err := rows.Scan(&v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &log); err != nil {
			b.Fatal(err)
		}
		line, _, _ := bytes.Cut(log, []byte("\n"))
		stamp, err := strconv.ParseFloat(string(bytes.TrimSpace(line)), 64)
		if err != nil {
			continue
		}
		v[6] = stamp - v[6]
		for i, s := range v {
			cols[i] = append(cols[i], time.Duration(s*float64(time.Second)))
		}
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	p50 := make([]time.Duration, len(cols))
	for i, c := range cols {
		if len(c) == 0 {
			b.Fatalf("no run recorded phase %s", admissionPhases[i].name)
		}
		slices.Sort(c)
		p50[i] = c[len(c)/2]
	}
	return p50
}

// reportPhases reports the p50 of each phase as <name>-p50-ms and returns them as one line
// ("queue 5.1ms, prep 3ms, …") for a failure message, which a benchmark's metrics never reach.
func reportPhases(b *testing.B, re *runEnv) string {
	b.Helper()
	var line []string
	for i, d := range phaseP50s(b, re) {
		b.ReportMetric(float64(d.Microseconds())/1000, admissionPhases[i].name+"-p50-ms")
		line = append(line, admissionPhases[i].name+" "+d.Round(100*time.Microsecond).String())
	}
	return strings.Join(line, ", ")
}
