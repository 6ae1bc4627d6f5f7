package handlers

import (
	"context"
	"testing"
	"time"

	"berth/db"
	"berth/jobs"
)

// TestRunWaitsForItsWorkspaceClose: a run admitted while its task's isolated workspace is closing
// waits in preparing (its provision snoozes; it does not fail realizing a worktree whose branch
// the closing one still holds), and once the close has finished it runs in a new workspace on
// the same task branch. Real git, PostgreSQL, River and the real close job.
func TestRunWaitsForItsWorkspaceClose(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	task := re.task(`echo "$BERTH_RUN_ID" >> runs.txt`)
	first := re.waitRun(re.start(task.ID, nil), "the first run's end", ended)
	if first["status"] != "succeeded" {
		t.Fatalf("first run = %v", first)
	}
	if fin, lease := re.settled(first); fin != "settled" || lease != "released" {
		t.Fatalf("first run: finalize %q, lease %q", fin, lease)
	}
	ctx := context.Background()
	wsID := first["execution_workspace_id"].(string)
	ws, err := db.ExecutionWorkspaceByID(ctx, re.pool, re.r.A.ID, wsID)
	if err != nil {
		t.Fatal(err)
	}
	// The close's first step, as a confirmed destructive close takes it (the branch has unmerged
	// work); its job comes later.
	if ws, err = db.BeginWorkspaceClose(ctx, re.pool, ws.ID, ws.Generation); err != nil {
		t.Fatal(err)
	}

	id := re.start(task.ID, nil)
	// Wait until its provision has been worked at least once, then it must still be waiting.
	deadline := time.Now().Add(60 * time.Second)
	for re.count(`SELECT count(*) FROM river_job WHERE kind = 'provision' AND args->>'run_id' = $1 AND attempted_at IS NOT NULL`, id) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the provision job was never worked")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, run := re.call(re.r.Viewer, "GET", "/api/runs/"+id, nil); code != 200 || run["status"] != "preparing" && run["status"] != "queued" {
		t.Fatalf("a run admitted during its workspace's close = %d %v, want it waiting", code, run)
	}

	if _, err := re.srv.jobs.Insert(ctx, jobs.CloseWorkspaceArgs{CompanyID: ws.CompanyID, WorkspaceID: ws.ID,
		Generation: ws.Generation, Rescue: true, Remove: true, EnvironmentID: runEnvEnvironment}, nil); err != nil {
		t.Fatal(err)
	}
	run := re.waitRun(id, "the end of the run that waited", ended)
	if run["status"] != "succeeded" || run["execution_workspace_id"] == wsID {
		closed, _ := db.ExecutionWorkspaceByID(ctx, re.pool, re.r.A.ID, wsID)
		t.Fatalf("run after the close = %v, want success in a new workspace (not %s, %s %s)", run, wsID, closed.Status, closed.CleanupReason)
	}
	if closed, _ := db.ExecutionWorkspaceByID(ctx, re.pool, re.r.A.ID, wsID); closed.Status != db.WorkspaceClosed {
		t.Fatalf("closed workspace = %s", closed.Status)
	}
}
