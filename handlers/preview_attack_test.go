package handlers

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// previewBrowser is a fresh headless Chromium for one test.
func previewBrowser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("BERTH_REQUIRE_BROWSER") == "1" {
			t.Fatal("chromium is not installed")
		}
		t.Skip("chromium is not installed")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-quic", true), chromedp.Flag("disable-dev-shm-usage", true),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(allocCtx)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() { cancel(); cancelCtx(); cancelAlloc() })
	return ctx
}

// probeScript is what a hostile preview page runs: it calls Berth's API as the viewer (a
// relative /api/me, the absolute one, creating a task, with and without a CORS preflight), reads
// another service's preview, and plants cookies. BERTH is "" on Berth's own origin (the negative
// control), so the same calls are then same-origin.
const probeScript = `(async () => {
  const BERTH = %q, PROJECT = %q, OTHER = %q, out = {};
  const probe = async (name, f) => { try { out[name] = await f(); } catch (e) { out[name] = "blocked: " + e.name; } };
  await probe("relative_me", async () => { const r = await fetch("/api/me", {credentials: "include"}); return r.status + " " + await r.text(); });
  await probe("berth_me", async () => { const r = await fetch(BERTH + "/api/me", {credentials: "include"}); return r.status + " " + await r.text(); });
  await probe("create_task", async () => { const r = await fetch(BERTH + "/api/projects/" + PROJECT + "/tasks", {method: "POST",
    credentials: "include", headers: {"Content-Type": "application/json"}, body: JSON.stringify({title: "made by a preview"})});
    return r.status + " " + await r.text(); });
  await probe("create_task_simple", async () => { const r = await fetch(BERTH + "/api/projects/" + PROJECT + "/tasks", {method: "POST",
    mode: "no-cors", credentials: "include", headers: {"Content-Type": "text/plain"}, body: JSON.stringify({title: "made by a preview"})});
    return "sent " + r.type; });
  if (OTHER) await probe("other_preview", async () => { const r = await fetch(OTHER + "/secret", {credentials: "include"}); return r.status + " " + await r.text(); });
  document.cookie = "tossed=1; path=/";
  return JSON.stringify(out);
})()`

// TestPreviewHostilePageBrowser: in real Chromium, a board member opens a preview whose page
// (the run's code) tries to act as them. On the preview origin its relative /api/me reaches only
// its own server, Berth's absolute API answers nothing readable, creating a task fails (no task
// exists afterwards), and another service's preview — one the member has open, whose server
// would even allow a credentialed cross-origin read — is neither read nor reached. Negative
// controls: the same script on Berth's own origin reads /api/me and creates the task, and on the
// other service's own origin it reads that service.
func TestPreviewHostilePageBrowser(t *testing.T) {
	t.Parallel()
	ctx := previewBrowser(t)
	e := setup(t)
	r := e.roles()

	// Service B: a bystander with a secret; it would let any origin read it with credentials.
	var bHits atomic.Int64
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		bHits.Add(1)
		if o := req.Header.Get("Origin"); o != "" {
			w.Header().Set("Access-Control-Allow-Origin", o)
			w.Header().Set("Access-Control-Allow-Credentials", "true")
		}
		fmt.Fprint(w, "secret of service B")
	}))
	t.Cleanup(b.Close)
	// Service A: the hostile page (the script runs from the page's own inline tag).
	var script atomic.Value
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/":
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprintf(w, `<!doctype html><title>hostile</title><p id="out">running</p><script>%s.then(v => { document.getElementById("out").textContent = v; })</script>`, script.Load())
		default:
			http.Error(w, "only the hostile app's own server", http.StatusNotFound)
		}
	}))
	t.Cleanup(a.Close)
	aID := e.previewService(r.A.ID, "running", a.Listener.Addr().(*net.TCPAddr).Port)
	bID := e.otherService(r.A.ID, b.Listener.Addr().(*net.TCPAddr).Port)
	aOrigin, bOrigin := e.origin(aID), e.origin(bID)
	var project string
	if err := e.pool.QueryRow(context.Background(), `SELECT id FROM projects WHERE company_id = $1 AND key = 'PRV'`, r.A.ID).Scan(&project); err != nil {
		t.Fatal(err)
	}
	script.Store(fmt.Sprintf(probeScript, e.ts.URL, project, bOrigin))

	err := chromedp.Do(ctx,
		chromedp.Navigate(e.ts.URL+"/login"),
		chromedp.WaitVisible(chromedp.CSS(`input[name=email]`)),
		typeInto(chromedp.CSS(`input[name=email]`), r.Board.User.Email),
		typeInto(chromedp.CSS(`input[name=password]`), "correct horse battery"),
		chromedp.Click(chromedp.CSS(`form.form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`body.app`)),
		// The member opens B first (so the browser holds B's preview cookie), then A.
		chromedp.Navigate(e.ts.URL+"/preview/"+bID+"/"),
		chromedp.WaitVisible(chromedp.CSS(`body`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	// Negative control: on B's own origin the same read works.
	own, err := chromedp.Run(ctx, chromedp.Evaluate[string](`fetch("/secret", {credentials: "include"}).then(async r => r.status + " " + await r.text())`, chromedp.EvalAwaitPromise))
	if err != nil || own != "200 secret of service B" {
		t.Fatalf("control: B read from its own origin = %q %v", own, err)
	}
	hitsBefore := bHits.Load()

	if err := chromedp.Do(ctx, chromedp.Navigate(e.ts.URL+"/preview/"+aID+"/")); err != nil {
		t.Fatal(err)
	}
	loc, _ := chromedp.Run(ctx, chromedp.Location())
	if !strings.HasPrefix(loc, aOrigin+"/") {
		t.Fatalf("the hostile preview is at %q, want its own origin %s", loc, aOrigin)
	}
	out := waitText(t, ctx, "#out")
	t.Logf("hostile page's probes: %s", out)
	for name, bad := range map[string]string{
		"relative_me": r.Board.User.Email, "berth_me": r.Board.User.Email, "create_task": "201", "other_preview": "secret of service B",
	} {
		if field := probeField(out, name); field == "" || strings.Contains(field, bad) {
			t.Errorf("%s from the preview origin: %q (must not contain %q)", name, field, bad)
		}
	}
	if !strings.Contains(probeField(out, "relative_me"), "only the hostile app") {
		t.Errorf("the relative /api/me did not stay on the preview's own server: %q", probeField(out, "relative_me"))
	}
	if n := bHits.Load() - hitsBefore; n != 0 {
		t.Errorf("the hostile page's request reached service B (%d requests)", n)
	}
	if n := e.count(`SELECT count(*) FROM tasks WHERE title = 'made by a preview'`); n != 0 {
		t.Fatalf("the preview created %d tasks as the viewer", n)
	}

	// Negative control: the same script on Berth's own origin acts as the member.
	if err := chromedp.Do(ctx, chromedp.Navigate(e.ts.URL+"/settings"), chromedp.WaitVisible(chromedp.CSS(`body.app`))); err != nil {
		t.Fatal(err)
	}
	ctl, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(probeScript, "", project, ""), chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(probeField(ctl, "berth_me"), r.Board.User.Email) || !strings.HasPrefix(probeField(ctl, "create_task"), "201") {
		t.Fatalf("control on Berth's origin did not act as the member: %s", ctl)
	}
	if n := e.count(`SELECT count(*) FROM tasks WHERE title = 'made by a preview'`); n != 1 {
		t.Fatalf("control: %d tasks, want the one created on Berth's origin", n)
	}
}

// TestPreviewSetCookieBrowser: in real Chromium, a service's Set-Cookie (a plain cookie, one for
// Berth's session name, one with a Domain attribute) and a cookie its script sets stay on the
// preview origin: Berth's origin sees none of them and its session still works. Control: the
// preview origin itself holds the cookies, so they were set, only confined.
func TestPreviewSetCookieBrowser(t *testing.T) {
	t.Parallel()
	ctx := previewBrowser(t)
	e := setup(t)
	r := e.roles()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Add("Set-Cookie", "planted=1; Path=/")
		w.Header().Add("Set-Cookie", "berth_session=evil; Path=/")
		w.Header().Add("Set-Cookie", "widened=1; Path=/; Domain=localhost")
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprint(w, `<!doctype html><title>cookies</title><p id="out">x</p><script>document.cookie = "tossed=1; path=/"; document.getElementById("out").textContent = "set";</script>`)
	}))
	t.Cleanup(up.Close)
	id := e.previewService(r.A.ID, "running", up.Listener.Addr().(*net.TCPAddr).Port)
	origin := e.origin(id)
	err := chromedp.Do(ctx,
		chromedp.Navigate(e.ts.URL+"/login"),
		chromedp.WaitVisible(chromedp.CSS(`input[name=email]`)),
		typeInto(chromedp.CSS(`input[name=email]`), r.Viewer.User.Email),
		typeInto(chromedp.CSS(`input[name=password]`), "correct horse battery"),
		chromedp.Click(chromedp.CSS(`form.form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`body.app`)),
		chromedp.Navigate(e.ts.URL+"/preview/"+id+"/"),
	)
	if err != nil {
		t.Fatal(err)
	}
	if got := waitText(t, ctx, "#out"); got != "set" {
		t.Fatalf("the preview page did not run: %q", got)
	}
	jar, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.cookie`))
	if err != nil || !strings.Contains(jar, "planted=1") || !strings.Contains(jar, "tossed=1") || !strings.Contains(jar, "widened=1") {
		t.Fatalf("control: the preview origin's cookies = %q %v (want planted, tossed, widened)", jar, err)
	}
	if strings.Contains(jar, "berth_session") {
		t.Errorf("the service set Berth's session name on its origin: %q", jar)
	}
	loc, _ := chromedp.Run(ctx, chromedp.Location())
	if !strings.HasPrefix(loc, origin) {
		t.Fatalf("page at %q, want %s", loc, origin)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(e.ts.URL+"/settings"), chromedp.WaitVisible(chromedp.CSS(`body.app`))); err != nil {
		t.Fatal(err)
	}
	berth, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.cookie`))
	if err != nil || strings.Contains(berth, "planted") || strings.Contains(berth, "tossed") || strings.Contains(berth, "widened") {
		t.Fatalf("Berth's origin holds a preview's cookie: %q %v", berth, err)
	}
	me, err := chromedp.Run(ctx, chromedp.Evaluate[string](`fetch("/api/me").then(r => r.text())`, chromedp.EvalAwaitPromise))
	if err != nil || !strings.Contains(me, r.Viewer.User.Email) {
		t.Fatalf("Berth's session after the preview = %q %v", me, err)
	}
}

// waitText waits for sel's text to leave its placeholder.
func waitText(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err == nil && s != "running" && s != "x" {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s stayed %q (%v)", sel, s, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// probeField is one result of probeScript's JSON ("" when missing or unreadable).
func probeField(out, name string) string {
	var m map[string]string
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		return ""
	}
	return m[name]
}
