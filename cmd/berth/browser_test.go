package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"berth/db/dbtest"
	"berth/environment/jail/jailtest"
)

// browser starts headless Chromium (Debian's package) for one test. Without Chromium the test is
// skipped, unless BERTH_REQUIRE_BROWSER=1 (set by `make test`) makes that a failure.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("BERTH_REQUIRE_BROWSER") == "1" {
			t.Fatal("chromium is not installed (make test installs it)")
		}
		t.Skip("chromium is not installed; run `make test` to install it")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-dev-shm-usage", true),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(allocCtx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 10*time.Minute) // the layout check visits 80 pages; a loaded machine is slow
	t.Cleanup(func() { cancelTimeout(); cancelCtx(); cancelAlloc() })
	return ctx
}

// screenshot saves the page to BERTH_SCREENSHOTS (when set), for people to look at.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("BERTH_SCREENSHOTS")
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// serveForBrowser runs `berth serve` in-process on its own database and returns its base URL.
func serveForBrowser(t *testing.T, extra map[string]string) string {
	t.Helper()
	addr := freeAddr(t)
	dataDir := jailtest.Dir(t)
	vars := map[string]string{"DATABASE_URL": dbtest.ConnString(t), "BERTH_ADDR": addr, "BERTH_DATA_DIR": dataDir,
		"BERTH_ADMIN_EMAIL": "admin@example.com", "BERTH_ADMIN_PASSWORD": "a long admin password", "BERTH_LOG_LEVEL": "warn"}
	for k, v := range extra {
		vars[k] = v
	}
	ctx, cancel := context.WithCancel(context.Background())
	var out, errb bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, env(vars), strings.NewReader(""), &out, &errb) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Error("serve did not stop")
		}
	})
	base := "http://" + addr
	waitHealthy(t, base, time.Minute)
	return base
}

// signIn fills the login form in the browser.
func signIn(t *testing.T, ctx context.Context, base, email, password string) {
	t.Helper()
	err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(chromedp.CSS(`input[name=email]`)),
		typeInto(chromedp.CSS(`input[name=email]`), email),
		typeInto(chromedp.CSS(`input[name=password]`), password),
		chromedp.Click(chromedp.CSS(`form.form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`.page-header h1`)),
	)
	if err != nil {
		t.Fatalf("sign in: %v", err)
	}
}

// TestBrowserSignInOut walks the sign-in page in a real browser: a wrong password shows the
// error, the right one reaches the dashboard, signing out returns to the login page.
func TestBrowserSignInOut(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	base := serveForBrowser(t, nil)

	var errText string
	err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(chromedp.CSS(`input[name=email]`)),
		typeInto(chromedp.CSS(`input[name=email]`), "admin@example.com"),
		typeInto(chromedp.CSS(`input[name=password]`), "not the password"),
		chromedp.Click(chromedp.CSS(`form.form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`.alert-error`)),
	)
	if err != nil {
		t.Fatalf("wrong password: %v", err)
	}
	if errText, err = chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`.alert-error`))); err != nil || !strings.Contains(errText, "incorrect") {
		t.Fatalf("error text %q (%v)", errText, err)
	}
	screenshot(t, ctx, "login-error")

	signIn(t, ctx, base, "admin@example.com", "a long admin password")
	who, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('.who').textContent`)) // in the account menu
	if err != nil || !strings.Contains(who, "admin@example.com") {
		t.Fatalf("top bar shows %q (%v)", who, err)
	}
	screenshot(t, ctx, "dashboard")

	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`#account-menu summary`)),
		chromedp.Click(chromedp.CSS(`form[action="/logout"] button`)),
		chromedp.WaitVisible(chromedp.CSS(`input[name=password]`)),
	); err != nil {
		t.Fatalf("sign out: %v", err)
	}
	loc, _ := chromedp.Run(ctx, chromedp.Location())
	if !strings.HasSuffix(loc, "/login") {
		t.Fatalf("after sign-out the browser is at %s", loc)
	}
}

// gitRepo makes a small repository with one commit on main, as a newcomer's project would be.
func gitRepo(t *testing.T) string {
	t.Helper()
	dir := jailtest.Dir(t)
	if err := makeDemoRepo(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestBrowserNewcomerPath is the newcomer's first session, entirely in the browser: sign in as
// the first admin, create a company, a local environment, a project with a git workspace and a
// task, and read the task's effective plan with its trace.
func TestBrowserNewcomerPath(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	base := serveForBrowser(t, nil)
	repo := gitRepo(t)
	signIn(t, ctx, base, "admin@example.com", "a long admin password")

	step := func(name string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		stepCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(stepCtx, actions...); err != nil {
			screenshot(t, ctx, "failed-"+name)
			if html, herr := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS(`main`))); herr == nil {
				t.Logf("page main:\n%s", html)
			}
			t.Fatalf("%s: %v", name, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}

	step("create company",
		chromedp.WaitVisible(chromedp.CSS(`#create-company`)),
		typeInto(chromedp.CSS(`#company-name`), "Acme Robotics"),
		typeInto(chromedp.CSS(`#company-slug`), "acme"),
		chromedp.Click(chromedp.CSS(`#create-company button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#new-project`)),
	)
	loc, _ := chromedp.Run(ctx, chromedp.Location())
	companyURL := strings.TrimSuffix(loc, "/")
	screenshot(t, ctx, "company-projects-empty")

	step("create local environment",
		chromedp.Navigate(companyURL+"/environments"),
		chromedp.WaitVisible(chromedp.CSS(`#new-environment`)),
		typeInto(chromedp.CSS(`#new-environment-name`), "local"),
		chromedp.Click(chromedp.CSS(`#new-environment button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#environment-page`)),
	)
	screenshot(t, ctx, "environments")

	step("create project",
		chromedp.Navigate(companyURL),
		chromedp.WaitVisible(chromedp.CSS(`#new-project`)),
		typeInto(chromedp.CSS(`#project-name`), "Robot arm"),
		typeInto(chromedp.CSS(`#project-key`), "ARM"),
		chromedp.SetValue(chromedp.CSS(`#policy-mode`), "isolated"),
		chromedp.Click(chromedp.CSS(`#new-project button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#new-workspace`)),
	)
	if envID, err := chromedp.Run(ctx, chromedp.Value(chromedp.CSS(`#policy-environment`))); err != nil || envID == "" {
		t.Fatalf("the new project has no environment (%v); the only environment should have been preselected", err)
	}

	step("add git workspace",
		typeInto(chromedp.CSS(`#ws-name`), "main"),
		chromedp.SetValue(chromedp.CSS(`#ws-type`), "git"),
		typeInto(chromedp.CSS(`#ws-source`), repo),
		typeInto(chromedp.CSS(`#ws-ref`), "main"),
		chromedp.Click(chromedp.CSS(`#new-workspace button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`a[href^="/project-workspaces/"]`)),
	)
	screenshot(t, ctx, "project")
	projectURL, _ := chromedp.Run(ctx, chromedp.Location())

	step("create task",
		chromedp.Navigate(strings.TrimSuffix(projectURL, "/")+"/tasks"),
		chromedp.WaitVisible(chromedp.CSS(`#new-task`)),
		typeInto(chromedp.CSS(`#new-task-title`), "Calibrate the <gripper>"),
		typeInto(chromedp.CSS(`#new-task-command`), "echo calibrated > gripper.txt && echo done calibrating"),
		chromedp.Click(chromedp.CSS(`#new-task button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#plan`)),
	)
	screenshot(t, ctx, "task")

	heading := text(`.page-header h1`)
	if !strings.Contains(heading, "ARM-1") || !strings.Contains(heading, "Calibrate the <gripper>") {
		t.Fatalf("task page heading = %q", heading)
	}
	plan := text(`#plan`)
	// Human labels on the page; the codes stay in title attributes (views/labels.go).
	for _, want := range []string{"Isolated", "Git worktree", "berth/ARM-1", "Project default", "Environment", "Strategy"} {
		if !strings.Contains(plan, want) {
			t.Errorf("plan panel lacks %q:\n%s", want, plan)
		}
	}
	if strings.Contains(plan, "configuration_incomplete") {
		t.Errorf("the plan is blocked:\n%s", plan)
	}
	steps, err := chromedp.Run(ctx, chromedp.Nodes(chromedp.CSSAll(`#plan ol li`)))
	if err != nil || len(steps) < 5 {
		t.Fatalf("trace has %d lines (%v), want one per rule", len(steps), err)
	}

	step("run the task",
		chromedp.Click(chromedp.CSS(`#runs button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#run-body`)),
		chromedp.WaitVisible(chromedp.CSS(`#run-status.badge-ok`)), // the run's own status, not a step's
		chromedp.WaitVisible(chromedp.CSS(`#run-log`)),
	)
	screenshot(t, ctx, "run")
	// The live body may be swapped while it is read: wait for the text rather than read once.
	waitJS(t, ctx, `(document.querySelector('#run-log') || {}).textContent.includes('done calibrating')`)
}

// typeInto types text into the element sel finds, as chromedp.SendKeys does. SendKeys in
// chromedp v0.23.1 reads the node's attributes before taking the node's lock, a data race with
// the DOM events of the page that -race reports; focusing the node and sending the keys to the
// focused element types the same keys without touching the attributes.
func typeInto[S chromedp.Selectable](sel S, text string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(chromedp.Focus(sel, chromedp.NodeVisible), chromedp.KeyEvent(text))
}
