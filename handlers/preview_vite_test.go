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
// strip_prefix false) opened in headless Chromium through /preview/{id}/: the page renders, its
// HMR WebSocket connects through the proxy, and an edit to a source file shows in the page
// without a reload.
func TestPreviewViteHMR(t *testing.T) {
	t.Parallel()
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
		PortEnv: "PORT", HealthPath: "/", ReadyTimeoutS: 60, StopPolicy: "manual", Lifecycle: "ephemeral", StripPrefix: new(false)}
	ws, src := re.serviceWorkspace("standard", viteFiles, def)
	// The app's own node_modules, a copy of the installed one (the workspace is the app).
	if out, err := exec.Command("cp", "-a", mods, filepath.Join(src, "node_modules")).CombinedOutput(); err != nil {
		t.Fatalf("copy node_modules: %v %s", err, out)
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
	preview := re.ts.URL + sv["url"].(string)

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
		chromedp.SendKeys(chromedp.CSS(`input[name=email]`), re.r.Viewer.User.Email),
		chromedp.SendKeys(chromedp.CSS(`input[name=password]`), "correct horse battery"),
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
