package handlers

import (
	"context"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"berth/environment"
)

// TestRunSkippedSetupIsSkipped: a low-trust sandbox run whose workspace has a setup command
// records the setup step as skipped (with the reason), never succeeded, and the command never ran;
// the run itself goes on and succeeds. The workspace page shows the word "skipped".
func TestRunSkippedSetupIsSkipped(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("touch setup-ran")
	re.useSandbox(environment.SandboxConfig{MemoryMB: 512, PidsMax: 256, TimeoutS: 120})
	task := re.task(`test ! -e setup-ran && echo clean > out.txt`)
	if _, err := re.pool.Exec(context.Background(), `UPDATE tasks SET trust = 'low' WHERE id = $1`, task.ID); err != nil {
		t.Fatal(err)
	}
	id := re.start(task.ID, nil)
	run := re.waitRun(id, "the end", ended)
	if run["status"] != "succeeded" {
		t.Fatalf("run = %v log %s", run, re.log(id))
	}
	ws, _ := run["execution_workspace_id"].(string)
	setup := ledgerStep(t, re, ws, "setup")
	if setup["status"] != "skipped" || !strings.Contains(setup["log_excerpt"].(string), "does not allow host setup scripts") {
		t.Fatalf("setup step = %v, want skipped with the reason", setup)
	}
	if _, err := exec.Command("git", "-C", re.repo, "cat-file", "-e", "berth/PRJ-1:setup-ran").CombinedOutput(); err == nil {
		t.Fatal("the skipped setup command ran: setup-ran is on the task branch")
	}
	resp := re.do(re.browser(re.r.Viewer), http.MethodGet, "/workspaces/"+ws, nil, nil)
	if page := readBody(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(page, ">skipped<") {
		t.Fatalf("workspace page = %d, no skipped label", resp.StatusCode)
	}
}

// TestRunSetupSucceededIsSucceeded is the negative control: the same setup command on a standard
// local run is recorded as succeeded and its effect is there.
func TestRunSetupSucceededIsSucceeded(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("touch setup-ran")
	id := re.start(re.task(`test -e setup-ran && echo ok`).ID, nil)
	run := re.waitRun(id, "the end", ended)
	if run["status"] != "succeeded" {
		t.Fatalf("run = %v log %s", run, re.log(id))
	}
	if setup := ledgerStep(t, re, run["execution_workspace_id"].(string), "setup"); setup["status"] != "succeeded" {
		t.Fatalf("setup step = %v, want succeeded", setup)
	}
}

// ledgerStep is the workspace ledger's one step of phase, read through the API.
func ledgerStep(t *testing.T, re *runEnv, ws, phase string) map[string]any {
	t.Helper()
	code, out := re.call(re.r.Viewer, http.MethodGet, "/api/execution-workspaces/"+ws+"/operations", nil)
	if code != http.StatusOK {
		t.Fatalf("operations = %d %v", code, out)
	}
	items, _ := out["items"].([]any)
	for _, it := range items {
		if op, _ := it.(map[string]any); op["phase"] == phase {
			return op
		}
	}
	t.Fatalf("no %s step in the ledger: %v", phase, items)
	return nil
}
