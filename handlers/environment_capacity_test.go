package handlers

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// TestEnvironmentCapacityBoundsAttempts: an environment with max_parallel_runs 1 (set through
// the API, refused out of range) runs three attempts one at a time — never two live leases on it
// — and all three still finish; the rest waited in the queue. Real git, PostgreSQL, River, jail.
func TestEnvironmentCapacityBoundsAttempts(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	path := "/api/environments/" + runEnvEnvironment
	for _, bad := range []any{-1, 1001, "two"} {
		if code, out := re.call(re.r.Admin, http.MethodPatch, path, map[string]any{"config": map[string]any{"max_parallel_runs": bad}}); code != http.StatusUnprocessableEntity {
			t.Fatalf("max_parallel_runs %v = %d %v, want 422", bad, code, out)
		}
	}
	if code, out := re.call(re.r.Admin, http.MethodPatch, path, map[string]any{"config": map[string]any{"max_parallel_runs": 1}}); code != http.StatusOK {
		t.Fatalf("set max_parallel_runs = %d %v", code, out)
	}

	task := re.task(`sleep 2; echo "$BERTH_RUN_ID" > "out-$BERTH_RUN_ID.txt"`)
	if code, g := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/attempts", map[string]any{"count": 3}); code != http.StatusAccepted {
		t.Fatalf("start attempts = %d %v", code, g)
	}
	most, seen := 0, 0
	deadline := time.Now().Add(150 * time.Second)
	for {
		var live int
		if err := re.pool.QueryRow(context.Background(), `SELECT count(*) FROM environment_leases
			WHERE environment_id = $1 AND status IN ('acquiring', 'active', 'releasing')`, runEnvEnvironment).Scan(&live); err != nil {
			t.Fatal(err)
		}
		most = max(most, live)
		if live > 0 {
			seen++
		}
		if g := re.attemptsOf(task.ID); g["status"] == "sealed" {
			for _, it := range items(g) {
				if it["status"] != "succeeded" {
					t.Fatalf("attempt = %v", it)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the attempts did not all finish: %v", re.attemptsOf(task.ID))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if most != 1 || seen == 0 {
		t.Fatalf("at most %d live leases at once on an environment of capacity 1 (seen live %d times)", most, seen)
	}
}
