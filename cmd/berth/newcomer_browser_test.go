package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The rough edges a newcomer hit (issue 15 item 3), each checked where a person sees it: in the
// browser, on a demo install, with real runs, real git and the real server.

// TestHelpNamesSourceRootsAndNodeID: `berth help` names the two settings a newcomer looked for.
func TestHelpNamesSourceRootsAndNodeID(t *testing.T) {
	t.Parallel()
	_, stderr, _ := runCLI(t, nil, "")
	for _, want := range []string{"BERTH_SOURCE_ROOTS", "BERTH_NODE_ID", "--update"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("usage does not name %s:\n%s", want, stderr)
		}
	}
}

// TestRestartSaysHowToResetPassword: a restarted server, whose admin exists (so no login is
// printed), says how to set a new admin password.
func TestRestartSaysHowToResetPassword(t *testing.T) {
	t.Parallel()
	first := serveDemoForBrowser(t, nil)
	if out := first.Out.String(); !strings.Contains(out, "sign in as admin@example.com") || strings.Contains(out, "--update") {
		t.Fatalf("first start printed:\n%s", out)
	}
	vars := map[string]string{}
	for k, v := range first.Vars {
		vars[k] = v
	}
	vars["BERTH_ADDR"] = freeAddr(t)
	var out syncBuffer
	startServe(t, vars, &out)
	waitHealthy(t, "http://"+vars["BERTH_ADDR"], time.Minute)
	want := "berth user add --email admin@example.com --admin --update"
	if !strings.Contains(out.String(), want) {
		t.Fatalf("the restart does not say %q:\n%s", want, out.String())
	}
}

// newcomerPage is a browser on one demo install with small helpers that fail the test.
type newcomerPage struct {
	t    *testing.T
	ctx  context.Context
	base string
}

func (p newcomerPage) do(name string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	browserStep(p.t, p.ctx, name, actions...)
}

func (p newcomerPage) open(path, waitFor string) {
	p.t.Helper()
	p.do("open "+path, chromedp.Navigate(p.base+path), chromedp.WaitVisible(chromedp.CSS(waitFor)))
}

func (p newcomerPage) text(sel string) string {
	p.t.Helper()
	return evalString(p.t, p.ctx, fmt.Sprintf(`(() => { const e = document.querySelector(%q); return e ? e.innerText : ''; })()`, sel))
}

func (p newcomerPage) count(sel string) int {
	p.t.Helper()
	n, err := chromedp.Run(p.ctx, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, sel)))
	if err != nil {
		p.t.Fatalf("count %s: %v", sel, err)
	}
	return n
}

func (p newcomerPage) eval(js string) {
	p.t.Helper()
	if _, err := chromedp.Run(p.ctx, chromedp.Evaluate[bool](js)); err != nil {
		p.t.Fatalf("evaluate %s: %v", js, err)
	}
}

func (p newcomerPage) path() string {
	p.t.Helper()
	return evalString(p.t, p.ctx, `location.pathname`)
}

// lacks fails the test for each word the visible text of sel contains (ignoring case: CSS
// capitalizes table headings).
func (p newcomerPage) lacks(what, sel string, words ...string) {
	p.t.Helper()
	txt := p.text(sel)
	for _, w := range words {
		if strings.Contains(strings.ToLower(txt), strings.ToLower(w)) {
			p.t.Errorf("%s shows %q:\n%s", what, w, txt)
		}
	}
}

// has fails the test for each word the visible text of sel lacks (ignoring case).
func (p newcomerPage) has(what, sel string, words ...string) {
	p.t.Helper()
	txt := p.text(sel)
	for _, w := range words {
		if !strings.Contains(strings.ToLower(txt), strings.ToLower(w)) {
			p.t.Errorf("%s does not say %q:\n%s", what, w, txt)
		}
	}
}

// waitText reloads path until the text of sel contains want (the close job runs meanwhile).
func (p newcomerPage) waitText(path, sel, want string) {
	p.t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for {
		p.open(path, sel)
		if strings.Contains(p.text(sel), want) {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s never said %q:\n%s", sel, want, p.text(sel))
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// runTask presses Run on the task page at taskPath and waits for the run to succeed.
func (p newcomerPage) runTask(taskPath string) (runPath, workspacePath string) {
	p.t.Helper()
	p.open(taskPath, `#runs button[type=submit]`)
	p.do("run "+taskPath, chromedp.Click(chromedp.CSS(`#runs button[type=submit]`)), chromedp.WaitVisible(chromedp.CSS(`#run-status`)))
	runPath = p.path()
	p.waitText(runPath, `#run-status`, "succeeded") // a reload each time: this test is not about live pages
	return runPath, hrefOf(p.t, p.ctx, `#run-body a[href^="/workspaces/"]`)
}

// newTask creates a task in the project at projectPath and returns its page's path.
func (p newcomerPage) newTask(projectPath, title, command string) string {
	p.t.Helper()
	p.open(projectPath+"/tasks", `#new-task`)
	p.do("new task "+title,
		typeInto(chromedp.CSS(`#new-task-title`), title),
		typeInto(chromedp.CSS(`#new-task-command`), command),
		chromedp.Click(chromedp.CSS(`#new-task button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#plan`)),
	)
	return p.path()
}

// TestBrowserNewcomerRoughEdges walks what the newcomer hit, worst first, on a demo install.
func TestBrowserNewcomerRoughEdges(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	srv := serveDemoForBrowser(t, nil)
	p := newcomerPage{t: t, ctx: ctx, base: srv.Base}
	signIn(t, ctx, srv.Base, "admin@example.com", "a long admin password")

	company := hrefOf(t, ctx, `main a[href^="/companies/"]`)
	p.open(company, `a[href^="/projects/"]`)
	demo := hrefOf(t, ctx, `main a[href^="/projects/"]`)

	// New projects default to isolated; shared is one click away and says what it means.
	if mode, err := chromedp.Run(ctx, chromedp.Value(chromedp.CSS(`#policy-mode`))); err != nil || mode != "isolated" {
		t.Errorf("the new-project form defaults to %q (%v), want isolated", mode, err)
	}
	p.has("the mode hint", `#new-project`, "Shared: tasks run directly in the project workspace's directory")

	// Navigation: admin tools are linked, dashboard counters and activity are links, River's UI
	// leads back, a favicon is served.
	p.open("/", `#dashboard-counts`)
	if n := p.count(`#dashboard-counts a.stat[href]`); n < 10 {
		t.Errorf("%d dashboard counters are links, want all 10", n)
	}
	if p.count(`.mainnav a[href="/admin/jobs"]`) != 1 || p.count(`.mainnav a[href="/admin/workspaces"]`) != 1 {
		t.Errorf("the admin nav does not link jobs and unmanaged directories: %s", p.text(`.mainnav`))
	}
	if p.count(`.activity a[href^="/"]`) == 0 {
		t.Errorf("no activity entry is a link:\n%s", p.text(`.activity`))
	}
	icon := hrefOf(t, ctx, `link[rel=icon]`)
	if resp, err := http.Get(srv.Base + icon); err != nil || resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "image/svg+xml" {
		t.Errorf("favicon %q: %v %v", icon, resp, err)
	} else {
		resp.Body.Close()
	}
	p.open("/admin/jobs", `.berth-back a[href="/"]`)
	p.do("back from River's UI", chromedp.Click(chromedp.CSS(`.berth-back a[href="/"]`)), chromedp.WaitVisible(chromedp.CSS(`#dashboard-counts`)))

	// The leases list keeps the company navigation.
	p.open("/leases", `main`)
	if p.count(`.mainnav a[href="`+company+`/workspaces"]`) != 1 {
		t.Errorf("the leases list dropped the company navigation: %s", p.text(`.mainnav`))
	}

	// A task whose run commits a file. Its plan speaks words, not codes.
	task := p.newTask(demo, "Write a file", "echo hi > out.txt")
	p.lacks("the plan", `#plan`, "environment=", "local local", "a unknown", "None", "project_default_mode", "git_worktree")
	p.has("the plan", `#plan`, "Project default", "isolated", "Git worktree", "environment local")
	if p.count(`#plan [title="project_default_mode"]`) != 1 {
		t.Errorf("the plan trace lost the rule's code in a title")
	}

	// Saving a task confirms it, once.
	p.do("save task",
		chromedp.SetValue(chromedp.CSS(`#edit-task-title`), "Write a file, saved"),
		chromedp.Click(chromedp.CSS(`form[action="`+task+`"] button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#flash`)),
	)
	p.has("the flash", `#flash`, "Task saved.")
	p.open(task, `#plan`)
	if p.count(`#flash`) != 0 {
		t.Errorf("the flash shows twice")
	}
	if p.count(`a`) > 0 && strings.Contains(p.text(`main`), "All tasks and filters") {
		t.Errorf("the task page still offers All tasks and filters")
	}

	// The run page: a title with task, branch, environment and duration; steps in words.
	run, ws := p.runTask(task)
	p.open(run, `#run-status`)
	title := evalString(t, ctx, `document.title`)
	for _, want := range []string{"DEMO-2 run succeeded", "berth/DEMO-2", "local", " s ·", "Berth"} {
		if !strings.Contains(title+" ·", want) {
			t.Errorf("run page title %q lacks %q", title, want)
		}
	}
	p.lacks("the run page", `main`, "realize realize", "realize git_worktree")
	p.has("the run page steps", `main`, "Prepare workspace")

	// The close card of a worktree with an open task and an unmerged commit: blocked, and no
	// destructive way around what cannot be overridden.
	// Finalize commits the run's change after the run ends: wait for it (a reload each time).
	p.waitText(ws, `#close`, "1 commit on the task branch")
	p.open(ws, `#close`)
	p.has("the close card", `#close`, "Blocked", "Open tasks still bound")
	p.lacks("the close card", `#close`, "open_tasks_bound", "ready_with_warnings", "unmerged_work", "ready to close")
	if n := p.count(`#close input[name=confirm_destructive], #close a[href*="confirm_destructive"], #close button[type=submit]`); n != 0 {
		t.Errorf("a blocked close that cannot be overridden still offers %d destructive controls:\n%s", n, p.text(`#close`))
	}
	if p.count(`#close [title="open_tasks_bound"]`) != 1 {
		t.Errorf("the blocker's code is not kept in a title")
	}
	p.has("the git state before the merge", `#close`, "1 commit on the task branch", "Merged into main\tno")

	// After the branch is merged into main, the page still says the branch carries one commit.
	repo := filepath.Join(srv.DataDir, "demo", "repo")
	git := exec.Command("git", "-c", "user.name=T", "-c", "user.email=t@example.com", "merge", "--no-ff", "-q", "-m", "merge", "berth/DEMO-2")
	git.Dir = repo
	git.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	if out, err := git.CombinedOutput(); err != nil {
		t.Fatalf("merge: %v %s", err, out)
	}
	p.open(ws, `#git-since-base`)
	p.has("the git state after the merge", `#close`, "1 commit on the task branch since base", "0 ahead", "Merged into main\tyes")

	// Audit shows names and links, not raw ids.
	p.open(company+"/audit", `#audit-view`)
	if p.count(`#audit-view a[href="`+task+`"]`) == 0 {
		t.Errorf("the audit log does not link the task")
	}
	targets := evalString(t, ctx, `[...document.querySelectorAll('#audit-view tbody td:nth-child(4)')].map(td => td.innerText).join('\n')`)
	if strings.Contains(targets, strings.TrimPrefix(task, "/tasks/")) || !strings.Contains(targets, "DEMO-2 Write a file") {
		t.Errorf("audit targets are not named:\n%s", targets)
	}

	// The status filter is a styled fieldset; the redundant button is gone.
	p.open(demo+"/tasks", `#task-list`)
	if border := evalString(t, ctx, `getComputedStyle(document.querySelector('fieldset.field')).borderTopStyle`); border == "none" {
		t.Errorf("the status fieldset has no border")
	}
	p.lacks("the task list", `main`, "All tasks and filters")

	// Saving the project's policy confirms it.
	p.open(demo, `#edit-project`)
	p.eval(`document.querySelectorAll('details').forEach(d => d.open = true), true`)
	p.do("save policy",
		chromedp.Click(chromedp.CSS(`#edit-project button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#flash`)),
	)
	p.has("the flash", `#flash`, "Project and execution policy saved.")

	// A shared project: closing its workspace says (and does) what happens to the user's own
	// directory, which is nothing.
	own := gitRepo(t)
	// The user's own checkout is writable by the user running the command; as root, Berth runs
	// commands as an unprivileged user, so let that one write here too.
	if err := os.Chmod(own, 0o777); err != nil {
		t.Fatal(err)
	}
	p.open(company, `#new-project`)
	p.do("shared project",
		typeInto(chromedp.CSS(`#project-name`), "In place"),
		typeInto(chromedp.CSS(`#project-key`), "OWN"),
		chromedp.SetValue(chromedp.CSS(`#policy-mode`), "shared"),
		chromedp.Click(chromedp.CSS(`#new-project button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#new-workspace`)),
		typeInto(chromedp.CSS(`#ws-name`), "mine"),
		chromedp.SetValue(chromedp.CSS(`#ws-type`), "git"),
		typeInto(chromedp.CSS(`#ws-source`), own),
		chromedp.Click(chromedp.CSS(`#new-workspace button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`a[href^="/project-workspaces/"]`)),
	)
	shared := p.path()
	sharedTask := p.newTask(shared, "Edit in place", "echo shared > in-place.txt")
	_, sharedWS := p.runTask(sharedTask)
	p.open(sharedTask, `#edit-task-status`)
	p.do("task done",
		chromedp.SetValue(chromedp.CSS(`#edit-task-status`), "done"),
		chromedp.Click(chromedp.CSS(`form[action="`+sharedTask+`"] button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#flash`)),
	)
	p.open(sharedWS, `#close form`)
	p.has("the shared close card", `#close`, "Ready to close, with warnings", "Shared workspace")
	p.lacks("the shared close card", `#close`, "ready_with_warnings", "shared_workspace")
	confirm := evalString(t, ctx, `document.querySelector('#close form').getAttribute('data-confirm')`)
	if !strings.Contains(confirm, "stays exactly as it is") || !strings.Contains(confirm, "no task branch") || strings.Contains(confirm, "deleted") {
		t.Errorf("closing a shared workspace asks %q", confirm)
	}
	p.eval(`document.querySelector('#close form').submit(), true`) // past the confirm dialog
	p.do("close shared", chromedp.WaitVisible(chromedp.CSS(`#flash`)))
	p.has("the close flash", `#flash`, "leaves the project's directory as it is")
	p.waitText(sharedWS, `#close`, "closed")
	p.has("the closed shared card", `#close`, "left untouched", "There is no task branch")
	p.lacks("the closed shared card", `#close`, "directory is gone", "from its task branch")
	if b, err := os.ReadFile(filepath.Join(own, "in-place.txt")); err != nil || string(b) != "shared\n" {
		t.Errorf("the user's directory lost the run's file after the close: %q %v", b, err)
	}

	// A board member who tries a local repository is told the real fix.
	if _, stderr, err := runCLI(t, srv.Vars, "a long member password\n", "user", "add", "--email", "bob@example.com", "--company", "demo", "--role", "board"); err != nil {
		t.Fatalf("user add: %v %s", err, stderr)
	}
	p.do("sign out", chromedp.Click(chromedp.CSS(`#account-menu summary`)), chromedp.Click(chromedp.CSS(`form[action="/logout"] button`)),
		chromedp.WaitVisible(chromedp.CSS(`input[name=password]`)))
	signIn(t, ctx, srv.Base, "bob@example.com", "a long member password")
	p.open(demo, `#new-workspace`)
	p.eval(`document.querySelectorAll('details').forEach(d => d.open = true), true`)
	p.do("local source as a board member",
		typeInto(chromedp.CSS(`#ws-name`), "local"),
		chromedp.SetValue(chromedp.CSS(`#ws-type`), "git"),
		typeInto(chromedp.CSS(`#ws-source`), "file://"+gitRepo(t)),
		typeInto(chromedp.CSS(`#ws-ref`), "main"),
		chromedp.Click(chromedp.CSS(`#new-workspace button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#new-workspace .field-error`)),
	)
	p.has("the refusal", `#new-workspace`, "instance administrator")
	p.has("the offer to ask for the directory", `#source-root-request`, "Ask to allow this directory")
	p.lacks("the refusal", `#new-workspace`, "use a git URL")
}
