package handlers

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"berth/workspace/receipt"
)

// attemptsOf reads the task's attempt group as a viewer.
func (re *runEnv) attemptsOf(taskID string) map[string]any {
	re.t.Helper()
	code, out := re.call(re.r.Viewer, http.MethodGet, "/api/tasks/"+taskID+"/attempts", nil)
	if code != http.StatusOK {
		re.t.Fatalf("get attempts = %d %v", code, out)
	}
	return out
}

// waitAttempts polls the group until its status is want.
func (re *runEnv) waitAttempts(taskID, want string) map[string]any {
	re.t.Helper()
	deadline := time.Now().Add(150 * time.Second)
	for time.Now().Before(deadline) {
		if g := re.attemptsOf(taskID); g["status"] == want {
			return g
		}
		time.Sleep(200 * time.Millisecond)
	}
	re.t.Fatalf("attempts of %s did not become %s: %v", taskID, want, re.attemptsOf(taskID))
	return nil
}

// waitRefs waits for the select_attempts job to carry out the task's recorded decision.
func (re *runEnv) waitRefs(taskID string) map[string]any {
	re.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if g := re.attemptsOf(taskID); g["refs_state"] != "pending" {
			return g
		}
		time.Sleep(100 * time.Millisecond)
	}
	re.t.Fatalf("the decision on the attempts of %s was not carried out: %v", taskID, re.attemptsOf(taskID))
	return nil
}

func items(g map[string]any) []map[string]any {
	var out []map[string]any
	for _, it := range g["items"].([]any) {
		out = append(out, it.(map[string]any))
	}
	return out
}

// TestAttemptsForkSealSelect is issue 16's "done when" on real git and PostgreSQL: three attempts
// whose commands write different files give three branches and three different sealed digests
// with the base unchanged; selecting a2 points the task branch at its head, keeps a1/a3 under
// rescue refs and closes their workspaces; a second selection is refused; a sealed workspace
// refuses binding and runs; the receipts verify and a changed byte does not.
func TestAttemptsForkSealSelect(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	task := re.task(`echo "$BERTH_RUN_ID" > "out-$BERTH_RUN_ID.txt"`)
	baseBefore, err := re.gitOut("rev-parse", "main")
	if err != nil {
		t.Fatal(err)
	}

	// Bad counts change nothing; viewers cannot start attempts.
	if code, out := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/attempts", map[string]any{"count": 9}); code != http.StatusUnprocessableEntity {
		t.Fatalf("count 9 = %d %v", code, out)
	}
	if code, _ := re.call(re.r.Viewer, http.MethodPost, "/api/tasks/"+task.ID+"/attempts", map[string]any{"count": 3}); code != http.StatusForbidden && code != http.StatusNotFound {
		t.Fatalf("viewer start = %d", code)
	}
	code, g := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/attempts", map[string]any{"count": 3})
	if code != http.StatusAccepted || g["base_commit"] != baseBefore || len(items(g)) != 3 {
		t.Fatalf("start attempts = %d %v", code, g)
	}
	// The group is the task's live run: neither a run nor another group is admitted meanwhile.
	if code, out := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/runs", nil); code != http.StatusConflict {
		t.Fatalf("run during attempts = %d %v", code, out)
	}
	if code, out := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/attempts", map[string]any{"count": 2}); code != http.StatusConflict {
		t.Fatalf("second group = %d %v", code, out)
	}

	g = re.waitAttempts(task.ID, "sealed")
	its := items(g)
	digests := map[string]bool{}
	for i, it := range its {
		want := "berth/PRJ-1-a" + string(rune('1'+i))
		if it["branch"] != want || it["sealed"] != true || it["status"] != "succeeded" {
			t.Fatalf("attempt %d = %v", i+1, it)
		}
		digests[it["final_tree_digest"].(string)] = true
		if _, err := re.gitOut("rev-parse", "--verify", "refs/heads/"+want); err != nil {
			t.Fatalf("branch %s: %v", want, err)
		}
		// each attempt's commit holds its own file only
		if files, _ := re.gitOut("diff", "--name-only", baseBefore, want); !strings.HasPrefix(files, "out-") || strings.Contains(files, "\n") {
			t.Fatalf("attempt %d changed %q", i+1, files)
		}
	}
	if len(digests) != 3 {
		t.Fatalf("sealed digests are not all different: %v", digests)
	}
	if now, _ := re.gitOut("rev-parse", "main"); now != baseBefore {
		t.Fatalf("the base moved: %s → %s", baseBefore, now)
	}

	// A sealed workspace refuses binding and runs: 409 workspace_sealed.
	ctx := context.Background()
	if _, err := re.pool.Exec(ctx, `UPDATE projects SET execution_policy = execution_policy || '{"allow_task_override": true}' WHERE id = $1`, re.project); err != nil {
		t.Fatal(err)
	}
	a2 := its[1]["execution_workspace_id"].(string)
	code, out := re.call(re.r.Board, http.MethodPut, "/api/tasks/"+task.ID+"/workspace",
		map[string]any{"mode": "reuse", "execution_workspace_id": a2, "revision": 0, "request_key": "bind-sealed"})
	if code != http.StatusConflict || taskErrorCode(out) != "workspace_sealed" {
		t.Fatalf("bind a sealed workspace = %d %v", code, out)
	}
	other := re.task("true")
	if _, err := re.pool.Exec(ctx, `INSERT INTO task_workspace_bindings (task_id, company_id, execution_workspace_id, mode, revision,
		request_key, request_hash) VALUES ($1, $2, $3, 'reuse', 1, 'direct', '\x00')`, other.ID, re.r.A.ID, a2); err != nil {
		t.Fatal(err)
	}
	code, out = re.call(re.r.Board, http.MethodPost, "/api/tasks/"+other.ID+"/runs", nil)
	if code != http.StatusConflict || taskErrorCode(out) != "workspace_sealed" {
		t.Fatalf("run in a sealed workspace = %d %v", code, out)
	}

	// Receipts: each verifies under the instance's key; one changed byte does not.
	key := re.srv.receiptKey
	for _, it := range its {
		resp := re.do(re.client(), http.MethodGet, "/api/runs/"+it["run_id"].(string)+"/receipt", nil,
			map[string]string{"Authorization": "Bearer " + re.r.Viewer.Token})
		doc := readBody(t, resp)
		rc, err := receipt.Verify(key, []byte(doc))
		if err != nil || rc.Disposition != receipt.DispositionCommitted || rc.FinalTreeDigest == nil ||
			*rc.FinalTreeDigest != it["final_tree_digest"] || rc.BaseCommit == nil || *rc.BaseCommit != baseBefore {
			t.Fatalf("receipt of attempt %v: %v %+v\n%s", it["n"], err, rc, doc)
		}
		i := strings.Index(doc, `"exit_code": 0`)
		if i < 0 {
			t.Fatalf("receipt has no exit code 0: %s", doc)
		}
		tampered := doc[:i+len(`"exit_code": `)] + "1" + doc[i+len(`"exit_code": 0`):]
		if _, err := receipt.Verify(key, []byte(tampered)); err == nil {
			t.Fatal("a receipt with one changed byte verified")
		}
	}
	// Another company's member gets 404 for the receipt.
	if code, _ := re.call(re.r.Other, http.MethodGet, "/api/runs/"+its[0]["run_id"].(string)+"/receipt", nil); code != http.StatusNotFound {
		t.Fatalf("outsider receipt = %d", code)
	}

	// Select a2.
	gen := g["generation"]
	code, sel := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/attempts/select", map[string]any{"workspace_id": a2, "generation": gen})
	if code != http.StatusOK || sel["status"] != "selected" || sel["selected_workspace_id"] != a2 || sel["refs_state"] != "pending" {
		t.Fatalf("select = %d %v", code, sel)
	}
	// New attempts wait for the decision's refs; then the job has moved them.
	if code, out := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/attempts", map[string]any{"count": 2}); code != http.StatusConflict {
		t.Fatalf("attempts during the decision = %d %v", code, out)
	} else if c := taskErrorCode(out); c != "attempts_deciding" && c != "attempt_branch_exists" {
		t.Fatalf("attempts during the decision = %s", c)
	}
	done := re.waitRefs(task.ID)
	head, _ := re.gitOut("rev-parse", "refs/heads/berth/PRJ-1")
	a2head, _ := re.gitOut("rev-parse", "refs/heads/berth/PRJ-1-a2")
	if head == "" || head != a2head || done["refs_state"] != "done" || done["head"] != head {
		t.Fatalf("task branch at %q, a2 at %q; group %v", head, a2head, done)
	}
	if n := re.count(`SELECT count(*) FROM audit_events WHERE action = 'attempts.refs_moved' AND details->>'head' = $1`, head); n != 1 {
		t.Fatalf("%d attempts.refs_moved audit events", n)
	}
	for _, n := range []string{"1", "3"} {
		if _, err := re.gitOut("rev-parse", "--verify", "refs/berth/discarded/PRJ-1-a"+n); err != nil {
			t.Fatalf("no rescue ref for a%s: %v", n, err)
		}
		if _, err := re.gitOut("rev-parse", "--verify", "refs/heads/berth/PRJ-1-a"+n); err == nil {
			t.Fatalf("branch berth/PRJ-1-a%s still exists", n)
		}
	}
	for _, i := range []int{0, 2} {
		re.waitWorkspace(its[i]["execution_workspace_id"].(string), "closed")
	}
	if ws := re.workspace(a2); ws["status"] != "ready" {
		t.Fatalf("the chosen workspace = %v", ws)
	}
	if now, _ := re.gitOut("rev-parse", "main"); now != baseBefore {
		t.Fatalf("the base moved on select: %s → %s", baseBefore, now)
	}
	// The discarded attempts' receipts say so, and still verify.
	resp := re.do(re.client(), http.MethodGet, "/api/runs/"+its[0]["run_id"].(string)+"/receipt", nil,
		map[string]string{"Authorization": "Bearer " + re.r.Viewer.Token})
	if rc, err := receipt.Verify(key, []byte(readBody(t, resp))); err != nil || rc.Disposition != receipt.DispositionDiscarded {
		t.Fatalf("discarded receipt: %v %+v", err, rc)
	}

	// A second selection, with the old or the new generation, is refused.
	for _, gen := range []any{gen, sel["generation"]} {
		code, out := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/attempts/select", map[string]any{"workspace_id": a2, "generation": gen})
		if code != http.StatusConflict || taskErrorCode(out) != "attempts_decided" {
			t.Fatalf("second select = %d %v", code, out)
		}
	}
}

// TestAttemptsSelectRefusedWhileTaskBranchCheckedOut: selection never moves a task branch an
// open workspace has checked out (409 task_branch_checked_out), and changes nothing.
func TestAttemptsSelectRefusedWhileTaskBranchCheckedOut(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	task := re.task(`echo "$BERTH_RUN_ID" > "f-$BERTH_RUN_ID"`)
	id := re.start(task.ID, nil) // an ordinary run leaves berth/PRJ-1 checked out in its workspace
	re.settled(re.waitRun(id, "the end", ended))
	before, _ := re.gitOut("rev-parse", "refs/heads/berth/PRJ-1")

	code, g := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/attempts", map[string]any{"count": 2})
	if code != http.StatusAccepted {
		t.Fatalf("start = %d %v", code, g)
	}
	g = re.waitAttempts(task.ID, "sealed")
	ws := items(g)[0]["execution_workspace_id"]
	code, out := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/attempts/select", map[string]any{"workspace_id": ws, "generation": g["generation"]})
	if code != http.StatusConflict || taskErrorCode(out) != "task_branch_checked_out" {
		t.Fatalf("select = %d %v", code, out)
	}
	if now, _ := re.gitOut("rev-parse", "refs/heads/berth/PRJ-1"); now != before {
		t.Fatal("a refused selection moved the task branch")
	}
	if g2 := re.attemptsOf(task.ID); g2["status"] != "sealed" || g2["generation"] != g["generation"] {
		t.Fatalf("a refused selection changed the group: %v", g2)
	}
	// Discarding is still possible: both branches move to rescue refs.
	code, out = re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/attempts/discard", map[string]any{"generation": g["generation"]})
	if code != http.StatusOK || out["status"] != "discarded" {
		t.Fatalf("discard = %d %v", code, out)
	}
	if g := re.waitRefs(task.ID); g["refs_state"] != "done" || g["head"] != nil {
		t.Fatalf("discarded group = %v", g)
	}
	for _, n := range []string{"1", "2"} {
		if _, err := re.gitOut("rev-parse", "--verify", "refs/berth/discarded/PRJ-1-a"+n); err != nil {
			t.Fatalf("no rescue ref for a%s", n)
		}
	}
}
