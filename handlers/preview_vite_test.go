package handlers

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"berth/db"
	"berth/environment/jail"
)

// viteModules is the node_modules holding vite that scripts/test-deps.sh installs
// (BERTH_TEST_NPM overrides the directory): outside /root and /tmp, so the jail's berth-run
// user reads it.
func viteModules(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("BERTH_TEST_NPM")
	if dir == "" {
		dir = "/var/tmp/berth-test-npm"
	}
	mods := filepath.Join(dir, "node_modules")
	if _, err := os.Stat(filepath.Join(mods, "vite", "bin", "vite.js")); err != nil {
		if os.Getenv("BERTH_REQUIRE_BROWSER") == "1" {
			t.Fatalf("vite is not installed in %s: run scripts/test-deps.sh", dir)
		}
		t.Skipf("vite is not installed in %s (scripts/test-deps.sh installs it)", dir)
	}
	return mods
}

// viteFiles is a minimal Vite app: main.js shows msg.js's message and accepts its own updates.
var viteFiles = map[string]string{
	"package.json": `{"name": "preview-app", "private": true, "type": "module"}`,
	"index.html":   `<!doctype html><html><head><title>vite preview</title></head><body><p id="app">loading</p><script type="module" src="./main.js"></script></body></html>`,
	"main.js": `import { msg } from './msg.js'
document.getElementById('app').textContent = msg
if (import.meta.hot) import.meta.hot.accept()
`,
	"msg.js": "export const msg = 'first version'\n",
}

// TestPreviewViteHMR: a real Vite dev server started as a service (--base "$BERTH_PREVIEW_BASE",
// strip_prefix false, so the base is /preview/{id}/) opened in headless Chromium at its url on
// its own preview origin: the ticket flow signs the browser in there, the page renders, its HMR
// WebSocket connects through the preview listener, and an edit to a source file shows in the
// page without a reload. TestPreviewViteHMRRoot does the same with the default base "/".
func TestPreviewViteHMR(t *testing.T) { t.Parallel(); testViteHMR(t, false) }

// TestPreviewViteHMRRoot: TestPreviewViteHMR with the default strip_prefix (BERTH_PREVIEW_BASE
// is "/": Vite is served at its preview origin's root).
func TestPreviewViteHMRRoot(t *testing.T) { t.Parallel(); testViteHMR(t, true) }

// testViteHMR runs Vite as a service, strip_prefix as given, and edits it live in Chromium.
func testViteHMR(t *testing.T, strip bool) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("BERTH_REQUIRE_BROWSER") == "1" {
			t.Fatal("chromium is not installed")
		}
		t.Skip("chromium is not installed")
	}
	mods := viteModules(t)
	re := setupRuns(t)
	def := db.ServiceDefinition{Name: "vite", Command: `exec ./node_modules/.bin/vite --base "$BERTH_PREVIEW_BASE" --port "$PORT" --strictPort --host 127.0.0.1 --clearScreen false`,
		PortEnv: "PORT", HealthPath: "/", ReadyTimeoutS: 60, StopPolicy: "manual", Lifecycle: "ephemeral", StripPrefix: new(strip)}
	ws, src := re.serviceWorkspace("standard", viteFiles, def)
	// The app's own node_modules, a copy of the installed one (the workspace is the app).
	if out, err := exec.Command("cp", "-a", mods, filepath.Join(src, "node_modules")).CombinedOutput(); err != nil {
		t.Fatalf("copy node_modules: %v %s", err, out)
	}
	// A shared workspace is the user's checkout, which under a root Berth must be writable by the
	// run user (docs/security.md): Vite writes node_modules/.vite.
	if os.Geteuid() == 0 {
		if out, err := exec.Command("chown", "-R", jail.RunUser+":", src).CombinedOutput(); err != nil {
			t.Fatalf("give the checkout to %s: %v %s", jail.RunUser, err, out)
		}
	}
	if code, out := re.call(re.r.Board, "POST", "/api/execution-workspaces/"+ws.ID+"/runtime-services/start", map[string]any{"name": "vite"}); code != 202 {
		t.Fatalf("start = %d %v", code, out)
	}
	sv := re.waitService(ws.ID, "vite", "running and healthy", func(sv map[string]any) bool {
		if sv["status"] == "failed" {
			t.Fatalf("vite failed: %v", sv)
		}
		return sv["status"] == "running" && sv["health"] == "healthy"
	})
	// The service's url is on its own preview origin (http://localhost:PORT/, Berth being at
	// 127.0.0.1): opening it signs the browser in there through Berth (a ticket), then lands on
	// Vite's page under its base.
	preview := sv["url"].(string)
	if !strings.HasPrefix(preview, "http://localhost:") {
		t.Fatalf("vite's url = %q, want its preview origin", preview)
	}

	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-quic", true), chromedp.Flag("disable-dev-shm-usage", true),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancelCtx := chromedp.NewContext(allocCtx)
	defer cancelCtx()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	var mu sync.Mutex
	var console []string
	err = chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*runtime.EventConsoleAPICalled); ok {
			var parts []string
			for _, a := range e.Args {
				parts = append(parts, strings.Trim(string(a.Value), `"`))
			}
			mu.Lock()
			console = append(console, strings.Join(parts, " "))
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	logged := func(s string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, l := range console {
			if strings.Contains(l, s) {
				return true
			}
		}
		return false
	}
	err = chromedp.Do(ctx,
		chromedp.Navigate(re.ts.URL+"/login"),
		chromedp.WaitVisible(chromedp.CSS(`input[name=email]`)),
		typeInto(chromedp.CSS(`input[name=email]`), re.r.Viewer.User.Email),
		typeInto(chromedp.CSS(`input[name=password]`), "correct horse battery"),
		chromedp.Click(chromedp.CSS(`form.form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`body.app`)),
		chromedp.Navigate(preview),
	)
	if err != nil {
		t.Fatal(err)
	}
	text := func() string {
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#app`)))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("%s did not happen within 30 s; page %q; console %q", what, text(), console)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	wait("the page rendering", func() bool { return text() == "first version" })
	want := "/" // Vite's base on the preview origin
	if !strip {
		want = "/preview/" + sv["id"].(string) + "/"
	}
	loc, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil || loc != strings.TrimSuffix(preview, "/")+want {
		t.Fatalf("the page is at %q (%v), want %s%s", loc, err, strings.TrimSuffix(preview, "/"), want)
	}
	wait("the HMR WebSocket connecting", func() bool { return logged("[vite] connected") })
	// A mark on the window: a reload would lose it.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.berthMark = true`)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "msg.js"), []byte("export const msg = 'second version'\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wait("the edit showing", func() bool { return text() == "second version" })
	mark, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.berthMark === true`))
	if err != nil || !mark {
		t.Fatalf("the page reloaded for the edit (mark %v, %v); console %q", mark, err, console)
	}
	if !logged("[vite] hot updated") {
		t.Errorf("no hot update was logged: %q", console)
	}
}
