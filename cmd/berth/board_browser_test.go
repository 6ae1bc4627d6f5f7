package main

import (
	"context"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
)

// The board in a real browser (issue 25): the command palette and the keyboard shortcuts, dark
// mode with its toggle and a WCAG AA contrast check, the settings page, and the first-run
// checklist. Each test starts its own server and headless Chromium.

// key presses one key (with modifiers) on the focused element.
func key(k string, mods ...chromedp.Modifier) chromedp.Action[chromedp.Void] {
	return chromedp.KeyEvent(k, chromedp.KeyModifiers(mods...))
}

// waitPath waits until the browser is at a path with this prefix.
func waitPath(t *testing.T, ctx context.Context, prefix string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		p := evalString(t, ctx, `location.pathname`)
		if strings.HasPrefix(p, prefix) {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("the browser is at %s, want %s…", p, prefix)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBrowserPaletteAndShortcuts: Ctrl-K opens the palette; typing a task key lists it first,
// grouped with its runs; the arrow keys move the selection and Enter opens it; / opens the
// palette too and Esc closes it; ? lists the shortcuts, and g p / g t go to the company's
// projects and the project's tasks.
func TestBrowserPaletteAndShortcuts(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	base := serveDemoForBrowser(t, nil).Base
	pages := demoWithRun(t, ctx, base)

	browserStep(t, ctx, "palette by Ctrl-K",
		chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS(`.page-header h1`)),
		key("k", chromedp.ModifierCtrl), chromedp.WaitVisible(chromedp.CSS(`#palette-input`)))
	if focused := evalString(t, ctx, `document.activeElement.id`); focused != "palette-input" {
		t.Fatalf("the palette's input is not focused (%q)", focused)
	}
	browserStep(t, ctx, "type a key",
		typeInto(chromedp.CSS(`#palette-input`), "demo-"),
		chromedp.WaitVisible(chromedp.CSS(`#palette-results .palette-hit[data-kind="task"]`)))
	first := evalString(t, ctx, `document.querySelector('#palette-results .palette-hit.active').textContent`)
	if !strings.Contains(strings.ToUpper(first), "DEMO-") {
		t.Fatalf("the first selected hit is %q, want a DEMO task", first)
	}
	groups := evalString(t, ctx, `[...document.querySelectorAll('#palette-results .palette-group')].map(g => g.textContent).join(',')`)
	if !strings.Contains(groups, "Tasks") || !strings.Contains(groups, "Runs") {
		t.Errorf("palette groups = %q, want Tasks and Runs", groups)
	}
	// ArrowDown moves the selection; Enter opens the selected hit.
	second := evalString(t, ctx, `document.querySelectorAll('#palette-results .palette-hit')[1].getAttribute('href')`)
	browserStep(t, ctx, "arrow and enter", key(kbArrowDown))
	if got := evalString(t, ctx, `document.querySelector('#palette-results .palette-hit.active').getAttribute('href')`); got != second {
		t.Fatalf("after ArrowDown the selection is %s, want %s", got, second)
	}
	browserStep(t, ctx, "enter", key(kbEnter))
	waitPath(t, ctx, second)

	// "/" opens it too, Esc closes it; a search for nothing says so.
	browserStep(t, ctx, "slash",
		chromedp.WaitVisible(chromedp.CSS(`.page-header`)), key("/"), chromedp.WaitVisible(chromedp.CSS(`#palette-input`)),
		typeInto(chromedp.CSS(`#palette-input`), "zzz-no-such-thing"), chromedp.WaitVisible(chromedp.CSS(`#palette-empty`)),
		key(kbEscape), chromedp.WaitNotVisible(chromedp.CSS(`#palette`)))

	// ? lists the shortcuts of this page; g p and g t follow them.
	browserStep(t, ctx, "shortcuts",
		chromedp.Navigate(base+pages["task"]), chromedp.WaitVisible(chromedp.CSS(`#plan`)),
		key("?"), chromedp.WaitVisible(chromedp.CSS(`#shortcuts`)))
	list := evalString(t, ctx, `document.querySelector('#shortcuts').textContent`)
	for _, want := range []string{"Search", "Projects", "Tasks of this project", "Workspaces", "Settings"} {
		if !strings.Contains(list, want) {
			t.Errorf("the shortcuts list lacks %q:\n%s", want, list)
		}
	}
	screenshot(t, ctx, "board-shortcuts")
	browserStep(t, ctx, "close shortcuts", key(kbEscape), chromedp.WaitNotVisible(chromedp.CSS(`#shortcuts`)))
	browserStep(t, ctx, "g t", key("g"), key("t"))
	waitPath(t, ctx, pages["tasks"])
	browserStep(t, ctx, "g p", chromedp.WaitVisible(chromedp.CSS(`#task-list`)), key("g"), key("p"))
	if p := waitPath(t, ctx, pages["projects"]); p != pages["projects"] {
		t.Errorf("g p went to %s, want %s", p, pages["projects"])
	}
	// Typing in a field is not a shortcut.
	browserStep(t, ctx, "typing",
		chromedp.Navigate(base+pages["tasks"]), chromedp.WaitVisible(chromedp.CSS(`#new-task-title`)),
		typeInto(chromedp.CSS(`#new-task-title`), "g p /?"))
	if p := evalString(t, ctx, `location.pathname`); p != pages["tasks"] {
		t.Errorf("typing g p in a field navigated to %s", p)
	}
	if open := evalString(t, ctx, `String(document.querySelector('#palette').open || document.querySelector('#shortcuts').open)`); open != "false" {
		t.Error("typing / or ? in a field opened a dialog")
	}
}

// Key names kb.Encode understands.
const (
	kbArrowDown = "\u0301" // kb.ArrowDown
	kbEnter     = "\r"
	kbEscape    = "\u001b"
)

// contrastJS checks every visible text on the page against its background (WCAG 2.1 AA: 4.5:1,
// 3:1 for large text) and returns the failures. Colours are composited (alpha, the backgrounds
// behind); disabled controls are exempt, as WCAG has them.
const contrastJS = `(() => {
	const parse = c => {
		let m = c.match(/^rgba?\((\d+(?:\.\d+)?),\s*(\d+(?:\.\d+)?),\s*(\d+(?:\.\d+)?)(?:,\s*([\d.]+))?\)$/);
		if (m) return [+m[1], +m[2], +m[3], m[4] === undefined ? 1 : +m[4]];
		m = c.match(/^color\(srgb\s+([\d.e-]+)\s+([\d.e-]+)\s+([\d.e-]+)(?:\s*\/\s*([\d.]+))?\)$/);
		if (m) return [m[1] * 255, m[2] * 255, m[3] * 255, m[4] === undefined ? 1 : +m[4]];
		return null;
	};
	const over = (top, under) => { const a = top[3]; return [top[0] * a + under[0] * (1 - a), top[1] * a + under[1] * (1 - a), top[2] * a + under[2] * (1 - a), 1]; };
	const lum = c => { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); }; return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
	const ratio = (a, b) => { const x = lum(a), y = lum(b); return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); };
	const background = el => {
		const layers = [];
		for (let e = el; e; e = e.parentElement) {
			const c = parse(getComputedStyle(e).backgroundColor);
			if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
		}
		let bg = parse(getComputedStyle(document.documentElement).backgroundColor) || [255, 255, 255, 1];
		if (bg[3] < 1) bg = over(bg, [255, 255, 255, 1]);
		for (let i = layers.length - 1; i >= 0; i--) bg = over(layers[i], bg);
		return bg;
	};
	const failures = [];
	const seen = new Set();
	for (const el of document.querySelectorAll('body *')) {
		if (el.closest('.sr-only, .terminal, .xterm, script, style, dialog:not([open]), [disabled], [aria-disabled="true"]')) continue;
		const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
		if (!own) continue;
		const r = el.getBoundingClientRect();
		const cs = getComputedStyle(el);
		if (r.width === 0 || r.height === 0 || cs.visibility === 'hidden') continue;
		let opacity = 1;
		for (let e = el; e; e = e.parentElement) opacity *= +getComputedStyle(e).opacity;
		if (opacity === 0) continue;
		let fg = parse(cs.color);
		if (!fg) continue;
		fg = [fg[0], fg[1], fg[2], fg[3] * opacity];
		const bg = background(el);
		const c = ratio(over(fg, bg), bg);
		const size = parseFloat(cs.fontSize), bold = +cs.fontWeight >= 700;
		const need = size >= 24 || (size >= 18.66 && bold) ? 3 : 4.5;
		if (c + 1e-6 < need) {
			const what = el.tagName.toLowerCase() + (el.className && typeof el.className === 'string' ? '.' + el.className.trim().split(/\s+/).join('.') : '');
			const key = what + cs.color;
			if (seen.has(key)) continue;
			seen.add(key);
			failures.push(what + ' "' + el.textContent.trim().slice(0, 30) + '" ' + c.toFixed(2) + ':1 (needs ' + need + ') ' + cs.color + ' on rgb(' + bg.slice(0, 3).map(Math.round).join(', ') + ')');
		}
	}
	return failures;
})()`

// colorScheme emulates the system's prefers-color-scheme.
func colorScheme(t *testing.T, ctx context.Context, scheme string) {
	t.Helper()
	if _, err := chromedp.Call(ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
		Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}}}); err != nil {
		t.Fatal(err)
	}
}

// TestBrowserDarkModeAndContrast: the pages follow the system's colour scheme; the toggle pins
// light or dark (kept across pages and reloads) and returns to the system's; and every text on
// the main pages, the open palette and the shortcuts list meets WCAG AA contrast in both themes.
// Negative control: a low-contrast text injected into a page is reported.
func TestBrowserDarkModeAndContrast(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	base := serveDemoForBrowser(t, nil).Base
	pages := demoWithRun(t, ctx, base)
	bodyBG := func() string { return evalString(t, ctx, `getComputedStyle(document.body).backgroundColor`) }
	const light, dark = "rgb(246, 247, 249)", "rgb(15, 18, 23)"

	colorScheme(t, ctx, "dark")
	browserStep(t, ctx, "dark system", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS(`#theme-toggle`)))
	if got := bodyBG(); got != dark {
		t.Fatalf("with a dark system the page background is %s, want %s", got, dark)
	}
	// system → light → dark → system
	for _, want := range []struct{ label, bg string }{{"Theme: light", light}, {"Theme: dark", dark}, {"Theme: follows the system", dark}} {
		browserStep(t, ctx, "toggle", chromedp.Click(chromedp.CSS(`#theme-toggle`)))
		if got := evalString(t, ctx, `document.querySelector('#theme-toggle').getAttribute('aria-label')`); got != want.label {
			t.Errorf("toggle says %q, want %q", got, want.label)
		}
		if got := bodyBG(); got != want.bg {
			t.Errorf("%s: background %s, want %s", want.label, got, want.bg)
		}
	}
	browserStep(t, ctx, "pin light", chromedp.Click(chromedp.CSS(`#theme-toggle`)), chromedp.Navigate(base+pages["task"]), chromedp.WaitVisible(chromedp.CSS(`#plan`)))
	if got := bodyBG(); got != light {
		t.Errorf("a pinned light theme is not kept on the next page (background %s)", got)
	}
	browserStep(t, ctx, "back to system", chromedp.Click(chromedp.CSS(`#theme-toggle`)), chromedp.Click(chromedp.CSS(`#theme-toggle`)))

	check := []string{"dashboard", "project", "task", "tasks", "run", "workspace", "environment", "audit", "settings", "admin source roots", "help page"}
	pages["admin source roots"], pages["settings"], pages["help page"] = "/admin/source-roots", "/settings", "/help/pages"
	for _, scheme := range []string{"light", "dark"} {
		colorScheme(t, ctx, scheme)
		for _, name := range check {
			browserStep(t, ctx, name, chromedp.Navigate(base+pages[name]), chromedp.WaitVisible(chromedp.CSS(`main`)))
			fails, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](contrastJS))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range fails {
				t.Errorf("%s, %s theme: %s", name, scheme, f)
			}
		}
		// The open palette with results, and the shortcuts list.
		browserStep(t, ctx, "palette "+scheme, chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS(`.page-header`)),
			key("k", chromedp.ModifierCtrl), typeInto(chromedp.CSS(`#palette-input`), "demo"),
			chromedp.WaitVisible(chromedp.CSS(`#palette-results .palette-hit`)))
		screenshot(t, ctx, "board-palette-"+scheme)
		for _, f := range evalList(t, ctx, contrastJS) {
			t.Errorf("palette, %s theme: %s", scheme, f)
		}
		// "?" is a shortcut only outside a text field: wait until the closed palette gave the focus
		// back (to the page, not its input) before pressing it.
		browserStep(t, ctx, "shortcuts "+scheme, key(kbEscape), chromedp.WaitNotVisible(chromedp.CSS(`#palette`)),
			chromedp.Poll[chromedp.Void](`document.activeElement === null || document.activeElement.id !== 'palette-input'`),
			key("?"), chromedp.WaitVisible(chromedp.CSS(`#shortcuts`)))
		for _, f := range evalList(t, ctx, contrastJS) {
			t.Errorf("shortcuts, %s theme: %s", scheme, f)
		}
		// Negative control: grey on grey must be reported.
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { const p = document.createElement('p'); p.id = 'low-contrast';
			p.textContent = 'hard to read'; p.style.color = getComputedStyle(document.body).backgroundColor; p.style.opacity = '0.9';
			document.querySelector('main').appendChild(p); return true; })()`)); err != nil {
			t.Fatal(err)
		}
		if fails := strings.Join(evalList(t, ctx, contrastJS), "\n"); !strings.Contains(fails, "hard to read") {
			t.Errorf("%s theme: the contrast check misses an injected low-contrast text:\n%s", scheme, fails)
		}
	}
}

// evalList evaluates a JavaScript expression that yields a list of strings.
func evalList(t *testing.T, ctx context.Context, js string) []string {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](js))
	if err != nil {
		t.Fatalf("evaluate: %v", err)
	}
	return v
}

// TestBrowserSettings: on the settings page a token is created (shown once, works on the API),
// revoked (stops working); "sign out other sessions" ends a second session; a password change
// with a wrong current password is refused in place, the right one takes effect.
func TestBrowserSettings(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	base := serveForBrowser(t, nil)
	signIn(t, ctx, base, "admin@example.com", "a long admin password")
	other := httpSession(t, base, "admin@example.com", "a long admin password")

	browserStep(t, ctx, "open settings from the account menu",
		chromedp.Click(chromedp.CSS(`#account-menu summary`)), chromedp.Click(chromedp.CSS(`#account-menu a[href="/settings"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#token-form`)))
	if n := evalString(t, ctx, `String(document.querySelectorAll('#session-list tbody tr').length)`); n != "2" {
		t.Errorf("sessions listed: %s, want 2 (this browser and the other)", n)
	}
	browserStep(t, ctx, "create token",
		typeInto(chromedp.CSS(`#token-name`), "ci"),
		chromedp.Click(chromedp.CSS(`#token-form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#new-token-value`)))
	token := strings.TrimSpace(evalString(t, ctx, `document.querySelector('#new-token-value').textContent`))
	screenshot(t, ctx, "board-settings-token")
	if code := apiStatus(t, base, token); code != 200 {
		t.Fatalf("the new token on /api/me = %d", code)
	}
	browserStep(t, ctx, "settings", chromedp.Navigate(base+"/settings"), chromedp.WaitVisible(chromedp.CSS(`#token-list`)))
	acceptConfirms(t, ctx)
	browserStep(t, ctx, "revoke", chromedp.Click(chromedp.CSS(`#token-list button.btn-danger`)), chromedp.WaitVisible(chromedp.CSS(`#flash`)))
	if code := apiStatus(t, base, token); code != http.StatusUnauthorized {
		t.Errorf("the revoked token on /api/me = %d, want 401", code)
	}
	acceptConfirms(t, ctx)
	browserStep(t, ctx, "sign out others", chromedp.Click(chromedp.CSS(`#sign-out-others`)))
	waitPath(t, ctx, "/settings")
	waitJS(t, ctx, `!!document.querySelector('#flash') && document.querySelector('#flash').textContent.includes('other sessions')`)
	if resp, err := other.Get(base + "/settings"); err != nil || resp.StatusCode != http.StatusSeeOther {
		t.Errorf("the other session after sign-out-others: %v %v, want the sign-in redirect", resp, err)
	}
	browserStep(t, ctx, "wrong current password",
		typeInto(chromedp.CSS(`#current-password`), "not my password"),
		typeInto(chromedp.CSS(`#new-password`), "another long password"),
		typeInto(chromedp.CSS(`#confirm-password`), "another long password"),
		chromedp.Click(chromedp.CSS(`#password-form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#password-form .field-error`)))
	browserStep(t, ctx, "change password",
		typeInto(chromedp.CSS(`#current-password`), "a long admin password"),
		typeInto(chromedp.CSS(`#new-password`), "another long password"),
		typeInto(chromedp.CSS(`#confirm-password`), "another long password"),
		chromedp.Click(chromedp.CSS(`#password-form button[type=submit]`)))
	waitJS(t, ctx, `!!document.querySelector('#flash') && document.querySelector('#flash').textContent.includes('Password changed')`)
	httpSession(t, base, "admin@example.com", "another long password")
}

// httpSession signs in with a plain HTTP client (a second browser) and returns it.
func httpSession(t *testing.T, base, email, password string) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ := http.NewRequest(http.MethodPost, base+"/login", strings.NewReader(url.Values{"email": {email}, "password": {password}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", base)
	resp, err := c.Do(req)
	if err != nil || resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign in as %s: %v %v", email, resp, err)
	}
	resp.Body.Close()
	return c
}

// apiStatus is GET /api/me's status with a bearer token.
func apiStatus(t *testing.T, base, token string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/api/me", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestBrowserOnboarding: a fresh install shows its instance admin the getting-started checklist
// with this machine's findings; each step links to where it is done, and creating the first
// company checks that step off.
func TestBrowserOnboarding(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	base := serveForBrowser(t, nil)
	signIn(t, ctx, base, "admin@example.com", "a long admin password")
	browserStep(t, ctx, "checklist", chromedp.WaitVisible(chromedp.CSS(`#onboarding .checklist`)))
	summary := evalString(t, ctx, `document.querySelector('#onboarding summary').textContent.trim()`)
	if !strings.Contains(summary, "of 5 steps done") {
		t.Errorf("checklist summary = %q", summary)
	}
	if done := evalString(t, ctx, `document.querySelector('#onboarding li[data-step="company"]').className`); strings.Contains(done, "done") {
		t.Fatal("a fresh install says its first company exists")
	}
	if host := evalString(t, ctx, `document.querySelector('#host-checks') ? document.querySelector('#host-checks').nextElementSibling.textContent : ''`); !strings.Contains(host, "bubblewrap") {
		t.Errorf("the machine's findings do not mention bubblewrap: %q", host)
	}
	screenshot(t, ctx, "board-onboarding")
	browserStep(t, ctx, "step link", chromedp.Click(chromedp.CSS(`#onboarding li[data-step="company"] a`)))
	if got := evalString(t, ctx, `location.hash`); got != "#create-company" {
		t.Errorf("the company step links %q, want the create-company form", got)
	}
	browserStep(t, ctx, "create company",
		typeInto(chromedp.CSS(`#company-name`), "Acme"),
		typeInto(chromedp.CSS(`#company-slug`), "acme"),
		chromedp.Click(chromedp.CSS(`#create-company button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#new-project`)),
		chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS(`#onboarding`)))
	if done := evalString(t, ctx, `document.querySelector('#onboarding li[data-step="company"]').className`); !strings.Contains(done, "done") {
		t.Error("after creating a company its step is not done")
	}
	if href := evalString(t, ctx, `document.querySelector('#onboarding li[data-step="environment"] a').getAttribute('href')`); !strings.HasSuffix(href, "/environments") {
		t.Errorf("the environment step links %q, want the company's environments", href)
	}
}

// waitJS waits until a JavaScript expression is true on the page.
func waitJS(t *testing.T, ctx context.Context, js string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js)); err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 30 s for %s", js)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// acceptConfirms answers the page's data-confirm questions with yes (until the next page).
func acceptConfirms(t *testing.T, ctx context.Context) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { window.confirm = () => true; return true; })()`)); err != nil {
		t.Fatal(err)
	}
}
