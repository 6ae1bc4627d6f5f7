package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"berth/db/dbtest"
	"berth/environment/jail/jailtest"
)

// The layout check (issue 15 item 4): every main page, at a desktop and a phone width, keeps its
// content inside the viewport and inside its cards, has a title and links back to the dashboard.
// Pages come from a demo install (`serve --demo`) after one real run, so each page has rows,
// steps and logs to lay out, not just empty states.

// layoutWidths are the widths every page is checked at: a desktop, a small laptop or tablet in
// landscape, and a phone.
var layoutWidths = []int64{1400, 1024, 390}

// layoutProblemsJS opens every <details> (a step's log must not widen the page when expanded)
// and returns what is wrong with the page's layout:
//   - the document, or any .card, is wider than its box (naming the elements that stick out);
//     content inside its own scroll box (a log's <pre>, a .table-wrap) scrolls there instead;
//   - a table is wider than its card: at 900 px and more that is a failure whatever scrolls; under
//     900 px a table may scroll inside its .table-wrap only when the wrap says so (.scrolls and the
//     "scroll sideways" hint app.js adds), never silently cut;
//   - text is clipped: an element that hides its overflow (ellipsis or not) while its text is
//     wider than its box; under 900 px a clipped text may stay if its title holds the whole text;
//   - the top bar or the section navigation takes more than one row at 900 px and more;
//   - the page has no title, or nothing links back to the dashboard.
const layoutProblemsJS = `(() => {
	document.querySelectorAll('details').forEach(d => { d.open = true; });
	const wide = window.innerWidth >= 900;
	const berth = !!document.querySelector('body.app'); // River's UI lays itself out: only title and way back
	const scrolls = el => { const o = getComputedStyle(el).overflowX; return o === 'auto' || o === 'scroll' || o === 'hidden' || o === 'clip'; };
	const visible = el => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0 && getComputedStyle(el).visibility !== 'hidden'; };
	const name = el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
		(el.className && typeof el.className === 'string' ? '.' + el.className.trim().split(/\s+/).join('.') : '') +
		' "' + (el.textContent || '').trim().slice(0, 40).replace(/\s+/g, ' ') + '"';
	const culprits = box => {
		const right = box === document.documentElement ? box.clientWidth : box.getBoundingClientRect().left + box.clientLeft + box.clientWidth;
		const out = [];
		for (const el of box.querySelectorAll('*')) {
			// An absolutely placed element escapes a scroll box that is not its containing block.
			let p = el.parentElement, inner = false;
			const pos = getComputedStyle(el).position;
			while (p && p !== box && pos !== 'absolute' && pos !== 'fixed') { if (scrolls(p)) { inner = true; break; } p = p.parentElement; }
			if (inner) continue;
			const r = el.getBoundingClientRect();
			if (r.width > 0 && r.right > right + 1) out.push(name(el) + ' right=' + Math.round(r.right));
			if (out.length >= 4) break;
		}
		if (out.length === 0) { // nothing sticks out by its box: name the widest-reaching elements
			const all = [...box.querySelectorAll('*')].map(el => [el, el.getBoundingClientRect().right + el.scrollWidth - el.clientWidth]);
			all.sort((a, b) => b[1] - a[1]);
			for (const [el, r] of all.slice(0, 3)) out.push('widest ' + name(el) + ' reach=' + Math.round(r));
		}
		return out.join('; ');
	};
	const problems = [];
	const de = document.documentElement;
	if (de.scrollWidth > de.clientWidth) {
		problems.push('page is ' + de.scrollWidth + 'px wide in a ' + de.clientWidth + 'px viewport: ' + culprits(de));
	}
	document.querySelectorAll('.card').forEach((c, i) => {
		if (c.scrollWidth > c.clientWidth + 1) {
			const label = c.getAttribute('aria-label') || c.id || (c.querySelector('h2') || {}).textContent || ('#' + i);
			problems.push('card "' + label.trim() + '" content is ' + c.scrollWidth + 'px in ' + c.clientWidth + 'px: ' + culprits(c));
		}
	});
	// Tables that do not fit their card.
	document.querySelectorAll('main table').forEach(t => {
		if (!berth || !visible(t)) return;
		const wrap = t.closest('.table-wrap');
		const box = wrap || t.parentElement;
		if (box.scrollWidth <= box.clientWidth + 1 && t.getBoundingClientRect().right <= box.getBoundingClientRect().right + 1) return;
		const what = 'table "' + ((t.closest('.card') || {}).id || (t.querySelector('th') || {}).textContent || '').trim().slice(0, 30) + '" is ' + box.scrollWidth + 'px in ' + box.clientWidth + 'px';
		if (wide) { problems.push(what + ': it must fit its card at ' + window.innerWidth + 'px'); return; }
		const hint = wrap && wrap.nextElementSibling;
		if (!wrap || getComputedStyle(wrap).overflowX !== 'auto' || !wrap.classList.contains('scrolls') || !hint || !hint.classList.contains('scroll-hint') || !visible(hint)) {
			problems.push(what + ' and scrolls without saying so (no .scrolls wrap with its hint)');
		}
	});
	// Clipped text: a box that hides what its text needs.
	for (const el of berth ? document.querySelectorAll('header *, nav *, main *') : []) {
		if (el.closest('.sr-only, .terminal, .xterm, pre, .table-wrap, dialog:not([open])') || !visible(el)) continue;
		const cs = getComputedStyle(el);
		if (cs.overflowX !== 'hidden' && cs.overflowX !== 'clip' && cs.textOverflow !== 'ellipsis') continue;
		if (el.scrollWidth <= el.clientWidth + 1) continue;
		const text = (el.textContent || '').trim();
		if (!text) continue;
		const titled = (el.getAttribute('title') || '').trim() === text;
		if (!wide && titled) continue;
		problems.push('clipped text ' + name(el) + ': ' + el.scrollWidth + 'px of text in ' + el.clientWidth + 'px');
	}
	if (wide && berth) {
		const bar = document.querySelector('.topbar'), nav = document.querySelector('.mainnav');
		if (bar && bar.getBoundingClientRect().height > 72) problems.push('the top bar takes ' + Math.round(bar.getBoundingClientRect().height) + 'px: more than one row');
		if (nav && nav.getBoundingClientRect().height > 60) problems.push('the navigation takes ' + Math.round(nav.getBoundingClientRect().height) + 'px: more than one row');
	}
	if (!document.title.trim()) problems.push('the page has no title');
	if (!document.querySelector('a[href="/"]')) problems.push('no link back to the dashboard');
	return problems;
})()`

// demoServer is an in-process `berth serve --demo` on its own database.
type demoServer struct {
	Base    string
	Vars    map[string]string // its environment, for CLI commands against the same database
	DataDir string
	Out     *syncBuffer // what serve printed
}

// serveDemoForBrowser runs `berth serve --demo` in-process on its own database: the install a
// newcomer gets from `make run`.
func serveDemoForBrowser(t *testing.T, extra map[string]string) demoServer {
	t.Helper()
	addr := freeAddr(t)
	d := demoServer{Base: "http://" + addr, DataDir: jailtest.Dir(t), Out: &syncBuffer{}}
	d.Vars = map[string]string{"DATABASE_URL": dbtest.ConnString(t), "BERTH_ADDR": addr, "BERTH_DATA_DIR": d.DataDir,
		"BERTH_ADMIN_EMAIL": "admin@example.com", "BERTH_ADMIN_PASSWORD": "a long admin password", "BERTH_LOG_LEVEL": "warn"}
	for k, v := range extra {
		d.Vars[k] = v
	}
	startServe(t, d.Vars, d.Out)
	waitHealthy(t, d.Base, time.Minute)
	return d
}

// startServe runs `berth serve --demo` with vars until the test ends.
func startServe(t *testing.T, vars map[string]string, out io.Writer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var errb syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve", "--demo"}, env(vars), strings.NewReader(""), out, &errb) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Error("serve did not stop")
		}
	})
}

// browserStep runs actions with a deadline; on failure it logs the page and fails the test.
func browserStep(t *testing.T, ctx context.Context, name string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	stepCtx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	if err := chromedp.Do(stepCtx, actions...); err != nil {
		screenshot(t, ctx, "failed-"+name)
		if html, herr := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS(`main`))); herr == nil {
			t.Logf("page main:\n%s", html)
		}
		t.Fatalf("%s: %v", name, err)
	}
}

// evalString evaluates a JavaScript expression that yields a string.
func evalString(t *testing.T, ctx context.Context, js string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return s
}

// hrefOf is the path of the first link matching sel on the current page ("" when none).
func hrefOf(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	return evalString(t, ctx, fmt.Sprintf(`(() => { const a = document.querySelector(%q); return a ? a.getAttribute('href') : ''; })()`, sel))
}

// demoWithRun signs in to a demo install, gives the demo project a task with a long description
// and a long command, runs it to the end and returns the paths of the pages that now exist.
func demoWithRun(t *testing.T, ctx context.Context, base string) map[string]string {
	t.Helper()
	signIn(t, ctx, base, "admin@example.com", "a long admin password")
	pages := map[string]string{"dashboard": "/", "leases": "/leases", "admin jobs": "/admin/jobs", "admin workspaces": "/admin/workspaces",
		"admin nodes": "/admin/nodes", "admin source roots": "/admin/source-roots", "settings": "/settings", "search": "/search?q=demo",
		"help": "/help", "help page": "/help/pages"}
	company := hrefOf(t, ctx, `main a[href^="/companies/"]`)
	if company == "" {
		t.Fatal("the dashboard links no company")
	}
	pages["projects"] = company
	pages["workspaces"] = company + "/workspaces"
	pages["environments"] = company + "/environments"
	pages["members"] = company + "/members"
	pages["agents"] = company + "/agents"
	pages["audit"] = company + "/audit"

	browserStep(t, ctx, "projects", chromedp.Navigate(base+company), chromedp.WaitVisible(chromedp.CSS(`a[href^="/projects/"]`)))
	pages["project"] = hrefOf(t, ctx, `main a[href^="/projects/"]`)
	pages["tasks"] = pages["project"] + "/tasks"
	browserStep(t, ctx, "project", chromedp.Navigate(base+pages["project"]), chromedp.WaitVisible(chromedp.CSS(`a[href^="/project-workspaces/"]`)))
	pages["project workspace"] = hrefOf(t, ctx, `main a[href^="/project-workspaces/"]`)

	long := strings.Repeat("averyveryverylongwordwithoutanybreaks", 4)
	browserStep(t, ctx, "new task",
		chromedp.Navigate(base+pages["tasks"]),
		chromedp.WaitVisible(chromedp.CSS(`#new-task`)),
		// SetValue, not SendKeys: hundreds of synthesized keys take long on a loaded machine, and
		// typing is not what this checks.
		chromedp.SetValue(chromedp.CSS(`#new-task-title`), "Print a very long line "+long),
		chromedp.SetValue(chromedp.CSS(`#new-task-description`), "A description with "+long+" in it, and more words after it."),
		chromedp.SetValue(chromedp.CSS(`#new-task-command`), "echo "+long+long+" && printf 'line two %s\\n' "+long),
		chromedp.Click(chromedp.CSS(`#new-task button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#plan`)),
	)
	pages["task"] = strings.TrimPrefix(evalString(t, ctx, `location.pathname`), base)
	browserStep(t, ctx, "run",
		chromedp.Click(chromedp.CSS(`#runs button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#run-body`)),
		chromedp.WaitVisible(chromedp.CSS(`#run-status.badge-ok`)),
		chromedp.WaitVisible(chromedp.CSS(`#run-body a[href^="/workspaces/"]`)),
	)
	pages["run"] = evalString(t, ctx, `location.pathname`)
	pages["workspace"] = hrefOf(t, ctx, `#run-body a[href^="/workspaces/"]`)
	pages["files"] = pages["task"] + "/files"
	pages["attempts"] = pages["task"] + "/attempts"

	browserStep(t, ctx, "environments", chromedp.Navigate(base+pages["environments"]), chromedp.WaitVisible(chromedp.CSS(`main a[href^="/environments/"]`)))
	pages["environment"] = hrefOf(t, ctx, `main a[href^="/environments/"]`)
	// A sandbox environment and a setup session on it (its page is the terminal's).
	browserStep(t, ctx, "sandbox environment",
		chromedp.Navigate(base+pages["environments"]+"?driver=sandbox#new-environment"), // the form with the sandbox's fields
		chromedp.WaitReady(chromedp.CSS(`#new-environment input[name=sandbox_fields]`)),
	)
	// Name and submit in one go: a live re-fetch of the page must not swap the form in between.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { const f = document.querySelector('#new-environment');
		f.querySelector('#new-environment-name').value = 'box'; f.requestSubmit(); return true; })()`)); err != nil {
		t.Fatalf("create the sandbox environment: %v", err)
	}
	browserStep(t, ctx, "setup session",
		chromedp.WaitVisible(chromedp.CSS(`#start-setup-session`)),
		chromedp.Click(chromedp.CSS(`#start-setup-session`)),
		chromedp.WaitVisible(chromedp.CSS(`#setup-session`)),
	)
	pages["setup session"] = evalString(t, ctx, `location.pathname`)
	browserStep(t, ctx, "leases", chromedp.Navigate(base+"/leases"), chromedp.WaitVisible(chromedp.CSS(`main a[href^="/leases/"]`)))
	pages["lease"] = hrefOf(t, ctx, `main a[href^="/leases/"]`)
	for name, p := range pages {
		if p == "" {
			t.Fatalf("found no link to the %s page", name)
		}
	}
	return pages
}

// TestBrowserLayout is the layout check: every page of a demo install after a run, at 1400, 1024
// and 390 px, passes layoutProblemsJS (nothing wider than the viewport or its card, tables that
// fit or say they scroll, no clipped text, a one-row shell on wide screens, a title and a way back
// to the dashboard). At 390 px the navigation is a menu behind its button.
func TestBrowserLayout(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	base := serveDemoForBrowser(t, nil).Base
	pages := demoWithRun(t, ctx, base)

	names := []string{"dashboard", "projects", "project", "project workspace", "tasks", "task", "run", "files",
		"workspaces", "workspace", "leases", "lease", "environments", "environment", "members", "agents", "audit",
		"setup session", "admin workspaces", "admin nodes", "admin source roots", "settings", "search", "help", "help page",
		"attempts", "admin jobs"}
	if len(names) != len(pages) {
		t.Fatalf("checking %d pages of %d", len(names), len(pages))
	}
	for _, width := range layoutWidths {
		browserStep(t, ctx, "viewport", chromedp.EmulateViewport(width, 900))
		for _, name := range names {
			browserStep(t, ctx, name, chromedp.Navigate(base+pages[name]), chromedp.WaitReady(chromedp.CSS(`body`)))
			if name == "admin jobs" { // River's UI renders itself in the browser
				browserStep(t, ctx, name, chromedp.Sleep(500*time.Millisecond))
			}
			problems, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](layoutProblemsJS))
			if err != nil {
				t.Fatalf("%s at %dpx: %v", name, width, err)
			}
			screenshot(t, ctx, fmt.Sprintf("layout-%d-%s", width, strings.ReplaceAll(name, " ", "-")))
			for _, p := range problems {
				t.Errorf("%s (%s) at %dpx: %s", name, pages[name], width, p)
			}
		}
	}
	// At a phone's width the sections are behind the Menu button, and open as a list that fits.
	browserStep(t, ctx, "menu", chromedp.EmulateViewport(390, 900), chromedp.Navigate(base+pages["project"]),
		chromedp.WaitVisible(chromedp.CSS(`#nav-toggle`)), chromedp.WaitNotVisible(chromedp.CSS(`#mainnav`)),
		chromedp.Click(chromedp.CSS(`#nav-toggle`)), chromedp.WaitVisible(chromedp.CSS(`#mainnav a[href$="/environments"]`)))
	if problems, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](layoutProblemsJS)); err != nil || len(problems) > 0 {
		t.Errorf("the open menu at 390px: %v %v", problems, err)
	}
	if got := evalString(t, ctx, `document.querySelector('#nav-toggle').getAttribute('aria-expanded')`); got != "true" {
		t.Errorf("the open menu's button says aria-expanded=%s", got)
	}
	screenshot(t, ctx, "layout-390-menu")
	if os.Getenv("BERTH_SCREENSHOTS") != "" {
		t.Logf("screenshots in %s", os.Getenv("BERTH_SCREENSHOTS"))
	}
}

// TestBrowserLayoutCatchesClipping is the layout check's negative control: on a real page it
// must report a table wider than its card (at 1400 px, and at 390 px when it scrolls without
// saying so, or is cut off), and text cut off by its box.
func TestBrowserLayoutCatchesClipping(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	base := serveForBrowser(t, nil)
	signIn(t, ctx, base, "admin@example.com", "a long admin password")
	// A card like the project page's Workspaces card, with one long row that cannot wrap; the
	// second wrap hides its overflow (the columns are cut, with no scroll at all); and a label
	// cut with an ellipsis. Styles through the CSSOM: the page's CSP allows no style attributes.
	const inject = `(() => {
		const card = document.createElement('section'); card.className = 'card'; card.id = 'clipped-card';
		const mk = (hidden) => {
			const wrap = document.createElement('div'); wrap.className = 'table-wrap';
			if (hidden) wrap.style.overflowX = 'hidden';
			const t = document.createElement('table'); t.className = 'table';
			const tr = t.insertRow(); for (const w of ['SERVICES', 'x'.repeat(300)]) { const td = tr.insertCell(); td.textContent = w; td.style.whiteSpace = 'nowrap'; }
			wrap.appendChild(t); card.appendChild(wrap);
		};
		mk(false); mk(true);
		const label = document.createElement('p'); label.textContent = 'a label far too long for its box '.repeat(20);
		label.style.whiteSpace = 'nowrap'; label.style.overflow = 'hidden'; label.style.textOverflow = 'ellipsis';
		card.appendChild(label);
		document.querySelector('main').appendChild(card);
		window.dispatchEvent(new Event('resize')); // app.js marks scrolling wraps
		return true;
	})()`
	for _, width := range []int64{1400, 390} {
		browserStep(t, ctx, "viewport", chromedp.EmulateViewport(width, 900), chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS(`.page-header h1`)))
		before, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](layoutProblemsJS))
		if err != nil || len(before) > 0 {
			t.Fatalf("the dashboard at %dpx before the injection: %v %v", width, before, err)
		}
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](inject)); err != nil {
			t.Fatal(err)
		}
		problems, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](layoutProblemsJS))
		if err != nil {
			t.Fatal(err)
		}
		all := strings.Join(problems, "\n")
		tables := strings.Count(all, "table \"")
		if width == 1400 && tables != 2 || width == 390 && tables != 1 {
			t.Errorf("at %dpx the check reports %d clipped tables, want %d (1400: both; 390: the cut one, the other says it scrolls):\n%s",
				width, tables, map[int64]int{1400: 2, 390: 1}[width], all)
		}
		if !strings.Contains(all, "clipped text p") {
			t.Errorf("at %dpx the check misses the clipped label:\n%s", width, all)
		}
		if width == 390 {
			js := `(() => { const w = document.querySelector('#clipped-card .table-wrap'); const h = w.nextElementSibling;
				return w.classList.contains('scrolls') && !!h && h.classList.contains('scroll-hint'); })()`
			if ok, _ := chromedp.Run(ctx, chromedp.Evaluate[bool](js)); !ok {
				t.Error("at 390px the scrolling table's wrap is not marked, or has no hint")
			}
		}
	}
}
