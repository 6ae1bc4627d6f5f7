package handlers

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"berth/handlers/live"
)

// requestLog records what the page asks for (CDP Network events) and the SSE messages it gets.
type requestLog struct {
	mu       sync.Mutex
	requests []string // URL paths with query, in order
	messages int      // SSE messages the page received
}

func (l *requestLog) listen(ev any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch e := ev.(type) {
	case *network.EventRequestWillBeSent:
		u := e.Request.URL
		if i := strings.Index(u, "//"); i >= 0 {
			if j := strings.Index(u[i+2:], "/"); j >= 0 {
				u = u[i+2+j:]
			}
		}
		l.requests = append(l.requests, u)
	case *network.EventEventSourceMessageReceived:
		l.messages++
	}
}

// since returns the requests made after the first n, and how many there are now.
func (l *requestLog) since(n int) ([]string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.requests[n:]...), len(l.requests)
}

func (l *requestLog) received() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.messages
}

// TestLivePagesBrowser: in headless Chromium, a task page that is open when a run is started
// through the API shows the run without a reload; the run page shows its status and log
// advance; every request either page makes after loading is a fragment re-fetch answering an
// SSE event (never more re-fetches than events), and an idle page makes none at all.
func TestLivePagesBrowser(t *testing.T) {
	t.Parallel()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("BERTH_REQUIRE_BROWSER") == "1" {
			t.Fatal("chromium is not installed")
		}
		t.Skip("chromium is not installed")
	}
	events := live.New(0)
	re := setupRuns(t, func(d *Deps) { d.Events = events })
	listenEvents(t, re.pool, events)
	re.workspaceWith("")
	task := re.task(`echo line-one; sleep 2; echo line-two; sleep 2; echo line-three`)

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
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	log := &requestLog{}
	if err := chromedp.Listen(ctx, log.listen); err != nil {
		t.Fatal(err)
	}

	// subscribed waits until the page's stream is connected (one subscriber on the hub).
	subscribed := func(what string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for events.Subscribers() != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d streams connected, want 1", what, events.Subscribers())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// idle waits until nothing has changed for a second, then checks that the page asks for
	// nothing for 3 s while nothing changes.
	idle := func(what string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for last := events.Published(); ; {
			time.Sleep(time.Second)
			now := events.Published()
			if now == last {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: changes did not stop", what)
			}
			last = now
		}
		_, n := log.since(0)
		before := events.Published()
		time.Sleep(3 * time.Second)
		reqs, _ := log.since(n)
		if events.Published() != before {
			t.Fatalf("%s: something changed during the idle check", what)
		}
		if len(reqs) != 0 {
			t.Fatalf("%s: an idle page made %d requests: %v", what, len(reqs), reqs)
		}
	}
	// liveFragments is how many elements of the page re-fetch on an SSE event.
	liveFragments := func() int {
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('[hx-trigger*="sse:"]').length`))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// fragmentsOnly checks that every request since n re-fetched the given fragment, and that
	// there were no more of them than SSE messages received.
	fragmentsOnly := func(what string, n, messagesBefore int, fragment string) {
		t.Helper()
		reqs, _ := log.since(n)
		for _, r := range reqs {
			if r != fragment {
				t.Fatalf("%s: the page requested %s (want only %s)", what, r, fragment)
			}
		}
		if got := log.received() - messagesBefore; len(reqs) > got {
			t.Fatalf("%s: %d re-fetches for %d events", what, len(reqs), got)
		}
	}
	waitText := func(sel, want, what string) string {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
			if err == nil && strings.Contains(strings.ToLower(text), want) {
				return text
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s shows %q (err %v), want %q", what, sel, text, err, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	err = chromedp.Do(ctx,
		chromedp.Navigate(re.ts.URL+"/login"),
		chromedp.WaitVisible(chromedp.CSS(`input[name=email]`)),
		typeInto(chromedp.CSS(`input[name=email]`), re.r.Board.User.Email),
		typeInto(chromedp.CSS(`input[name=password]`), "correct horse battery"),
		chromedp.Click(chromedp.CSS(`form.form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`body.app`)),
		chromedp.Navigate(re.ts.URL+"/tasks/"+task.ID),
		chromedp.WaitVisible(chromedp.CSS(`#runs`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	subscribed("task page")
	idle("task page before the run")

	// A run started elsewhere (the API) appears on the open task page.
	_, n := log.since(0)
	m := log.received()
	runID := re.start(task.ID, nil)
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#runs a[href="/runs/`+runID+`"]`))); err != nil {
		t.Fatal(err)
	}
	re.waitRun(runID, "ended", ended)
	waitText(`#runs`, "succeeded", "task page after the run")
	// The task page re-fetched its own fragments (runs panel, plan, ...), nothing else, and at
	// most once per live fragment per event.
	reqs, _ := log.since(n)
	for _, r := range reqs {
		if r != "/tasks/"+task.ID && !strings.HasPrefix(r, "/tasks/"+task.ID+"/") && !strings.HasPrefix(r, "/tasks/"+task.ID+"?fragment=") {
			t.Fatalf("task page requested %s while the run went", r)
		}
	}
	if got, live := log.received()-m, liveFragments(); len(reqs) > got*live || len(reqs) == 0 {
		t.Fatalf("task page: %d re-fetches for %d events and %d live fragments", len(reqs), got, live)
	}
	re.settled(re.waitRun(runID, "ended", ended))
	idle("task page after the run")
	// The task's status, changed elsewhere, shows in its header.
	if code, out := re.call(re.r.Board, "PATCH", "/api/tasks/"+task.ID, map[string]any{"status": "in_review"}); code != 200 {
		t.Fatalf("PATCH task = %d %v", code, out)
	}
	waitText(`#task-status`, "in review", "task header after a status change elsewhere")
	idle("task page after the status change")

	// The run page of a new run: status and log advance as the run goes, by events alone.
	run2 := re.start(task.ID, nil)
	if err := chromedp.Do(ctx, chromedp.Navigate(re.ts.URL+"/runs/"+run2), chromedp.WaitVisible(chromedp.CSS(`#run-body`))); err != nil {
		t.Fatal(err)
	}
	_, n = log.since(0)
	m = log.received()
	subscribed("run page")
	waitText(`#run-body`, "line-one", "run page, first line")
	waitText(`#run-body`, "running", "run page while running")
	waitText(`#run-body`, "line-three", "run page, last line")
	waitText(`#run-body`, "succeeded", "run page when done")
	fragmentsOnly("run page", n, m, "/runs/"+run2+"?fragment=run")
	re.settled(re.waitRun(run2, "ended", ended))
	idle("run page after the run")

	// The stream is cut (as a restarted proxy would): the browser reconnects with Last-Event-ID
	// and, nothing having changed, re-fetches nothing.
	_, n = log.since(0)
	events.DropAll()
	subscribed("run page after its stream was cut")
	idle("run page after reconnecting")
	if reqs, _ := log.since(n); len(reqs) != 1 || !strings.HasPrefix(reqs[0], "/events?") {
		t.Fatalf("after its stream was cut the page requested %v, want only the stream again", reqs)
	}

	// The node's LISTEN connection dies: whatever committed meanwhile is unknown, so the page
	// re-reads once (one re-fetch per live fragment), then is idle again.
	_, n = log.since(0)
	live := liveFragments()
	if _, err := re.pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE query = 'LISTEN berth_events' AND datname = current_database()`); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		reqs, _ := log.since(n)
		if len(reqs) >= live {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the listener reconnected the page made %d requests, want %d: %v", len(reqs), live, reqs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	idle("run page after the resync")
	if reqs, _ := log.since(n); len(reqs) != live {
		t.Fatalf("resync: %d requests for %d live fragments: %v", len(reqs), live, reqs)
	}

	// The other live pages: each, open and idle, re-fetches its fragments when something it
	// shows changes, and asks for nothing else.
	var wsID, envID string
	if err := re.pool.QueryRow(context.Background(), `SELECT execution_workspace_id, environment_id FROM runs WHERE id = $1`,
		run2).Scan(&wsID, &envID); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ page, change, fragment string }{
		{"/workspaces/" + wsID, `UPDATE execution_workspaces SET cleanup_reason = 'changed' WHERE id = '` + wsID + `'`,
			"/workspaces/" + wsID + "?fragment=body"},
		{"/leases", `UPDATE environment_leases SET cleanup_attempts = cleanup_attempts + 1 WHERE run_id = '` + run2 + `'`, "/leases"},
		{"/environments/" + envID, `UPDATE environments SET updated_at = now() WHERE id = '` + envID + `'`, "/environments/" + envID},
		{"/", `UPDATE tasks SET title = 'Renamed' WHERE id = '` + task.ID + `'`, "/"},
	} {
		if err := chromedp.Do(ctx, chromedp.Navigate(re.ts.URL+c.page), chromedp.WaitVisible(chromedp.CSS(`body.app`))); err != nil {
			t.Fatal(err)
		}
		subscribed(c.page)
		idle(c.page + " before the change")
		_, n := log.since(0)
		m := log.received()
		if _, err := re.pool.Exec(context.Background(), c.change); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			if reqs, _ := log.since(n); len(reqs) > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no re-fetch after %s", c.page, c.change)
			}
			time.Sleep(50 * time.Millisecond)
		}
		idle(c.page + " after the change")
		fragmentsOnly(c.page, n, m, c.fragment)
	}
}

// typeInto types text into the element sel finds, as chromedp.SendKeys does. SendKeys in
// chromedp v0.23.1 reads the node's attributes before taking the node's lock, a data race with
// the DOM events of the page that -race reports; focusing the node and sending the keys to the
// focused element types the same keys without touching the attributes.
func typeInto[S chromedp.Selectable](sel S, text string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(chromedp.Focus(sel, chromedp.NodeVisible), chromedp.KeyEvent(text))
}
