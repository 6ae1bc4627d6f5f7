package jobs

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"berth/db"
	"berth/jobs/executing"
)

// TestRunLogLinesCarryRunIDs: a line about a run (here the orphan sweep's) carries run_id,
// task_id and company_id, whether the logger had the run or only its id.
func TestRunLogLinesCarryRunIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newSweepWorld(t)
	e := executing.New("n1")
	if err := e.Claim(ctx, w.pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	stale := w.run(db.RunRunning, "n2", 5*time.Minute)
	w.job(ExecuteRunArgs{RunID: stale}, "n2@x", 5*time.Minute)
	run, err := db.RunForJob(ctx, w.pool, stale)
	if err != nil {
		t.Fatal(err)
	}

	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	if err := SweepOrphans(ctx, Deps{Pool: w.pool, Log: log, NodeID: "n1", Executing: e}); err != nil {
		t.Fatal(err)
	}
	runLogByID(ctx, log, w.pool, stale).Info("by id")
	runLogByID(ctx, log, w.pool, "6f0d3a52-7a0f-4e47-9d43-00000000dead").Info("unknown run")

	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("not JSON: %q", line)
		}
		msg, _ := rec["msg"].(string)
		seen[msg] = true
		switch msg {
		case "run orphaned", "by id":
			if rec["run_id"] != run.ID || rec["task_id"] != run.TaskID || rec["company_id"] != run.CompanyID || run.TaskID == "" {
				t.Errorf("%s: %q lacks the run's ids (%s %s %s)", msg, line, run.ID, run.TaskID, run.CompanyID)
			}
		case "unknown run":
			if rec["run_id"] != "6f0d3a52-7a0f-4e47-9d43-00000000dead" {
				t.Errorf("unknown run: %q", line)
			}
		}
	}
	if !seen["run orphaned"] || !seen["by id"] || !seen["unknown run"] {
		t.Fatalf("log lines: %s", buf.String())
	}
}

// recorder is an Observer that keeps its observations.
type recorder struct{ got []float64 }

func (r *recorder) Observe(v float64) { r.got = append(r.got, v) }

// TestRunStarted: a starting run is observed from its creation to its start, and its line
// carries its ids; without a start time (or without an observer) nothing is observed.
func TestRunStarted(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	rec := &recorder{}
	w := runWorker{deps: Deps{Log: slog.New(slog.NewJSONHandler(&buf, nil)), Admission: rec, NodeID: "n1"}}
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	start := created.Add(1500 * time.Millisecond)
	run := db.Run{ID: "r1", TaskID: "t1", CompanyID: "c1", CreatedAt: created, StartedAt: &start}
	w.started(context.Background(), run)
	run.StartedAt = nil
	w.started(context.Background(), run)
	(runWorker{deps: Deps{Log: slog.New(slog.DiscardHandler)}}).started(context.Background(), run)
	if len(rec.got) != 1 || rec.got[0] != 1.5 {
		t.Fatalf("observations = %v, want [1.5]", rec.got)
	}
	var line map[string]any
	if err := json.Unmarshal([]byte(strings.SplitN(buf.String(), "\n", 2)[0]), &line); err != nil {
		t.Fatal(err)
	}
	if line["msg"] != "run started" || line["run_id"] != "r1" || line["task_id"] != "t1" || line["company_id"] != "c1" || line["node"] != "n1" {
		t.Fatalf("line = %v", line)
	}
}
