package handlers

import (
	"berth/environment/jail"
	"berth/environment/jail/jailtest"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Execution workspace tests: close-readiness on real worktrees made by real runs, close, destructive
// close, reopen, fencing, roles and the cleanup failure path.

// finishedRun starts a run of the task, waits for its end and for finalize to settle, and returns
// the run and its execution workspace id.
func (re *runEnv) finishedRun(taskID string) (map[string]any, string) {
	re.t.Helper()
	id := re.start(taskID, nil)
	run := re.waitRun(id, "the end", ended)
	if fin, lease := re.settled(run); fin != "settled" || lease != "released" {
		re.t.Fatalf("run %s: finalize %q lease %q", id, fin, lease)
	}
	ws, _ := run["execution_workspace_id"].(string)
	if ws == "" {
		re.t.Fatalf("run %s has no workspace: %v", id, run)
	}
	return run, ws
}

// taskStatus sets a task's status through the API.
func (re *runEnv) taskStatus(taskID, status string) {
	re.t.Helper()
	if code, out := re.call(re.r.Board, http.MethodPatch, "/api/tasks/"+taskID, map[string]any{"status": status}); code != http.StatusOK {
		re.t.Fatalf("task status %s = %d %v", status, code, out)
	}
}

// readiness reads close-readiness as a viewer.
func (re *runEnv) readiness(wsID string, confirm bool) map[string]any {
	re.t.Helper()
	path := "/api/execution-workspaces/" + wsID + "/close-readiness"
	if confirm {
		path += "?confirm_destructive=true"
	}
	code, out := re.call(re.r.Viewer, http.MethodGet, path, nil)
	if code != http.StatusOK {
		re.t.Fatalf("close-readiness = %d %v", code, out)
	}
	return out
}

// workspace reads a workspace as a viewer.
func (re *runEnv) workspace(wsID string) map[string]any {
	re.t.Helper()
	code, out := re.call(re.r.Viewer, http.MethodGet, "/api/execution-workspaces/"+wsID, nil)
	if code != http.StatusOK {
		re.t.Fatalf("get workspace = %d %v", code, out)
	}
	return out
}

// waitWorkspace polls the workspace until its status is one of want.
func (re *runEnv) waitWorkspace(wsID string, want ...string) map[string]any {
	re.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		ws := re.workspace(wsID)
		if slices.Contains(want, ws["status"].(string)) {
			return ws
		}
		time.Sleep(100 * time.Millisecond)
	}
	re.t.Fatalf("workspace %s did not reach %v: %v", wsID, want, re.workspace(wsID))
	return nil
}

// rootOf is the workspace's directory on this node.
func (re *runEnv) rootOf(ws map[string]any) string {
	return filepath.Join(re.srv.workspaces.Base(), ws["ref"].(string))
}

// gitOut runs git in the source repository.
func (re *runEnv) gitOut(args ...string) (string, error) {
	cmd := exec.Command("git", append([]string{"-C", re.repo}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func codes(list any) []string {
	var out []string
	items, _ := list.([]any)
	for _, it := range items {
		m, _ := it.(map[string]any)
		if k, ok := m["code"].(string); ok {
			out = append(out, k)
		} else if k, ok := m["kind"].(string); ok {
			out = append(out, k)
		}
	}
	return out
}

func gone(path string) bool {
	_, err := os.Lstat(path)
	return errors.Is(err, fs.ErrNotExist)
}

// TestWorkspaceCloseLifecycle: unmerged and dirty work block a close; a confirmed destructive close
// saves both to a rescue ref and removes the worktree but keeps the branch and the work products;
// the closed workspace's files are gone; reopen rebuilds it from the branch under a new
// generation; stale fences are refused; a merged, clean worktree is ready and closes.
func TestWorkspaceCloseLifecycle(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	task := re.task("echo work > result.txt")
	_, wsID := re.finishedRun(task.ID)
	ws := re.workspace(wsID)
	root := re.rootOf(ws)
	if ws["status"] != "ready" || ws["generation"] != float64(1) || ws["branch"] != "berth/PRJ-1" || ws["mode"] != "isolated" {
		t.Fatalf("workspace = %v", ws)
	}

	// The task is still open and the branch has a commit main does not have.
	rd := re.readiness(wsID, false)
	if rd["state"] != "blocked" || !slices.Contains(codes(rd["blocking_reasons"]), "open_tasks_bound") ||
		!slices.Contains(codes(rd["blocking_reasons"]), "unmerged_work") || rd["generation"] != float64(1) {
		t.Fatalf("readiness with an open task = %v", rd)
	}
	linked, _ := rd["linked_tasks"].([]any)
	if len(linked) != 1 || linked[0].(map[string]any)["id"] != task.ID || linked[0].(map[string]any)["open"] != true {
		t.Fatalf("linked tasks = %v", rd["linked_tasks"])
	}
	re.taskStatus(task.ID, "done")
	rd = re.readiness(wsID, false)
	git, _ := rd["git"].(map[string]any)
	if rd["state"] != "blocked" || strings.Join(codes(rd["blocking_reasons"]), ",") != "unmerged_work" ||
		git["ahead"] != float64(1) || git["merged"] != false || git["readable"] != true || rd["destructive_required"] != true {
		t.Fatalf("unmerged readiness = %v", rd)
	}

	// Uncommitted work on top.
	if err := os.WriteFile(filepath.Join(root, "notes.txt"), []byte("unsaved\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rd = re.readiness(wsID, false)
	if got := strings.Join(codes(rd["blocking_reasons"]), ","); rd["state"] != "blocked" || got != "dirty_worktree,unmerged_work" {
		t.Fatalf("dirty readiness = %v", rd)
	}
	code, out := re.call(re.r.Board, http.MethodPatch, "/api/execution-workspaces/"+wsID, map[string]any{"status": "closed"})
	errObj, _ := out["error"].(map[string]any)
	readiness, _ := errObj["readiness"].(map[string]any)
	if code != http.StatusConflict || errObj["code"] != "close_blocked" || readiness["state"] != "blocked" {
		t.Fatalf("blocked close = %d %v", code, out)
	}
	if n := re.count(`SELECT count(*) FROM river_job WHERE kind = 'close_workspace'`); n != 0 {
		t.Fatalf("a blocked close enqueued %d jobs", n)
	}
	if ws := re.workspace(wsID); ws["status"] != "ready" || ws["generation"] != float64(1) {
		t.Fatalf("a blocked close changed the workspace: %v", ws)
	}

	// Confirming a destructive close overrides both and plans a rescue first.
	rd = re.readiness(wsID, true)
	if rd["state"] != "ready_with_warnings" || !slices.Contains(codes(rd["warnings"]), "destructive_confirmed") ||
		strings.Join(codes(rd["planned_actions"]), ",") != "rescue_ref,remove_directory,git_worktree_remove,archive_record" {
		t.Fatalf("confirmed readiness = %v", rd)
	}
	for _, act := range rd["planned_actions"].([]any) {
		cmd := act.(map[string]any)["command"].(string)
		if cmd == "" || strings.Contains(cmd, re.srv.workspaces.Base()) || strings.Contains(cmd, re.repo) {
			t.Fatalf("planned command %q is empty or shows a host path", cmd)
		}
	}
	code, out = re.call(re.r.Board, http.MethodPatch, "/api/execution-workspaces/"+wsID,
		map[string]any{"status": "closed", "confirm_destructive": true, "generation": 1})
	if code != http.StatusAccepted || out["status"] != "closing" || out["generation"] != float64(2) {
		t.Fatalf("destructive close = %d %v", code, out)
	}
	ws = re.waitWorkspace(wsID, "closed", "cleanup_failed")
	if ws["status"] != "closed" || ws["closed_at"] == nil {
		t.Fatalf("after close: %v", ws)
	}
	if !gone(root) {
		t.Fatal("the worktree directory is still there")
	}
	if _, err := re.gitOut("rev-parse", "--verify", "refs/heads/berth/PRJ-1"); err != nil {
		t.Fatal("the task branch was deleted")
	}
	rescue, err := re.gitOut("for-each-ref", "--format=%(refname)", "refs/berth/rescue/")
	if err != nil || !strings.HasPrefix(rescue, "refs/berth/rescue/"+ws["ref"].(string)+"-") || strings.Contains(rescue, "\n") {
		t.Fatalf("rescue refs = %q %v", rescue, err)
	}
	if saved, err := re.gitOut("show", rescue+":notes.txt"); err != nil || saved != "unsaved" {
		t.Fatalf("rescued notes.txt = %q %v", saved, err)
	}
	if saved, err := re.gitOut("show", rescue+":result.txt"); err != nil || saved != "work" {
		t.Fatalf("rescued result.txt = %q %v", saved, err)
	}
	// Work products remain, the rescue commit among them.
	code, out = re.call(re.r.Viewer, http.MethodGet, "/api/tasks/"+task.ID+"/work-products", nil)
	items, _ := out["items"].([]any)
	var kinds []string
	var rescued bool
	for _, it := range items {
		p := it.(map[string]any)
		kinds = append(kinds, p["kind"].(string))
		if meta, _ := p["metadata"].(map[string]any); meta["rescue_ref"] == rescue {
			rescued = true
		}
	}
	slices.Sort(kinds)
	if code != http.StatusOK || strings.Join(kinds, ",") != "branch,commit,commit" || !rescued {
		t.Fatalf("work products after close = %d %v", code, out)
	}
	// The closed workspace's files are no longer listed or readable.
	if code, out := re.call(re.r.Viewer, http.MethodGet, "/api/tasks/"+task.ID+"/file-resources/content?path=result.txt", nil); code != http.StatusNotFound {
		t.Fatalf("closed workspace file read = %d %v", code, out)
	}
	code, out = re.call(re.r.Board, http.MethodGet, "/api/tasks/"+task.ID+"/file-resources/roots", nil)
	for _, it := range out["items"].([]any) {
		if strings.HasPrefix(it.(map[string]any)["name"].(string), "execution-workspace:") {
			t.Fatalf("roots after close still list the workspace: %d %v", code, out)
		}
	}
	// The ledger shows the rescue and the teardown.
	code, out = re.call(re.r.Viewer, http.MethodGet, "/api/execution-workspaces/"+wsID+"/operations", nil)
	var steps []string
	for _, it := range out["items"].([]any) {
		o := it.(map[string]any)
		steps = append(steps, o["phase"].(string)+":"+o["status"].(string))
		if strings.Contains(o["log_excerpt"].(string), re.srv.workspaces.Base()) {
			t.Fatalf("operation log shows a host path: %v", o)
		}
	}
	if code != http.StatusOK || strings.Join(steps, ",") != "realize:succeeded,finalize:succeeded,finalize:succeeded,teardown:succeeded" {
		t.Fatalf("operations = %d %v", code, steps)
	}
	if n := re.count(`SELECT count(*) FROM audit_events WHERE action = 'execution_workspace.closed' AND target_id = $1`, wsID); n != 1 {
		t.Fatalf("closed audit events = %d", n)
	}

	// Closing a closed workspace is a no-op; a stale fence is refused.
	if code, out := re.call(re.r.Board, http.MethodPatch, "/api/execution-workspaces/"+wsID, map[string]any{"status": "closed"}); code != http.StatusOK || out["status"] != "closed" {
		t.Fatalf("close again = %d %v", code, out)
	}
	code, out = re.call(re.r.Board, http.MethodPatch, "/api/execution-workspaces/"+wsID, map[string]any{"status": "ready", "generation": 1})
	if errObj, _ := out["error"].(map[string]any); code != http.StatusConflict || errObj["code"] != "stale_generation" || errObj["current"] == nil {
		t.Fatalf("stale reopen = %d %v", code, out)
	}

	// Reopen: a new generation and a new root on the same branch, without the rescued file.
	code, out = re.call(re.r.Board, http.MethodPatch, "/api/execution-workspaces/"+wsID, map[string]any{"status": "ready", "generation": 2})
	if code != http.StatusAccepted || out["status"] != "preparing" || out["generation"] != float64(3) {
		t.Fatalf("reopen = %d %v", code, out)
	}
	reopened := re.waitWorkspace(wsID, "ready", "closed")
	if reopened["status"] != "ready" || reopened["generation"] != float64(3) || reopened["ref"] == ws["ref"] ||
		reopened["branch"] != "berth/PRJ-1" || reopened["closed_at"] != nil || reopened["base_ref"] != ws["base_ref"] {
		t.Fatalf("reopened = %v (was %v)", reopened, ws)
	}
	root = re.rootOf(reopened)
	if b, err := os.ReadFile(filepath.Join(root, "result.txt")); err != nil || string(b) != "work\n" {
		t.Fatalf("reopened result.txt = %q %v", b, err)
	}
	if !gone(filepath.Join(root, "notes.txt")) {
		t.Fatal("the uncommitted file came back on reopen (it belongs to the rescue ref)")
	}
	if code, out := re.call(re.r.Viewer, http.MethodGet, "/api/tasks/"+task.ID+"/file-resources/content?path=result.txt", nil); code != http.StatusOK {
		t.Fatalf("reopened file read = %d %v", code, out)
	}
	if code, out := re.call(re.r.Board, http.MethodPatch, "/api/execution-workspaces/"+wsID, map[string]any{"status": "closed", "generation": 2}); code != http.StatusConflict {
		t.Fatalf("close with the pre-reopen generation = %d %v", code, out)
	}

	// Merged into main and clean: ready, and it closes without confirmation.
	if out, err := re.gitOut("merge", "--ff-only", "--quiet", "berth/PRJ-1"); err != nil {
		t.Fatalf("merge: %v %s", err, out)
	}
	rd = re.readiness(wsID, false)
	if rd["state"] != "ready" || len(rd["blocking_reasons"].([]any)) != 0 || len(rd["warnings"].([]any)) != 0 ||
		strings.Join(codes(rd["planned_actions"]), ",") != "remove_directory,git_worktree_remove,archive_record" {
		t.Fatalf("clean readiness = %v", rd)
	}
	if code, out := re.call(re.r.Board, http.MethodPatch, "/api/execution-workspaces/"+wsID, map[string]any{"status": "closed", "generation": 3}); code != http.StatusAccepted {
		t.Fatalf("clean close = %d %v", code, out)
	}
	if ws := re.waitWorkspace(wsID, "closed", "cleanup_failed"); ws["status"] != "closed" || !gone(root) {
		t.Fatalf("clean close: %v", ws)
	}
	if rescues, _ := re.gitOut("for-each-ref", "--format=%(refname)", "refs/berth/rescue/"); rescues != rescue {
		t.Fatalf("a clean close made a rescue ref: %q", rescues)
	}

	// Pages: the closed workspace offers Reopen to the board, not to a viewer.
	resp := re.do(re.browser(re.r.Board), http.MethodGet, "/workspaces/"+wsID, nil, nil)
	if body := readBody(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, "/workspaces/"+wsID+"/reopen") ||
		!strings.Contains(body, "berth/PRJ-1") || !strings.Contains(body, "teardown") {
		t.Fatalf("board workspace page = %d", resp.StatusCode)
	}
	resp = re.do(re.browser(re.r.Viewer), http.MethodGet, "/workspaces/"+wsID, nil, nil)
	if body := readBody(t, resp); resp.StatusCode != http.StatusOK || strings.Contains(body, "/reopen") {
		t.Fatalf("viewer workspace page = %d", resp.StatusCode)
	}
	// The reopen form: back to ready through the page.
	form := url.Values{"generation": {"4"}}
	resp = re.do(re.browser(re.r.Board), http.MethodPost, "/workspaces/"+wsID+"/reopen", strings.NewReader(form.Encode()),
		map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("reopen form = %d %s", resp.StatusCode, readBody(t, resp))
	}
	if ws := re.waitWorkspace(wsID, "ready", "closed"); ws["status"] != "ready" || ws["generation"] != float64(5) {
		t.Fatalf("after the reopen form: %v", ws)
	}
}

// TestWorkspaceCloseShared: a shared workspace's close only archives the record; nothing in the
// project directory is deleted.
func TestWorkspaceCloseShared(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	if _, err := re.pool.Exec(context.Background(), `UPDATE projects SET execution_policy =
		jsonb_set(execution_policy, '{default_mode}', '"shared"') WHERE id = $1`, re.project); err != nil {
		t.Fatal(err)
	}
	// A shared run works in the user's own directory as the run user; Berth never changes its
	// ownership, so a root Berth's administrator gives it to berth-run (docs/security.md).
	if host, err := jail.Detect(context.Background()); err != nil {
		t.Fatal(err)
	} else if host.Identity != nil {
		if out, err := exec.Command("chown", "-R", fmt.Sprintf("%d:%d", host.Identity.UID, host.Identity.GID), re.repo).CombinedOutput(); err != nil {
			t.Fatalf("chown: %v %s", err, out)
		}
	}
	task := re.task("echo shared > shared.txt")
	_, wsID := re.finishedRun(task.ID)
	ws := re.workspace(wsID)
	if ws["mode"] != "shared" || ws["strategy"] != "shared" {
		t.Fatalf("workspace = %v", ws)
	}
	re.taskStatus(task.ID, "done")
	rd := re.readiness(wsID, false)
	if rd["state"] != "ready_with_warnings" || rd["shared"] != true || strings.Join(codes(rd["warnings"]), ",") != "shared_workspace" ||
		strings.Join(codes(rd["planned_actions"]), ",") != "archive_record" || rd["git"] != nil {
		t.Fatalf("shared readiness = %v", rd)
	}
	if code, out := re.call(re.r.Board, http.MethodPatch, "/api/execution-workspaces/"+wsID, map[string]any{"status": "closed"}); code != http.StatusAccepted {
		t.Fatalf("shared close = %d %v", code, out)
	}
	if ws := re.waitWorkspace(wsID, "closed", "cleanup_failed"); ws["status"] != "closed" {
		t.Fatalf("shared close: %v", ws)
	}
	for _, name := range []string{"shared.txt", "README.md", ".git"} {
		if gone(filepath.Join(re.repo, name)) {
			t.Fatalf("closing a shared workspace deleted %s from the project directory", name)
		}
	}
	if n := re.count(`SELECT count(*) FROM workspace_operations WHERE execution_workspace_id = $1 AND phase IN ('cleanup', 'finalize')`, wsID); n != 0 {
		t.Fatalf("a shared close ran %d cleanup or rescue steps", n)
	}
}

// TestWorkspaceCloseLiveRunAndRoles: a run in progress blocks the close even when confirmed; the
// role matrix of every workspace route; refused bodies change nothing.
func TestWorkspaceCloseLiveRunAndRoles(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	task := re.task("echo started; sleep 30")
	runID := re.start(task.ID, nil)
	run := re.waitRun(runID, "the command start", func(r map[string]any) bool { return r["status"] == "running" })
	wsID := run["execution_workspace_id"].(string)
	re.taskStatus(task.ID, "done")

	rd := re.readiness(wsID, true)
	if got := codes(rd["blocking_reasons"]); rd["state"] != "blocked" || !slices.Contains(got, "live_run") || !slices.Contains(got, "active_lease") {
		t.Fatalf("readiness during a run = %v", rd)
	}
	code, out := re.call(re.r.Board, http.MethodPatch, "/api/execution-workspaces/"+wsID, map[string]any{"status": "closed", "confirm_destructive": true})
	if errObj, _ := out["error"].(map[string]any); code != http.StatusConflict || errObj["code"] != "close_blocked" {
		t.Fatalf("close during a run = %d %v", code, out)
	}

	// Reads: members and instance admins; another company sees nothing.
	list := "/api/companies/" + re.r.A.ID + "/execution-workspaces"
	for who, a := range map[string]actor{"viewer": re.r.Viewer, "board": re.r.Board, "admin": re.r.Admin} {
		for _, path := range []string{list, list + "?status=ready&task_id=" + task.ID + "&project_id=" + re.project,
			"/api/execution-workspaces/" + wsID, "/api/execution-workspaces/" + wsID + "/operations",
			"/api/execution-workspaces/" + wsID + "/close-readiness", "/api/tasks/" + task.ID + "/work-products"} {
			if code, out := re.call(a, http.MethodGet, path, nil); code != http.StatusOK {
				t.Errorf("%s GET %s = %d %v", who, path, code, out)
			}
		}
	}
	if code, out := re.call(re.r.Viewer, http.MethodGet, list+"?task_id="+task.ID, nil); code != http.StatusOK ||
		len(out["items"].([]any)) != 1 || out["items"].([]any)[0].(map[string]any)["id"] != wsID {
		t.Fatalf("list by task = %d %v", code, out)
	}
	if code, out := re.call(re.r.Viewer, http.MethodGet, list+"?status=closed", nil); code != http.StatusOK || len(out["items"].([]any)) != 0 {
		t.Fatalf("list closed = %d %v", code, out)
	}
	for _, path := range []string{list + "?status=bogus", list + "?project_id=x", list + "?cursor=!!", list + "?limit=0"} {
		if code, _ := re.call(re.r.Viewer, http.MethodGet, path, nil); code != http.StatusBadRequest {
			t.Errorf("GET %s = %d, want 400", path, code)
		}
	}
	for _, path := range []string{list, "/api/execution-workspaces/" + wsID, "/api/execution-workspaces/" + wsID + "/operations",
		"/api/execution-workspaces/" + wsID + "/close-readiness", "/api/tasks/" + task.ID + "/work-products"} {
		if code, _ := re.call(re.r.Other, http.MethodGet, path, nil); code != http.StatusNotFound {
			t.Errorf("other company GET %s = %d, want 404", path, code)
		}
	}
	// Changes: board members only; another company gets 404.
	for who, a := range map[string]actor{"viewer": re.r.Viewer, "admin": re.r.Admin} {
		if code, _ := re.call(a, http.MethodPatch, "/api/execution-workspaces/"+wsID, map[string]any{"status": "closed"}); code != http.StatusForbidden {
			t.Errorf("%s close = %d, want 403", who, code)
		}
	}
	if code, _ := re.call(re.r.Other, http.MethodPatch, "/api/execution-workspaces/"+wsID, map[string]any{"status": "closed"}); code != http.StatusNotFound {
		t.Errorf("other company close = %d, want 404", code)
	}
	if n := re.count(`SELECT count(*) FROM audit_events WHERE action = 'execution_workspace.update.denied'`); n != 2 {
		t.Errorf("denied audit events = %d, want 2", n)
	}
	for name, body := range map[string]any{
		"empty object":       map[string]any{},
		"not an action":      map[string]any{"status": "closing"},
		"server-owned field": map[string]any{"status": "closed", "mode": "shared"},
		"unknown field":      map[string]any{"status": "closed", "force": true},
		"generation type":    `{"status":"closed","generation":"1"}`,
		"bad generation":     map[string]any{"status": "closed", "generation": 0},
		"confirm on reopen":  map[string]any{"status": "ready", "confirm_destructive": true},
	} {
		if code, out := re.call(re.r.Board, http.MethodPatch, "/api/execution-workspaces/"+wsID, body); code != http.StatusBadRequest {
			t.Errorf("%s = %d %v, want 400", name, code, out)
		}
	}
	resp := re.do(re.client(), http.MethodPatch, "/api/execution-workspaces/"+wsID, strings.NewReader(`status=closed`),
		map[string]string{"Authorization": "Bearer " + re.r.Board.Token, "Content-Type": "application/x-www-form-urlencoded"})
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("form body = %d, want 415", resp.StatusCode)
	}
	if ws := re.workspace(wsID); ws["status"] != "ready" || ws["generation"] != float64(1) {
		t.Fatalf("refused requests changed the workspace: %v", ws)
	}
	// Pages: readers see the list and the page; others get 404; a viewer cannot post the form.
	for _, path := range []string{"/companies/" + re.r.A.ID + "/workspaces", "/companies/" + re.r.A.ID + "/workspaces?status=ready",
		"/workspaces/" + wsID} {
		resp := re.do(re.browser(re.r.Viewer), http.MethodGet, path, nil, nil)
		if body := readBody(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, "live_run") && strings.HasPrefix(path, "/workspaces/") {
			t.Errorf("viewer GET %s = %d", path, resp.StatusCode)
		}
		if resp := re.do(re.browser(re.r.Other), http.MethodGet, path, nil, nil); resp.StatusCode != http.StatusNotFound {
			t.Errorf("other company GET %s = %d, want 404", path, resp.StatusCode)
		}
	}
	resp = re.do(re.browser(re.r.Viewer), http.MethodPost, "/workspaces/"+wsID+"/close", strings.NewReader("generation=1"),
		map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("viewer close form = %d, want 403", resp.StatusCode)
	}
	// The board's close form is refused with the page and its reasons while the run lives.
	resp = re.do(re.browser(re.r.Board), http.MethodPost, "/workspaces/"+wsID+"/close", strings.NewReader("generation=1&confirm_destructive=1"),
		map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	if body := readBody(t, resp); resp.StatusCode != http.StatusConflict || !strings.Contains(body, "alert-error") {
		t.Errorf("board close form during a run = %d", resp.StatusCode)
	}

	if code, _ := re.call(re.r.Board, http.MethodPost, "/api/runs/"+runID+"/cancel", nil); code != http.StatusAccepted {
		t.Fatalf("cancel = %d", code)
	}
	re.waitRun(runID, "the cancel", ended)
}

// TestWorkspaceCleanupFailure: a failing cleanup command leaves the workspace cleanup_failed with
// the reason and its directory in place; closing again after the fix closes it. User text in the
// planned commands is escaped on the page.
func TestWorkspaceCleanupFailure(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	marker := filepath.Join(jailtest.Visible(t), "cleanup-ok") // the jail must see it
	cleanup := "test -e " + marker + " && echo '<b>cleaned</b>'"
	re.workspaceWith("")
	if _, err := re.pool.Exec(context.Background(), `UPDATE project_workspaces SET cleanup_command = $1 WHERE project_id = $2`,
		cleanup, re.project); err != nil {
		t.Fatal(err)
	}
	task := re.task("true")
	_, wsID := re.finishedRun(task.ID)
	re.taskStatus(task.ID, "cancelled")
	ws := re.workspace(wsID)
	root := re.rootOf(ws)

	rd := re.readiness(wsID, false)
	if rd["state"] != "ready" || strings.Join(codes(rd["planned_actions"]), ",") != "cleanup_command,remove_directory,git_worktree_remove,archive_record" {
		t.Fatalf("readiness = %v", rd)
	}
	if cmd := rd["planned_actions"].([]any)[0].(map[string]any)["command"].(string); !strings.Contains(cmd, "/bin/sh -c ") || !strings.Contains(cmd, "cleaned") {
		t.Fatalf("cleanup command shown = %q", cmd)
	}
	resp := re.do(re.browser(re.r.Board), http.MethodGet, "/workspaces/"+wsID, nil, nil)
	if body := readBody(t, resp); resp.StatusCode != http.StatusOK || strings.Contains(body, "<b>cleaned") || !strings.Contains(body, "&lt;b&gt;cleaned") ||
		!strings.Contains(body, "Close workspace") {
		t.Fatalf("page escapes the cleanup command: %d", resp.StatusCode)
	}

	// Close through the form: the cleanup command exits 1.
	resp = re.do(re.browser(re.r.Board), http.MethodPost, "/workspaces/"+wsID+"/close", strings.NewReader("generation=1"),
		map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("close form = %d %s", resp.StatusCode, readBody(t, resp))
	}
	ws = re.waitWorkspace(wsID, "cleanup_failed", "closed")
	reason, _ := ws["cleanup_reason"].(string)
	if ws["status"] != "cleanup_failed" || !strings.Contains(reason, "exit status 1") || strings.Contains(reason, marker) {
		t.Fatalf("after a failing cleanup: %v", ws)
	}
	if gone(root) {
		t.Fatal("a failed cleanup still deleted the directory")
	}
	var status string
	var exit *int
	_ = re.pool.QueryRow(context.Background(), `SELECT status, exit_code FROM workspace_operations
		WHERE execution_workspace_id = $1 AND phase = 'cleanup'`, wsID).Scan(&status, &exit)
	if status != "failed" || exit == nil || *exit != 1 {
		t.Fatalf("cleanup operation = %s %v", status, exit)
	}
	if n := re.count(`SELECT count(*) FROM workspace_operations WHERE execution_workspace_id = $1 AND phase = 'teardown'`, wsID); n != 0 {
		t.Fatalf("teardown ran after a failed cleanup: %d", n)
	}

	// Fix it and close again (the API this time).
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out := re.call(re.r.Board, http.MethodPatch, "/api/execution-workspaces/"+wsID, map[string]any{"status": "closed"})
	if code != http.StatusAccepted || out["generation"] != float64(3) {
		t.Fatalf("retry close = %d %v", code, out)
	}
	ws = re.waitWorkspace(wsID, "closed", "cleanup_failed")
	if ws["status"] != "closed" || ws["cleanup_reason"] != nil || !gone(root) {
		t.Fatalf("after the retry: %v", ws)
	}
	code, out = re.call(re.r.Viewer, http.MethodGet, "/api/execution-workspaces/"+wsID+"/operations", nil)
	var last map[string]any
	for _, it := range out["items"].([]any) {
		if o := it.(map[string]any); o["phase"] == "cleanup" {
			last = o
		}
	}
	if code != http.StatusOK || last == nil || last["status"] != "succeeded" || !strings.Contains(last["log_excerpt"].(string), "<b>cleaned</b>") {
		t.Fatalf("cleanup retry operation = %d %v", code, last)
	}
}
