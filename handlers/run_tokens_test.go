package handlers

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"berth/db"
)

// runTokenWorld is a task world (company A with project PRJ) plus: the run's own task with a
// ready execution workspace, a sibling task in the same project, a task of company B, and a
// live run of the own task holding a run token (inserted with SQL: no job runs).
type runTokenWorld struct {
	*taskWorld
	Own, Sibling, Foreign string // task ids
	Workspace, OtherWS    string // execution workspaces of project PRJ (ready, standard trust)
	Run                   string
	Run2                  actor // the run token, as an actor for e.call
}

func newRunTokenWorld(t *testing.T) *runTokenWorld {
	t.Helper()
	w := &runTokenWorld{taskWorld: newTaskWorld(t)}
	w.Own = w.createTask(w.r.Board, w.ProjectID, map[string]any{"title": "own", "command": "true"})["id"].(string)
	w.Sibling = w.createTask(w.r.Board, w.ProjectID, map[string]any{"title": "sibling", "command": "true"})["id"].(string)
	other := w.addProject(w.r.B.ID, "OTH", `{"default_mode":"shared"}`)
	w.Foreign = w.createTask(w.r.Other, other, map[string]any{"title": "foreign", "command": "true"})["id"].(string)
	w.Workspace = w.addExecWorkspace(w.r.A.ID, w.ProjectID, "standard", "ready")
	w.OtherWS = w.addExecWorkspace(w.r.A.ID, w.ProjectID, "standard", "ready")
	w.exec(`UPDATE execution_workspaces SET source_task_id = $1 WHERE id = $2`, w.Own, w.Workspace)
	w.Run, w.Run2 = w.liveRun(w.Own, w.Workspace, "")
	return w
}

// liveRun inserts a running run of taskID (in company A) and mints its token; agentID may be "".
func (w *runTokenWorld) liveRun(taskID, workspaceID, agentID string) (string, actor) {
	w.e.t.Helper()
	var agent any
	if agentID != "" {
		agent = agentID
	}
	id := w.id(`INSERT INTO runs (company_id, task_id, execution_workspace_id, agent_id, status, command, started_at)
		VALUES ($1, $2, $3, $4, 'running', 'true', now()) RETURNING id`, w.r.A.ID, taskID, workspaceID, agent)
	token, hash, err := db.NewToken()
	if err != nil {
		w.e.t.Fatal(err)
	}
	if err := db.CreateRunToken(context.Background(), w.e.pool, id, hash, time.Now().Add(time.Hour)); err != nil {
		w.e.t.Fatal(err)
	}
	return id, actor{Token: token}
}

// expect calls method path as a and fails unless the status is want (and, for errors, the
// error code is code when code is not "").
func (w *runTokenWorld) expect(a actor, method, path string, body any, want int, code string) map[string]any {
	w.e.t.Helper()
	status, out := w.e.call(a, method, path, body)
	if status != want || code != "" && taskErrorCode(out) != code {
		w.e.t.Fatalf("%s %s = %d %v, want %d %s", method, path, status, out, want, code)
	}
	return out
}

// taskRoutes are the run-token routes on a task, as GET requests (the binding PUT is separate).
func taskRoutes(taskID string) []string {
	p := "/api/tasks/" + taskID
	return []string{p, p + "/plan", p + "/workspace", p + "/file-resources/roots",
		p + "/file-resources/list", p + "/file-resources/content?path=README.md"}
}

// TestRunTokenOwnTask: a live run's token reads its own task, plan, binding and file roots, and
// selects its binding (200, audited as the run, updated_by left empty).
func TestRunTokenOwnTask(t *testing.T) {
	t.Parallel()
	w := newRunTokenWorld(t)
	own := "/api/tasks/" + w.Own

	if out := w.expect(w.Run2, http.MethodGet, own, nil, http.StatusOK, ""); out["id"] != w.Own || out["title"] != "own" {
		t.Fatalf("own task = %v", out)
	}
	// Ids are matched case-insensitively, like everywhere else.
	w.expect(w.Run2, http.MethodGet, "/api/tasks/"+strings.ToUpper(w.Own), nil, http.StatusOK, "")
	if out := w.expect(w.Run2, http.MethodGet, own+"/plan", nil, http.StatusOK, ""); out["trace"] == nil {
		t.Fatalf("plan = %v", out)
	}
	if out := w.expect(w.Run2, http.MethodGet, own+"/workspace", nil, http.StatusOK, ""); out["revision"] != float64(0) {
		t.Fatalf("binding = %v", out)
	}
	// No workspace manager in this server, so no execution workspace root is on disk; and a run
	// is not a board member, so the project's local workspaces are not offered either.
	if out := w.expect(w.Run2, http.MethodGet, own+"/file-resources/roots", nil, http.StatusOK, ""); len(out["items"].([]any)) != 0 {
		t.Fatalf("roots = %v", out)
	}
	w.expect(w.Run2, http.MethodGet, own+"/file-resources/list", nil, http.StatusNotFound, "no_readable_workspace")

	// Another task's workspace is out of a run's reach (DESIGN §14; TestRunTokenStaysInItsTask
	// has the attack): refused, nothing changes.
	w.expect(w.Run2, http.MethodPut, own+"/workspace", map[string]any{"mode": "reuse", "execution_workspace_id": w.OtherWS,
		"revision": 0, "request_key": "run-k0"}, http.StatusForbidden, "forbidden")
	body := map[string]any{"mode": "isolated", "revision": 0, "request_key": "run-k1"}
	out := w.expect(w.Run2, http.MethodPut, own+"/workspace", body, http.StatusOK, "")
	if out["revision"] != float64(1) || out["execution_workspace_id"] != nil || out["mode"] != "isolated" {
		t.Fatalf("PUT binding = %v", out)
	}
	// The replay contract holds for runs too.
	if again := w.expect(w.Run2, http.MethodPut, own+"/workspace", body, http.StatusOK, ""); again["updated_at"] != out["updated_at"] {
		t.Fatalf("replay = %v, want %v", again, out)
	}
	w.expect(w.Run2, http.MethodPut, own+"/workspace", map[string]any{"mode": "shared", "revision": 0, "request_key": "run-k2"},
		http.StatusConflict, "stale_revision")
	var actorType, actorLabel, actorID string
	if err := w.e.pool.QueryRow(context.Background(), `SELECT actor_type, actor_label, coalesce(actor_id::text, '')
		FROM audit_events WHERE action = 'task_binding.updated' AND target_id = $1 AND company_id = $2`, w.Own, w.r.A.ID).
		Scan(&actorType, &actorLabel, &actorID); err != nil {
		t.Fatal(err)
	}
	if actorType != db.ActorSystem || actorLabel != "run "+w.Run || actorID != "" {
		t.Fatalf("audit actor = %q %q %q, want system, run %s, none", actorType, actorLabel, actorID, w.Run)
	}
	if n := w.e.count(`SELECT count(*) FROM task_workspace_bindings WHERE task_id = $1 AND updated_by IS NULL`, w.Own); n != 1 {
		t.Fatalf("binding rows by nobody = %d", n)
	}

	// A run started for an agent is audited as that agent.
	agent := w.id(`INSERT INTO agents (company_id, name) VALUES ($1, 'bot') RETURNING id`, w.r.A.ID)
	agentRun, agentTok := w.liveRun(w.Sibling, w.OtherWS, agent)
	w.expect(agentTok, http.MethodPut, "/api/tasks/"+w.Sibling+"/workspace",
		map[string]any{"mode": "isolated", "revision": 0, "request_key": "agent-k1"}, http.StatusOK, "")
	if err := w.e.pool.QueryRow(context.Background(), `SELECT actor_type, actor_label, coalesce(actor_id::text, '')
		FROM audit_events WHERE action = 'task_binding.updated' AND target_id = $1`, w.Sibling).
		Scan(&actorType, &actorLabel, &actorID); err != nil {
		t.Fatal(err)
	}
	if actorType != db.ActorAgent || actorLabel != "run "+agentRun || actorID != agent {
		t.Fatalf("agent audit actor = %q %q %q", actorType, actorLabel, actorID)
	}
	// Disabling the agent stops its runs' tokens.
	w.expect(w.r.Board, http.MethodPost, "/api/agents/"+agent+"/disable", nil, http.StatusOK, "")
	w.expect(agentTok, http.MethodGet, "/api/tasks/"+w.Sibling, nil, http.StatusUnauthorized, "unauthorized")
	w.expect(w.Run2, http.MethodGet, own, nil, http.StatusOK, "")

	// The token's use is recorded.
	if n := w.e.count(`SELECT count(*) FROM api_tokens WHERE run_id = $1 AND last_used_at IS NOT NULL`, w.Run); n != 1 {
		t.Fatalf("run token last_used_at not recorded")
	}
}

// TestRunTokenScope: another task of the same company → 403; another company's task → 404 (as for a
// missing one); routes outside the run-token list of docs/security.md → 403, whatever the id;
// refused requests change nothing and are audited as run_token.denied.
func TestRunTokenScope(t *testing.T) {
	t.Parallel()
	w := newRunTokenWorld(t)
	before := w.fingerprint()
	runs := w.e.count(`SELECT count(*) FROM runs`)
	auditB := w.e.count(`SELECT count(*) FROM audit_events WHERE company_id = $1`, w.r.B.ID)

	for _, path := range taskRoutes(w.Sibling) {
		w.expect(w.Run2, http.MethodGet, path, nil, http.StatusForbidden, "forbidden")
	}
	for _, path := range taskRoutes(w.Foreign) {
		w.expect(w.Run2, http.MethodGet, path, nil, http.StatusNotFound, "not_found")
	}
	for _, path := range taskRoutes("00000000-0000-4000-8000-000000000000") {
		w.expect(w.Run2, http.MethodGet, path, nil, http.StatusNotFound, "not_found")
	}
	put := map[string]any{"mode": "shared", "revision": 0, "request_key": "k"}
	w.expect(w.Run2, http.MethodPut, "/api/tasks/"+w.Sibling+"/workspace", put, http.StatusForbidden, "forbidden")
	w.expect(w.Run2, http.MethodPut, "/api/tasks/"+w.Foreign+"/workspace", put, http.StatusNotFound, "not_found")

	outside := []struct{ method, path string }{
		{http.MethodGet, "/api/me"},
		{http.MethodGet, "/api/companies"},
		{http.MethodGet, "/api/companies/" + w.r.A.ID},
		{http.MethodGet, "/api/companies/" + w.r.A.ID + "/projects"},
		{http.MethodGet, "/api/companies/" + w.r.B.ID + "/projects"},
		{http.MethodGet, "/api/companies/" + w.r.A.ID + "/environments"},
		{http.MethodGet, "/api/companies/" + w.r.A.ID + "/audit-events"},
		{http.MethodGet, "/api/projects/" + w.ProjectID},
		{http.MethodGet, "/api/projects/" + w.ProjectID + "/tasks"},
		{http.MethodPost, "/api/projects/" + w.ProjectID + "/tasks"},
		{http.MethodPatch, "/api/tasks/" + w.Own},
		{http.MethodPatch, "/api/tasks/" + w.Foreign},
		{http.MethodPost, "/api/tasks/" + w.Own + "/runs"},
		{http.MethodPost, "/api/runs/" + w.Run + "/cancel"},
		{http.MethodGet, "/api/environments/" + w.EnvID},
	}
	// Its own run, log and receipt are readable (docs/security.md "Run tokens").
	w.expect(w.Run2, http.MethodGet, "/api/runs/"+w.Run, nil, http.StatusOK, "")
	if status, _ := w.e.call(w.Run2, http.MethodGet, "/api/runs/"+w.Run+"/log", nil); status != http.StatusOK {
		t.Fatalf("run token on its own log = %d", status)
	}
	for _, c := range outside {
		var body any
		if c.method == http.MethodPatch || c.method == http.MethodPost && strings.HasSuffix(c.path, "/tasks") {
			body = map[string]any{"title": "changed by a run"}
		}
		w.expect(w.Run2, c.method, c.path, body, http.StatusForbidden, "forbidden")
	}
	if w.fingerprint() != before || w.e.count(`SELECT count(*) FROM runs`) != runs {
		t.Fatal("a refused run-token request changed data")
	}
	if n := w.e.count(`SELECT count(*) FROM runs WHERE id = $1 AND cancel_requested`, w.Run); n != 0 {
		t.Fatal("a run token cancelled its run through a route outside its list")
	}

	// Denials are audited in the run's company, with the run as target.
	if n := w.e.count(`SELECT count(*) FROM audit_events WHERE action = 'run_token.denied' AND company_id = $1
		AND target_type = 'run' AND target_id = $2 AND actor_label = $3 AND details->>'check' = 'route'`,
		w.r.A.ID, w.Run, "run "+w.Run); n != len(outside) {
		t.Fatalf("route denials audited = %d, want %d", n, len(outside))
	}
	if n := w.e.count(`SELECT count(*) FROM audit_events WHERE action = 'run_token.denied' AND details->>'check' = 'object'
		AND details->>'id' = $1`, w.Sibling); n == 0 {
		t.Fatal("an object denial was not audited")
	}
	if n := w.e.count(`SELECT count(*) FROM audit_events WHERE company_id = $1`, w.r.B.ID); n != auditB {
		t.Fatalf("probing company B wrote %d audit events into it", n-auditB)
	}

	// Pages need a session: a run token is sent to sign in, like a user token.
	resp := w.e.do(w.e.client(), http.MethodGet, "/tasks/"+w.Own, nil, map[string]string{"Authorization": "Bearer " + w.Run2.Token})
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login") {
		t.Fatalf("page with a run token = %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
}

// TestRunTokenDeadTokens: once the run has ended (any terminal status), or the token is revoked
// or expired, the token is a 401 on every route, its own task's included; while the run is
// queued or preparing it works.
func TestRunTokenDeadTokens(t *testing.T) {
	t.Parallel()
	w := newRunTokenWorld(t)
	paths := append(taskRoutes(w.Own), taskRoutes(w.Sibling)...)
	paths = append(paths, taskRoutes(w.Foreign)...)
	paths = append(paths, "/api/me", "/api/companies/"+w.r.A.ID+"/projects", "/api/runs/"+w.Run)
	all401 := func(what string) {
		t.Helper()
		for _, p := range paths {
			if status, out := w.e.call(w.Run2, http.MethodGet, p, nil); status != http.StatusUnauthorized || taskErrorCode(out) != "unauthorized" {
				t.Fatalf("%s: GET %s = %d %v, want 401", what, p, status, out)
			}
		}
		put := map[string]any{"mode": "shared", "revision": 0, "request_key": "dead"}
		w.expect(w.Run2, http.MethodPut, "/api/tasks/"+w.Own+"/workspace", put, http.StatusUnauthorized, "unauthorized")
		w.expect(w.Run2, http.MethodPatch, "/api/tasks/"+w.Own, map[string]any{"title": "x"}, http.StatusUnauthorized, "unauthorized")
	}
	live := func(status string) {
		t.Helper()
		w.exec(`UPDATE runs SET status = $2 WHERE id = $1`, w.Run, status)
		w.expect(w.Run2, http.MethodGet, "/api/tasks/"+w.Own, nil, http.StatusOK, "")
	}

	for _, s := range []string{"queued", "preparing"} {
		live(s)
	}
	for _, s := range []string{"succeeded", "failed", "cancelled", "timed_out"} {
		w.exec(`UPDATE runs SET status = $2 WHERE id = $1`, w.Run, s)
		all401("run " + s)
	}
	if n := w.e.count(`SELECT count(*) FROM task_workspace_bindings WHERE task_id = $1`, w.Own); n != 0 {
		t.Fatal("a dead token changed the binding")
	}

	live("running")
	w.exec(`UPDATE api_tokens SET expires_at = now() - interval '1 second' WHERE run_id = $1`, w.Run)
	all401("expired token")

	w.exec(`UPDATE api_tokens SET expires_at = now() + interval '1 hour' WHERE run_id = $1`, w.Run)
	live("running")
	if n, err := db.RevokeRunTokens(context.Background(), w.e.pool, w.Run); err != nil || n != 1 {
		t.Fatalf("revoke = %d %v", n, err)
	}
	all401("revoked token")

	// A deleted run takes its tokens with it (ON DELETE CASCADE): unknown token, 401.
	w.exec(`DELETE FROM runs WHERE id = $1`, w.Run)
	all401("deleted run")
}

// TestRunTokenUserTokensUnchanged: user tokens and sessions keep their behaviour next to run
// tokens: board members change the binding (audited as the user), viewers are refused with an
// audited 403, other companies get 404, and a user token is never taken for a run's.
func TestRunTokenUserTokensUnchanged(t *testing.T) {
	t.Parallel()
	w := newRunTokenWorld(t)
	own := "/api/tasks/" + w.Own
	for _, a := range []actor{w.r.Board, w.r.Viewer, w.r.Admin} {
		for _, p := range append(taskRoutes(w.Own), "/api/me", "/api/companies/"+w.r.A.ID+"/projects") {
			if status, out := w.e.call(a, http.MethodGet, p, nil); status == http.StatusUnauthorized || status == http.StatusForbidden {
				t.Fatalf("%s GET %s = %d %v", a.User.Email, p, status, out)
			}
		}
	}
	for _, p := range taskRoutes(w.Own) {
		w.expect(w.r.Other, http.MethodGet, p, nil, http.StatusNotFound, "not_found")
	}
	w.expect(w.r.Viewer, http.MethodPut, own+"/workspace", map[string]any{"mode": "shared", "revision": 0, "request_key": "v"},
		http.StatusForbidden, "forbidden")
	if n := w.e.count(`SELECT count(*) FROM audit_events WHERE action = 'task_binding.update.denied' AND actor_type = 'user'
		AND actor_id = $1 AND actor_label = $2`, w.r.Viewer.User.ID, w.r.Viewer.User.Email); n != 1 {
		t.Fatalf("viewer denial audited %d times", n)
	}
	w.expect(w.r.Other, http.MethodPut, own+"/workspace", map[string]any{"mode": "shared", "revision": 0, "request_key": "o"},
		http.StatusNotFound, "not_found")
	w.expect(w.r.Admin, http.MethodPut, own+"/workspace", map[string]any{"mode": "shared", "revision": 0, "request_key": "a"},
		http.StatusForbidden, "forbidden")
	w.expect(w.r.Board, http.MethodPut, own+"/workspace", map[string]any{"mode": "shared", "revision": 0, "request_key": "b"},
		http.StatusOK, "")
	if n := w.e.count(`SELECT count(*) FROM audit_events WHERE action = 'task_binding.updated' AND actor_type = 'user'
		AND actor_id = $1 AND actor_label = $2`, w.r.Board.User.ID, w.r.Board.User.Email); n != 1 {
		t.Fatal("board binding change not audited as the user")
	}
	if n := w.e.count(`SELECT count(*) FROM task_workspace_bindings WHERE task_id = $1 AND updated_by = $2`, w.Own, w.r.Board.User.ID); n != 1 {
		t.Fatal("binding updated_by is not the board member")
	}
	w.expect(w.r.Board, http.MethodPatch, own, map[string]any{"title": "renamed"}, http.StatusOK, "")
	if out := w.expect(w.r.Viewer, http.MethodGet, "/api/me", nil, http.StatusOK, ""); out["email"] != w.r.Viewer.User.Email {
		t.Fatalf("me = %v", out)
	}
	// A revoked user token is still a 401 (it is not retried as a run token).
	w.exec(`UPDATE api_tokens SET revoked_at = now() WHERE user_id = $1`, w.r.Viewer.User.ID)
	w.expect(w.r.Viewer, http.MethodGet, "/api/me", nil, http.StatusUnauthorized, "unauthorized")
	w.expect(actor{Token: "berth_not-a-token"}, http.MethodGet, own, nil, http.StatusUnauthorized, "unauthorized")
}

// TestRunTokenEndToEnd: the token a real run's command gets as BERTH_RUN_TOKEN reads the run's
// task and its execution workspace's files while the run is live, is refused on another task,
// and is a 401 once the run has ended. The command stores the token in its workspace (so the
// task branch's commit carries it) and outside (so the test can use it mid-run), then waits for
// the test's signal.
func TestRunTokenEndToEnd(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	// The jail lets the command write only its workspace: it signals through files there, and
	// the test, outside the jail, watches the workspace directory.
	task := re.task(`printf %s "$BERTH_RUN_TOKEN" > run-token.txt && echo hello > out.txt && ` +
		`printf %s "$BERTH_RUN_TOKEN" > .token.tmp && mv .token.tmp .token && while [ ! -e .go ]; do sleep 0.05; done; rm -f .token .go`)
	sibling := re.task("true")
	id := re.start(task.ID, nil)

	var token, goFile string
	deadline := time.Now().Add(90 * time.Second)
	for token == "" && time.Now().Before(deadline) {
		found, _ := filepath.Glob(filepath.Join(re.dataDir, "workspaces", "ws-*", ".token"))
		if len(found) == 1 {
			if b, err := os.ReadFile(found[0]); err == nil {
				token, goFile = string(b), filepath.Join(filepath.Dir(found[0]), ".go")
				t.Cleanup(func() { _ = os.WriteFile(goFile, nil, 0o644) })
				continue
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.HasPrefix(token, "berth_") {
		t.Fatalf("the command did not get a run token: %q (run %v)", token, re.waitRun(id, "anything", func(map[string]any) bool { return true }))
	}
	run := actor{Token: token}
	if status, out := re.call(run, http.MethodGet, "/api/tasks/"+task.ID, nil); status != http.StatusOK || out["id"] != task.ID {
		t.Fatalf("live run token on its task = %d %v", status, out)
	}
	status, roots := re.call(run, http.MethodGet, "/api/tasks/"+task.ID+"/file-resources/roots", nil)
	items, _ := roots["items"].([]any)
	if status != http.StatusOK || len(items) != 1 || !strings.HasPrefix(items[0].(map[string]any)["name"].(string), executionWorkspaceRootPrefix) {
		t.Fatalf("live run token roots = %d %v", status, roots)
	}
	if status, out := re.call(run, http.MethodGet, "/api/tasks/"+task.ID+"/file-resources/content?path=out.txt", nil); status != http.StatusOK || out["content"] != "hello\n" {
		t.Fatalf("live run token file = %d %v", status, out)
	}
	if status, out := re.call(run, http.MethodGet, "/api/tasks/"+sibling.ID, nil); status != http.StatusForbidden {
		t.Fatalf("live run token on another task = %d %v", status, out)
	}
	if status, out := re.call(run, http.MethodGet, "/api/runs/"+id, nil); status != http.StatusOK || out["id"] != id {
		t.Fatalf("live run token on its own run = %d %v", status, out)
	}
	if status, out := re.call(run, http.MethodPost, "/api/runs/"+id+"/cancel", nil); status != http.StatusForbidden {
		t.Fatalf("live run token cancelling its run = %d %v", status, out)
	}

	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	done := re.waitRun(id, "the end", ended)
	if done["status"] != "succeeded" {
		t.Fatalf("run = %v", done)
	}
	if fin, _ := re.settled(done); fin != "settled" {
		t.Fatalf("finalize = %q", fin)
	}
	committed, err := exec.Command("git", "-C", re.repo, "show", "berth/PRJ-1:run-token.txt").Output()
	if err != nil || string(committed) != token {
		t.Fatalf("token in the workspace = %q %v, want the one the test used", committed, err)
	}
	for _, p := range []string{"/api/tasks/" + task.ID, "/api/tasks/" + task.ID + "/plan", "/api/me"} {
		if status, out := re.call(actor{Token: string(committed)}, http.MethodGet, p, nil); status != http.StatusUnauthorized {
			t.Fatalf("ended run's token on %s = %d %v, want 401", p, status, out)
		}
	}
}
