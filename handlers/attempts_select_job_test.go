package handlers

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"berth/db"
)

// sealedAttempts starts count attempts of a new task whose command writes a file of its own,
// and waits until they are sealed.
func (re *runEnv) sealedAttempts(count int) (db.Task, map[string]any) {
	re.t.Helper()
	task := re.task(`echo "$BERTH_RUN_ID" > "out-$BERTH_RUN_ID.txt"`)
	if code, g := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/attempts", map[string]any{"count": count}); code != http.StatusAccepted {
		re.t.Fatalf("start attempts = %d %v", code, g)
	}
	return task, re.waitAttempts(task.ID, "sealed")
}

// TestAttemptSelectionTakesTheSourceLock: selection answers at once with its refs pending, and
// the select_attempts job moves them only under the source's cross-process preparation lock
// (the one attempt creation and provisioning take): while another holder has it, no ref moves
// and new attempts of the task are refused (409 attempts_deciding); once it is free the job
// finishes the decision.
func TestAttemptSelectionTakesTheSourceLock(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	task, g := re.sealedAttempts(2)
	its := items(g)
	a1, a2 := its[0]["execution_workspace_id"].(string), its[1]["execution_workspace_id"].(string)
	a2head, _ := re.gitOut("rev-parse", "refs/heads/berth/PRJ-1-a2")

	held, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		done <- db.WithSourceLock(context.Background(), re.pool, re.r.A.ID, re.repo, func(context.Context) error {
			close(held)
			<-release
			return nil
		})
	}()
	<-held
	code, sel := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/attempts/select", map[string]any{"workspace_id": a1, "generation": g["generation"]})
	if code != http.StatusOK || sel["status"] != "selected" || sel["refs_state"] != "pending" {
		close(release)
		t.Fatalf("select = %d %v", code, sel)
	}
	// The job is there and waits: nothing moves while the lock is held elsewhere.
	time.Sleep(1500 * time.Millisecond)
	if g := re.attemptsOf(task.ID); g["refs_state"] != "pending" {
		close(release)
		t.Fatalf("the decision was carried out while another process held the source lock: %v", g)
	}
	if _, err := re.gitOut("rev-parse", "--verify", "refs/heads/berth/PRJ-1"); err == nil {
		close(release)
		t.Fatal("the task branch moved while another process held the source lock")
	}
	if now, _ := re.gitOut("rev-parse", "refs/heads/berth/PRJ-1-a2"); now != a2head {
		close(release)
		t.Fatal("a discarded branch moved while another process held the source lock")
	}
	code, out := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/attempts", map[string]any{"count": 2})
	if code != http.StatusConflict || taskErrorCode(out) != "attempts_deciding" {
		close(release)
		t.Fatalf("new attempts while the decision is pending = %d %v", code, out)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	g = re.waitRefs(task.ID)
	a1head, _ := re.gitOut("rev-parse", "refs/berth/discarded/PRJ-1-a2")
	head, _ := re.gitOut("rev-parse", "refs/heads/berth/PRJ-1")
	want, _ := re.gitOut("rev-parse", "refs/heads/berth/PRJ-1-a1")
	if g["refs_state"] != "done" || head == "" || head != want || g["head"] != head || a1head != a2head {
		t.Fatalf("after the lock: group %v, task branch %q (a1 %q), a2 rescued at %q (was %q)", g, head, want, a1head, a2head)
	}
	re.waitWorkspace(a2, "closed")
}

// TestAttemptSelectionRacesAttemptsAndProvision: a selection, a new attempt group of another task
// and an ordinary run of a third, started at the same moment on one source repository, all
// finish, and the repository holds exactly the refs each asked for (the selection's job, attempt
// creation and provisioning serialize on the source lock, and git's own ref locks never refuse
// one of them).
func TestAttemptSelectionRacesAttemptsAndProvision(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	chosenTask, g := re.sealedAttempts(3)                // PRJ-1
	runTask := re.task(`echo run > "run-$BERTH_RUN_ID"`) // PRJ-2
	attemptsTask := re.task(`echo "$BERTH_RUN_ID" > "a-$BERTH_RUN_ID"`)
	chosen := items(g)[1]["execution_workspace_id"].(string)

	var wg sync.WaitGroup
	start := make(chan struct{})
	var selCode, runCode, attCode int
	var selOut, runOut, attOut map[string]any
	for _, f := range []func(){
		func() {
			selCode, selOut = re.call(re.r.Board, http.MethodPost, "/api/tasks/"+chosenTask.ID+"/attempts/select",
				map[string]any{"workspace_id": chosen, "generation": g["generation"]})
		},
		func() { runCode, runOut = re.call(re.r.Board, http.MethodPost, "/api/tasks/"+runTask.ID+"/runs", nil) },
		func() {
			attCode, attOut = re.call(re.r.Board, http.MethodPost, "/api/tasks/"+attemptsTask.ID+"/attempts", map[string]any{"count": 2})
		},
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			f()
		}()
	}
	close(start)
	wg.Wait()
	if selCode != http.StatusOK || runCode != http.StatusAccepted || attCode != http.StatusAccepted {
		t.Fatalf("select %d %v; run %d %v; attempts %d %v", selCode, selOut, runCode, runOut, attCode, attOut)
	}

	if g := re.waitRefs(chosenTask.ID); g["refs_state"] != "done" {
		t.Fatalf("selection = %v", g)
	}
	run := re.waitRun(runOut["id"].(string), "the end", ended)
	if run["status"] != "succeeded" {
		t.Fatalf("the racing run = %v", run)
	}
	re.waitAttempts(attemptsTask.ID, "sealed")

	refs, err := re.gitOut("for-each-ref", "--format=%(refname)", "refs/heads", "refs/berth/discarded")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"refs/heads/berth/PRJ-1", "refs/heads/berth/PRJ-1-a2", "refs/berth/discarded/PRJ-1-a1",
		"refs/berth/discarded/PRJ-1-a3", "refs/heads/berth/PRJ-2", "refs/heads/berth/PRJ-3-a1", "refs/heads/berth/PRJ-3-a2"} {
		if !strings.Contains(refs+"\n", want+"\n") {
			t.Fatalf("%s is missing; refs:\n%s", want, refs)
		}
	}
	for _, gone := range []string{"refs/heads/berth/PRJ-1-a1\n", "refs/heads/berth/PRJ-1-a3\n"} {
		if strings.Contains(refs+"\n", gone) {
			t.Fatalf("%s still exists; refs:\n%s", strings.TrimSpace(gone), refs)
		}
	}
	head, _ := re.gitOut("rev-parse", "refs/heads/berth/PRJ-1")
	a2, _ := re.gitOut("rev-parse", "refs/heads/berth/PRJ-1-a2")
	if head != a2 {
		t.Fatalf("task branch at %s, the chosen attempt at %s", head, a2)
	}
	if out, err := re.gitOut("fsck", "--no-dangling"); err != nil {
		t.Fatalf("git fsck: %v %s", err, out)
	}
}

// TestAttemptSelectionTakenBack: when the job finds the task branch checked out after all (a
// worktree Berth's records do not show, so the request's check passed), nothing moves and the
// decision is taken back: the group is selectable again at a new generation, saying why, and a
// second selection once the worktree is gone goes through.
func TestAttemptSelectionTakenBack(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	task, g := re.sealedAttempts(2)
	a1 := items(g)[0]["execution_workspace_id"].(string)
	a2head, _ := re.gitOut("rev-parse", "refs/heads/berth/PRJ-1-a2")
	other := t.TempDir() + "/elsewhere"
	if out, err := re.gitOut("worktree", "add", "-q", "-b", "berth/PRJ-1", other, "main"); err != nil {
		t.Fatalf("worktree add: %v %s", err, out)
	}
	before, _ := re.gitOut("rev-parse", "refs/heads/berth/PRJ-1")

	code, sel := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/attempts/select", map[string]any{"workspace_id": a1, "generation": g["generation"]})
	if code != http.StatusOK || sel["refs_state"] != "pending" {
		t.Fatalf("select = %d %v", code, sel)
	}
	back := re.waitRefs(task.ID)
	msg, _ := back["refs_error"].(string)
	if back["status"] != "sealed" || back["refs_state"] != "done" || back["selected_workspace_id"] != nil ||
		back["generation"].(float64) != sel["generation"].(float64)+1 || !strings.Contains(msg, "checked out") {
		t.Fatalf("taken back = %v", back)
	}
	if now, _ := re.gitOut("rev-parse", "refs/heads/berth/PRJ-1"); now != before {
		t.Fatal("the task branch moved")
	}
	if now, _ := re.gitOut("rev-parse", "refs/heads/berth/PRJ-1-a2"); now != a2head {
		t.Fatal("a discarded attempt's branch moved")
	}
	if n := re.count(`SELECT count(*) FROM audit_events WHERE action = 'attempts.decision_taken_back'`); n != 1 {
		t.Fatalf("%d attempts.decision_taken_back events", n)
	}
	// The stale generation is refused; the new one selects once the worktree is gone.
	if code, out := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/attempts/select", map[string]any{"workspace_id": a1, "generation": g["generation"]}); code != http.StatusConflict {
		t.Fatalf("select at the old generation = %d %v", code, out)
	}
	if out, err := re.gitOut("worktree", "remove", "--force", other); err != nil {
		t.Fatalf("worktree remove: %v %s", err, out)
	}
	if code, out := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/attempts/select", map[string]any{"workspace_id": a1, "generation": back["generation"]}); code != http.StatusOK {
		t.Fatalf("select again = %d %v", code, out)
	}
	if g := re.waitRefs(task.ID); g["refs_state"] != "done" || g["status"] != "selected" || g["refs_error"] != nil {
		t.Fatalf("selected again = %v", g)
	}
}
