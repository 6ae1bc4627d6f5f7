package handlers

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"berth/db"
)

// Hostile output (issue 20, docs/security.md "What a run's output can do"): a board member whose
// task command is the attacker. Each case plants, in a real run on real bubblewrap, what a run
// could leave behind for Berth's host side (a .git that names a git dir the run wrote, whose
// config defines filters, textconv, external diff, fsmonitor and hooks, or a .git naming /etc,
// the data dir or the private HOME), lets finalize, close-readiness and the next run read it,
// and checks that nothing ran on the host and nothing of the host reached the run. Markers are
// written under the data dir: the run itself cannot write there (the jail masks it read-only),
// so a marker means root on the host ran the planted command.

// hostileConfig is a git config whose every hook into code execution marks the data dir and
// copies the secret key into the workspace.
const hostileConfig = `[core]
	bare = false
	worktree = $ws
	fsmonitor = "sh -c 'touch $data/pwned-fsmonitor'"
	hooksPath = $ws/.hooks
[filter "pwn"]
	clean = "sh -c 'cat $data/secret.key > $ws/leaked-filter; touch $data/pwned-filter; cat'"
	smudge = "sh -c 'touch $data/pwned-smudge; cat'"
[diff "pwn"]
	textconv = "sh -c 'touch $data/pwned-textconv; cat \"\$1\"' --"
[diff]
	external = "sh -c 'touch $data/pwned-diff'"
[credential]
	helper = "!sh -c 'touch $data/pwned-credential'"
`

// plantCommand is a task command that builds a hostile git dir at where (a shell expression)
// and points the worktree's .git at it as kind: a gitdir file, a symlink, or the directory itself.
func plantCommand(where, kind string) string {
	link := map[string]string{
		"file":      `rm -rf .git; printf 'gitdir: %s\n' "$evil" > .git`,
		"symlink":   `rm -rf .git; ln -s "$evil" .git`,
		"directory": `rm -rf .git; cp -r "$evil" .git`,
	}[kind]
	return `set -e
unset GIT_OBJECT_DIRECTORY # Berth's own setting for the run's commits: the attacker drops it
data=$(cd ../.. && pwd); ws=$PWD; evil=` + where + `
rm -rf "$evil"; git init -q --bare "$evil"
cat >> "$evil/config" <<EOF
` + hostileConfig + `EOF
mkdir -p .hooks; printf '#!/bin/sh\ntouch %s/pwned-hook\n' "$data" > .hooks/pre-commit; chmod +x .hooks/pre-commit
printf '* filter=pwn diff=pwn\n' > .gitattributes
echo work > work.txt
` + link
}

// TestHostileGitConfig: a .git (file, symlink or directory) naming a git dir the run wrote, in the
// workspace or in its private HOME, never makes Berth's host side run its filters, textconv,
// external diff, fsmonitor, hooks or credential helper: not at finalize (the work is still
// committed, in Berth's git jail), not at close-readiness, not when the next run starts. The
// negative control runs the host-side `git add -A` Berth used to run, which does fire the planted
// filter as root.
func TestHostileGitConfig(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ where, kind string }{
		{`"$ws/.evilgit"`, "file"}, {`"$HOME/evilgit"`, "file"}, {`"$ws/.evilgit"`, "symlink"},
		{`"$HOME/evilgit"`, "symlink"}, {`"$HOME/evilgit"`, "directory"},
	} {
		t.Run(strings.Trim(c.where, `"$`)+"-"+c.kind, func(t *testing.T) {
			t.Parallel()
			re := setupRuns(t)
			re.workspaceWith("")
			secret := fmt.Sprintf("TOP-SECRET-%d", os.Getpid())
			if err := os.WriteFile(filepath.Join(re.dataDir, "secret.key"), []byte(secret), 0o600); err != nil {
				t.Fatal(err)
			}
			task := re.task(plantCommand(c.where, c.kind))
			run, wsID := re.finishedRun(task.ID)
			if run["status"] != "succeeded" {
				t.Fatalf("planting run = %v, log %q", run, re.log(run["id"].(string)))
			}
			// Close-readiness reads git state; the next run prepares the private store.
			re.readiness(wsID, false)
			again, _ := re.finishedRun(task.ID)
			if again["status"] != "succeeded" {
				t.Fatalf("second run = %v, log %q", again, re.log(again["id"].(string)))
			}
			re.readiness(wsID, true)
			checkNotPwned(t, re.dataDir, secret, re.rootOf(re.workspace(wsID)), re.repo)
			// The work was committed all the same: finalize stages in the jail, explicitly.
			if got := gitOut(t, re.repo, "show", "berth/PRJ-1:work.txt"); got != "work" {
				t.Fatalf("work.txt on the task branch = %q", got)
			}

			// Negative control: the planted state is armed (each run plants it anew, and finalize
			// leaves it). The host-side git Berth used to run, discovering the repository from the
			// tree with its old safety flags, runs the planted filter as root.
			root := re.rootOf(re.workspace(wsID))
			if err := os.WriteFile(filepath.Join(root, "work.txt"), []byte("changed again\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("git", "-c", "core.hooksPath=/dev/null", "-c", "safe.directory=*", "-c", "core.fsmonitor=false",
				"add", "-A")
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "HOME="+t.TempDir())
			out, _ := cmd.CombinedOutput()
			if _, err := os.Stat(filepath.Join(re.dataDir, "pwned-filter")); err != nil {
				t.Fatalf("negative control: the old host-side git add did not run the planted filter: %v %s", err, out)
			}
		})
	}
}

// checkNotPwned fails if a planted command left a marker in the data dir, or the secret reached
// the workspace or the task branch.
func checkNotPwned(t *testing.T, dataDir, secret, root, repo string) {
	t.Helper()
	markers, _ := filepath.Glob(filepath.Join(dataDir, "pwned-*"))
	if len(markers) > 0 {
		t.Fatalf("a planted command ran on the host: %v", markers)
	}
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), secret) {
				t.Errorf("the secret key reached the workspace: %s", p)
			}
		}
		return nil
	})
	if out, _ := exec.Command("git", "-C", repo, "grep", "-l", secret, "berth/PRJ-1").CombinedOutput(); len(out) > 0 {
		t.Errorf("the secret key reached the task branch: %s", out)
	}
}

// TestHostileGitPath: a .git naming a host path (/etc, the data dir, the private HOME) as a gitdir
// file or a symlink never makes Berth read, copy, chown or bind that path for the next run: the
// next run of the task cannot read /etc/shadow or the secret key, and the admin dir it gets is
// the one Berth recorded. The negative control shows the planted .git names the target and that
// the target holds what the check looks for.
func TestHostileGitPath(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the attack is on files only root may read")
	}
	for _, c := range []struct{ name, target, kind string }{
		{"etc-file", "/etc", "file"}, {"etc-symlink", "/etc", "symlink"},
		{"data-file", "$data", "file"}, {"data-symlink", "$data", "symlink"}, {"home-file", "$HOME", "file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			re := setupRuns(t)
			re.workspaceWith("")
			secret := fmt.Sprintf("TOP-SECRET-%d", os.Getpid())
			if err := os.WriteFile(filepath.Join(re.dataDir, "secret.key"), []byte(secret), 0o600); err != nil {
				t.Fatal(err)
			}
			link := `printf 'gitdir: %s\n' "` + c.target + `" > .git`
			if c.kind == "symlink" {
				link = `ln -s "` + c.target + `" .git`
			}
			task := re.task(`echo "dotgit $(head -n 1 .git 2>/dev/null)"; data=$(cd ../.. && pwd); rm -rf .git; ` + link + `
cat /etc/shadow; cat "$data/secret.key"; ls "$data"; git status; true`)
			run, _ := re.finishedRun(task.ID)
			again, _ := re.finishedRun(task.ID)
			for _, r := range []map[string]any{run, again} {
				log := re.log(r["id"].(string))
				if strings.Contains(log, "root:") || strings.Contains(log, secret) {
					t.Fatalf("a run read a host secret through its .git:\n%s", log)
				}
			}
			if again["status"] != "succeeded" {
				t.Fatalf("second run = %v", again)
			}
			// The next run found the .git Berth recorded, not the planted one.
			if log := re.log(again["id"].(string)); !strings.Contains(log, "dotgit gitdir: ") || !strings.Contains(log, "/worktrees/") {
				t.Fatalf("the next run did not start with the recorded admin dir: %q", log)
			}
			fi, err := os.Stat("/etc/shadow")
			if err != nil || fileOwner(fi) != 0 {
				t.Fatalf("/etc/shadow changed hands: %v", err)
			}
			// Negative control: root can read what the runs were refused, and the secret is there.
			if b, err := os.ReadFile("/etc/shadow"); err != nil || !strings.Contains(string(b), "root:") {
				t.Fatalf("negative control: /etc/shadow unreadable to root: %v", err)
			}
			if b, err := os.ReadFile(filepath.Join(re.dataDir, "secret.key")); err != nil || string(b) != secret {
				t.Fatalf("negative control: secret key unreadable: %v", err)
			}
		})
	}
}

// TestRunTokenStaysInItsTask: a run token cannot re-bind its task to another task's workspace,
// close or reopen a workspace, or touch another task's objects (DESIGN §14); it can still read its
// own task and binding (the negative control: the same calls work for a board member).
func TestRunTokenStaysInItsTask(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	other := re.task("true")
	_, otherWS := re.finishedRun(other.ID)
	mine := re.task("true")
	_, ownWS := re.finishedRun(mine.ID)
	tok := re.runTokenOf(mine.ID, ownWS)
	code, binding := re.call(tok, http.MethodGet, "/api/tasks/"+mine.ID+"/workspace", nil)
	if code != http.StatusOK {
		t.Fatalf("run token reading its binding = %d %v", code, binding)
	}
	rev := binding["revision"]
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{http.MethodPut, "/api/tasks/" + mine.ID + "/workspace", map[string]any{"mode": "reuse", "execution_workspace_id": otherWS,
			"revision": rev, "request_key": "rebind-1"}},
		{http.MethodPatch, "/api/execution-workspaces/" + otherWS, map[string]any{"status": "closed"}},
		{http.MethodPatch, "/api/execution-workspaces/" + ownWS, map[string]any{"status": "closed"}},
		{http.MethodGet, "/api/tasks/" + other.ID, nil},
		{http.MethodGet, "/api/execution-workspaces/" + otherWS, nil},
	} {
		if code, out := re.call(tok, c.method, c.path, c.body); code != http.StatusForbidden {
			t.Errorf("run token %s %s = %d %v, want 403", c.method, c.path, code, out)
		}
	}
	if code, out := re.call(tok, http.MethodGet, "/api/tasks/"+mine.ID, nil); code != http.StatusOK {
		t.Errorf("run token reading its own task = %d %v", code, out)
	}
	// Negative control: a board member may re-bind the task to that workspace.
	if code, out := re.call(re.r.Board, http.MethodPut, "/api/tasks/"+mine.ID+"/workspace", map[string]any{"mode": "reuse",
		"execution_workspace_id": otherWS, "revision": rev, "request_key": "rebind-board"}); code != http.StatusOK {
		t.Errorf("board member re-binding = %d %v", code, out)
	}
}

// runTokenOf inserts a running run of task in workspace wsID and mints its run token.
func (re *runEnv) runTokenOf(taskID, wsID string) actor {
	re.t.Helper()
	var id string
	if err := re.pool.QueryRow(context.Background(), `INSERT INTO runs (company_id, task_id, execution_workspace_id, status, command, started_at)
		VALUES ($1, $2, $3, 'running', 'true', now()) RETURNING id`, re.r.A.ID, taskID, wsID).Scan(&id); err != nil {
		re.t.Fatal(err)
	}
	token, hash, err := db.NewToken()
	if err != nil {
		re.t.Fatal(err)
	}
	if err := db.CreateRunToken(context.Background(), re.pool, id, hash, time.Now().Add(time.Hour)); err != nil {
		re.t.Fatal(err)
	}
	return actor{Token: token}
}

func fileOwner(fi os.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}

// TestFinalizeFailureIsVisible: a run whose work cannot be brought home (it committed, then
// destroyed the objects of its own commit) succeeded as a command, but its finalize says it
// failed and why, in the API and on the run page, instead of a plain success; the task branch is
// untouched. (Finalize is retried with backoff; the run says which attempt failed.)
func TestFinalizeFailureIsVisible(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	re.workspaceWith("")
	before := gitOut(t, re.repo, "rev-parse", "main")
	task := re.task(`echo work > work.txt && git add work.txt && git -c user.name=R -c user.email=r@e commit -qm 'run commit' &&
rm -rf "$GIT_OBJECT_DIRECTORY"/[0-9a-f][0-9a-f]`)
	id := re.start(task.ID, nil)
	re.waitRun(id, "the end", ended)
	var run map[string]any
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		_, run = re.call(re.r.Viewer, http.MethodGet, "/api/runs/"+id, nil)
		if f, _ := run["finalize"].(map[string]any); f != nil && f["error"] != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	f, _ := run["finalize"].(map[string]any)
	if run["status"] != "succeeded" || f == nil || (f["state"] != "pending" && f["state"] != "failed") ||
		!strings.Contains(fmt.Sprint(f["error"]), "failed") {
		t.Fatalf("run = %v", run)
	}
	resp, body := re.pageBody(re.r.Viewer, "/runs/"+id)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="run-finalize-error"`) || !strings.Contains(body, "attempt 1") {
		t.Fatalf("run page = %d, no finalize error shown:\n%s", resp.StatusCode, body)
	}
	if got := gitOut(t, re.repo, "rev-parse", "berth/PRJ-1"); got != before {
		t.Fatalf("the task branch moved to %s", got)
	}
	// Negative control: a run that leaves its objects alone settles with its work home.
	ok := re.task(`echo work > ok.txt`)
	okID := re.start(ok.ID, nil)
	okRun := re.waitRun(okID, "the end", ended)
	if fin, _ := re.settled(okRun); fin != "settled" {
		t.Fatalf("control run finalize = %q", fin)
	}
	if _, out := re.call(re.r.Viewer, http.MethodGet, "/api/runs/"+okID, nil); out["finalize"].(map[string]any)["state"] != "settled" {
		t.Fatalf("control run = %v", out)
	}
}
