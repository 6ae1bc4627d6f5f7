package handlers

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"berth/db"
	"berth/environment"
	"berth/environment/sshtest"
)

// useSSH adds an ssh environment for a real sshd on loopback (signed in as the current user, with
// its workspaces under the server's base) and makes it the project's environment.
func (re *runEnv) useSSH(srv *sshtest.Server, hostKey string) string {
	re.t.Helper()
	ctx := context.Background()
	u, err := user.Current()
	if err != nil {
		re.t.Fatal(err)
	}
	id := "6f0d3a52-7a0f-4e47-9d43-000000000003"
	doc, err := environment.Config{Driver: "ssh", SSH: environment.SSHConfig{Host: "127.0.0.1", Port: srv.Port, User: u.Username,
		HostKey: hostKey, BaseDir: srv.Base}}.Document()
	if err != nil {
		re.t.Fatal(err)
	}
	secrets, err := json.Marshal(environment.Secrets{PrivateKey: srv.ClientKey, Salt: "test-salt"})
	if err != nil {
		re.t.Fatal(err)
	}
	sealed, err := re.srv.secrets.Seal(secrets, environment.SecretsAAD(id))
	if err != nil {
		re.t.Fatal(err)
	}
	if _, err := db.CreateEnvironment(ctx, re.pool, db.NewEnvironment{ID: id, CompanyID: re.r.A.ID, Name: "ssh", Driver: "ssh",
		Config: doc, Secrets: sealed}); err != nil {
		re.t.Fatal(err)
	}
	if _, err := re.pool.Exec(ctx, `UPDATE projects SET execution_policy = jsonb_set(execution_policy, '{environment_id}', to_jsonb($1::text))
		WHERE id = $2`, id, re.project); err != nil {
		re.t.Fatal(err)
	}
	return id
}

// probe asks for a probe of environment id and waits for its qualification.
func (re *runEnv) probe(id string) map[string]any {
	re.t.Helper()
	if code, out := re.call(re.r.Admin, http.MethodPost, "/api/environments/"+id+"/probe", nil); code != http.StatusAccepted {
		re.t.Fatalf("probe = %d %v", code, out)
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		_, env := re.call(re.r.Admin, http.MethodGet, "/api/environments/"+id, nil)
		if q, ok := env["qualification"].(map[string]any); ok {
			return q
		}
		time.Sleep(100 * time.Millisecond)
	}
	re.t.Fatalf("environment %s was not probed within 60 s", id)
	return nil
}

// TestRunSSH: an ssh environment end to end on a real sshd. Runs are blocked until a probe
// passes; then the workspace is uploaded, the setup command and the run's command run on the
// remote, finalize brings the changed tree back and commits it on the task branch locally, and
// the lease's cleanup removes the remote directory.
func TestRunSSH(t *testing.T) {
	t.Parallel()
	srv := sshtest.Start(t)
	re := setupRuns(t)
	re.workspaceWith("echo setup-ran > setup.txt")
	envID := re.useSSH(srv, srv.HostKey)
	task := re.task(`test -f setup.txt && echo remote > remote.txt && rm README.md && echo "$BERTH_TASK_ID" > task-id.txt`)

	// Unqualified: the plan blocks the run before anything is provisioned.
	if code, out := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/runs", nil); code != http.StatusConflict {
		t.Fatalf("run on an unprobed ssh environment = %d %v, want 409", code, out)
	}
	q := re.probe(envID)
	if q["ok"] != true || !strings.HasPrefix(q["fingerprint"].(string), "SHA256:") {
		t.Fatalf("qualification = %v", q)
	}

	id := re.start(task.ID, nil)
	run := re.waitRun(id, "the end", ended)
	if run["status"] != "succeeded" {
		t.Fatalf("run = %v log %q", run, re.log(id))
	}
	fin, lease := re.settled(run)
	if fin != "settled" {
		t.Fatalf("finalize = %q", fin)
	}
	if got := gitOut(t, re.repo, "show", "berth/PRJ-1:remote.txt"); got != "remote" {
		t.Fatalf("remote.txt on the task branch = %q", got)
	}
	if got := gitOut(t, re.repo, "show", "berth/PRJ-1:task-id.txt"); got != task.ID {
		t.Fatalf("task-id.txt on the task branch = %q", got)
	}
	if files := gitOut(t, re.repo, "ls-tree", "--name-only", "berth/PRJ-1"); strings.Contains(files, "README.md") {
		t.Fatalf("a file deleted on the remote is still on the branch: %q", files)
	}
	if lease == "active" {
		t.Fatalf("lease after finalize = %q", lease)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		left, _ := filepath.Glob(filepath.Join(srv.Base, "ws-*"))
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("remote workspaces left after cleanup: %v", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRunSSHHostKeyMismatch: a probe against a server whose host key is not the pinned one fails
// on its host_key check, and the environment stays unusable for runs.
func TestRunSSHHostKeyMismatch(t *testing.T) {
	t.Parallel()
	srv := sshtest.Start(t)
	other := sshtest.Start(t) // a second server: its key is a real key, just not this server's
	re := setupRuns(t)
	re.workspaceWith("")
	envID := re.useSSH(srv, other.HostKey)
	q := re.probe(envID)
	if q["ok"] != false || !strings.Contains(strings.ToLower(q["summary"].(string)), "host_key") {
		t.Fatalf("qualification with a wrong host key = %v", q)
	}
	task := re.task("true")
	if code, out := re.call(re.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/runs", nil); code != http.StatusConflict {
		t.Fatalf("run after a failed probe = %d %v, want 409", code, out)
	}
	if _, err := os.Stat(srv.Base); err == nil {
		if left, _ := filepath.Glob(filepath.Join(srv.Base, "ws-*")); len(left) > 0 {
			t.Fatalf("something was uploaded to a server with the wrong key: %v", left)
		}
	}
}
