package handlers

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
)

// TestSetupSessionBrowser types into the real xterm.js page in headless Chromium (CDP
// Input.insertText, then one Enter key), sees the shell's answer, reloads, and sees it again from
// the replayed scrollback.
func TestSetupSessionBrowser(t *testing.T) {
	t.Parallel()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("BERTH_REQUIRE_BROWSER") == "1" {
			t.Fatal("chromium is not installed")
		}
		t.Skip("chromium is not installed")
	}
	ie := setupImages(t)
	code, sess := ie.call(ie.r.Admin, http.MethodPost, "/api/environments/"+ie.env+"/image-setup-sessions", nil)
	if code != 201 {
		t.Fatalf("start = %d %v", code, sess)
	}
	id := sess["id"].(string)

	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
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

	connected := `#setup-session[data-terminal="connected"]`
	var screen string
	err = chromedp.Do(ctx,
		chromedp.Navigate(ie.ts.URL+"/login"),
		chromedp.WaitVisible(chromedp.CSS(`input[name=email]`)),
		typeInto(chromedp.CSS(`input[name=email]`), ie.r.Admin.User.Email),
		typeInto(chromedp.CSS(`input[name=password]`), "correct horse battery"),
		chromedp.Click(chromedp.CSS(`form.form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`body.app`)),
		chromedp.Navigate(ie.ts.URL+"/image-setup-sessions/"+id),
		chromedp.WaitVisible(chromedp.CSS(connected)),
		chromedp.Focus(chromedp.CSS(`.xterm-helper-textarea`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, input.InsertText, input.InsertTextParams{Text: "echo browser-$((20+1))"}); err != nil {
		t.Fatal(err)
	}
	for _, typ := range []input.DispatchKeyEventType{input.DispatchKeyEventTypeRawKeyDown, input.DispatchKeyEventTypeKeyUp} {
		if _, err := chromedp.Call(ctx, input.DispatchKeyEvent, input.DispatchKeyEventParams{Type: typ, Key: "Enter", Code: "Enter",
			WindowsVirtualKeyCode: 13, NativeVirtualKeyCode: 13}); err != nil {
			t.Fatal(err)
		}
	}
	waitScreen := func(what string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			if screen, err = chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`.xterm-rows`))); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(screen, "browser-21") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the terminal shows %q", what, screen)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitScreen("after typing")
	if err := chromedp.Do(ctx, chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(connected))); err != nil {
		t.Fatal(err)
	}
	waitScreen("after a reload (scrollback replayed)")
	if n := ie.count(`SELECT count(*) FROM audit_events WHERE action = 'terminal_token.minted' AND target_id = $1`, id); n < 2 {
		t.Fatalf("%d tokens minted for two attaches", n)
	}
}
