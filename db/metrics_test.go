package db_test

import (
	"context"
	"testing"

	"berth/db"
)

// TestMetricCounts: one statement returns every status (zero-filled), River's jobs by kind and
// state, and the stalest active lease's heartbeat age.
func TestMetricCounts(t *testing.T) {
	t.Parallel()
	w := newRunWorld(t)
	ctx := context.Background()
	if _, err := w.pool.Exec(ctx, `INSERT INTO runs (company_id, task_id, command, status) VALUES ($1, $2, 'true', 'failed'), ($1, $2, 'true', 'failed')`,
		w.companyID, w.task); err != nil {
		t.Fatal(err)
	}
	if _, err := w.pool.Exec(ctx, `INSERT INTO river_job (kind, args, state, max_attempts, queue) VALUES ('probe', '{}', 'available', 1, 'default')`); err != nil {
		t.Fatal(err)
	}
	counts, err := db.MetricCounts(ctx, w.pool)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, m := range counts {
		got[m.Series+"/"+m.Label1+"/"+m.Label2] = m.Value
	}
	want := map[string]float64{
		"runs/failed/": 2, "runs/queued/": 0, "runs/timed_out/": 0, "leases/active/": 0, "leases/failed/": 0,
		"jobs/probe/available": 1, "runtime_services/running/healthy": 0, "lease_heartbeat_age//": 0,
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v; all: %v", k, g, ok, v, got)
		}
	}
}
