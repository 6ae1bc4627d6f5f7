package handlers

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/handlers/live"
)

// liveEnv is a server whose pages are live: an Events hub fed by a real LISTEN on the test
// database.
type liveEnv struct {
	*testEnv
	r      roles
	events *live.Hub
}

func setupLive(t testing.TB, opts ...func(*Deps)) *liveEnv {
	t.Helper()
	events := live.New(0)
	e := setup(t, append(opts, func(d *Deps) { d.Events = events })...)
	listenEvents(t, e.pool, events)
	return &liveEnv{testEnv: e, r: e.roles(), events: events}
}

// listenEvents feeds events from a real LISTEN on the pool's database, and returns once the
// LISTEN took effect.
func listenEvents(t testing.TB, pool *pgxpool.Pool, events *live.Hub) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &db.EventListener{Config: pool.Config().ConnConfig, OnEvent: events.Publish, OnListen: events.Listening,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), MaxBackoff: 200 * time.Millisecond}
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(10 * time.Second)
	for !events.IsListening() {
		if time.Now().After(deadline) {
			t.Fatal("the event listener did not LISTEN within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sseEvent is one received Server-Sent Event.
type sseEvent struct{ name, data, id string }

// stream opens GET /events?query as c and returns its events as they arrive (comments as
// name ":comment"); it fails the test unless the answer is a 200 event stream.
func (e *liveEnv) stream(c *http.Client, query string, headers map[string]string) <-chan sseEvent {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e.t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.ts.URL+"/events?"+query, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		e.t.Fatalf("GET /events?%s = %d %s", query, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	out := make(chan sseEvent, 100)
	go func() {
		defer resp.Body.Close()
		defer close(out)
		sc := bufio.NewScanner(resp.Body)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.name != "" || ev.data != "" {
					out <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, ":"):
				out <- sseEvent{name: ":comment", data: line}
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.data = strings.TrimPrefix(line, "data: ")
			case strings.HasPrefix(line, "id: "):
				ev.id = strings.TrimPrefix(line, "id: ")
			}
		}
	}()
	return out
}

// next is the next event other than a comment, within 10 s.
func next(t testing.TB, ch <-chan sseEvent) sseEvent {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatal("the stream ended")
			}
			if ev.name != ":comment" {
				return ev
			}
		case <-timeout:
			t.Fatal("no event within 10 s")
		}
	}
}

// project makes a project in a company and returns its id.
func (e *liveEnv) project(companyID string) string {
	e.t.Helper()
	var id string
	if err := e.pool.QueryRow(context.Background(), `INSERT INTO projects (company_id, name, key)
		VALUES ($1, 'Live', 'LIVE') RETURNING id`, companyID).Scan(&id); err != nil {
		e.t.Fatal(err)
	}
	return id
}

func (e *liveEnv) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.pool.Exec(context.Background(), sql, args...); err != nil {
		e.t.Fatal(err)
	}
}

// TestEventsAuth: no session is 401, a bad filter 400, another company's filter 404.
func TestEventsAuth(t *testing.T) {
	t.Parallel()
	e := setupLive(t)
	if resp := e.do(e.client(), http.MethodGet, "/events", nil, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("anonymous = %d", resp.StatusCode)
	}
	c := e.browser(e.r.Board)
	for q, want := range map[string]int{"task=nope": 400, "topic=secrets": 400, "company=" + e.r.B.ID: 404} {
		if resp := e.do(c, http.MethodGet, "/events?"+q, nil, nil); resp.StatusCode != want {
			t.Fatalf("?%s = %d, want %d", q, resp.StatusCode, want)
		}
	}
}

// TestEventsCommittedAndCompanyScoped: a member receives their company's committed changes, in
// order, and nothing of another company or of a rolled-back transaction.
func TestEventsCommittedAndCompanyScoped(t *testing.T) {
	t.Parallel()
	e := setupLive(t)
	ctx := context.Background()
	projA := e.project(e.r.A.ID)
	projB := e.project(e.r.B.ID)
	ch := e.stream(e.browser(e.r.Board), "topic=task", nil)
	mk := func(cid, pid, title string) string {
		var id string
		if err := e.pool.QueryRow(ctx, `INSERT INTO tasks (company_id, project_id, number, key, title)
			VALUES ($1, $2, (SELECT coalesce(max(number), 0) + 1 FROM tasks WHERE project_id = $2),
				$3, $3) RETURNING id`, cid, pid, title).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	mk(e.r.B.ID, projB, "B-1") // another company's: never shown
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO tasks (company_id, project_id, number, key, title) VALUES ($1, $2, 99, 'RB-1', 'x')`, e.r.A.ID, projA); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	want := mk(e.r.A.ID, projA, "A-1")
	ev := next(t, ch)
	if ev.name != "task" || !strings.Contains(ev.data, want) || strings.Contains(ev.data, e.r.B.ID) {
		t.Fatalf("first event = %+v, want the task %s of company A", ev, want)
	}
	e.exec(`UPDATE tasks SET updated_at = now() WHERE id = $1`, want)
	if ev := next(t, ch); ev.name != "task" || !strings.Contains(ev.data, want) {
		t.Fatalf("after an update = %+v", ev)
	}
}

// TestEventsCatchUpAndResync: a stream that starts after a page's cursor gets what it missed;
// an unknown cursor, and the listener's reconnection, make it re-read once (resync).
func TestEventsCatchUpAndResync(t *testing.T) {
	t.Parallel()
	e := setupLive(t)
	proj := e.project(e.r.A.ID)
	cursor := e.events.Cursor()
	e.exec(`INSERT INTO tasks (company_id, project_id, number, key, title) VALUES ($1, $2, 1, 'CU-1', 'caught up')`, e.r.A.ID, proj)
	deadline := time.Now().Add(10 * time.Second)
	for e.events.Cursor() == cursor { // the listener has it
		if time.Now().After(deadline) {
			t.Fatal("the insert was not heard")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c := e.browser(e.r.Board)
	if ev := next(t, e.stream(c, "topic=task&after="+cursor, nil)); ev.name != "task" || !strings.Contains(ev.data, "caught") && !strings.Contains(ev.data, `"topic":"task"`) {
		t.Fatalf("caught-up event = %+v", ev)
	}
	if ev := next(t, e.stream(c, "topic=task", map[string]string{"Last-Event-ID": "someone-else-7"})); ev.name != "resync" {
		t.Fatalf("unknown cursor = %+v, want resync", ev)
	}
	live := e.stream(c, "topic=task", nil)
	time.Sleep(100 * time.Millisecond) // subscribed
	e.exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = 'LISTEN berth_events' AND datname = current_database()`)
	if ev := next(t, live); ev.name != "resync" {
		t.Fatalf("after the listener's connection died = %+v, want resync", ev)
	}
}

// TestEventsHeartbeat: an idle stream carries a comment every heartbeat and nothing else.
func TestEventsHeartbeat(t *testing.T) {
	t.Parallel()
	e := setupLive(t)
	e.srv.eventsHeartbeat = 50 * time.Millisecond
	ch := e.stream(e.browser(e.r.Viewer), "", nil)
	timeout := time.After(10 * time.Second)
	for beats := 0; beats < 3; {
		select {
		case ev := <-ch:
			if ev.name != ":comment" {
				t.Fatalf("idle stream sent %+v", ev)
			}
			beats++
		case <-timeout:
			t.Fatal("no heartbeats")
		}
	}
}

// TestEventFilter: each query parameter narrows the events a stream receives.
func TestEventFilter(t *testing.T) {
	t.Parallel()
	const id = "6f0d3a52-7a0f-4e47-9d43-0000000000aa"
	run := db.Event{CompanyID: "c", Topic: "run", ID: id, RunID: id, TaskID: "t1", WorkspaceID: "w1"}
	for _, c := range []struct {
		query string
		ev    db.Event
		want  bool
	}{
		{"run=" + id, run, true},
		{"run=" + id, db.Event{Topic: "operation", ID: "o", RunID: id}, true},
		{"run=6f0d3a52-7a0f-4e47-9d43-0000000000bb", run, false},
		{"topic=lease", run, false},
		{"topic=run,lease", run, true},
		{"session=" + id, db.Event{Topic: "setup_session", ID: id}, true},
		{"session=" + id, db.Event{Topic: "lease", ID: id}, false},
	} {
		q, _ := url.ParseQuery(c.query)
		f, err := parseEventFilter(q)
		if err != nil {
			t.Fatal(err)
		}
		if got := f.match(c.ev); got != c.want {
			t.Errorf("%s match %+v = %v", c.query, c.ev, got)
		}
	}
}

// TestEventsClose: closing the hub (server shutdown) ends open streams and refuses new ones, so
// http.Server.Shutdown does not wait on them.
func TestEventsClose(t *testing.T) {
	t.Parallel()
	e := setupLive(t)
	c := e.browser(e.r.Viewer)
	open := e.stream(c, "", nil)
	deadline := time.Now().Add(10 * time.Second)
	for e.events.Subscribers() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("not subscribed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.events.Close()
	for _, ch := range []<-chan sseEvent{open, e.stream(c, "", nil)} {
		timeout := time.After(10 * time.Second)
	drain:
		for {
			select {
			case _, ok := <-ch:
				if !ok {
					break drain
				}
			case <-timeout:
				t.Fatal("a stream did not end after Close")
			}
		}
	}
}

// TestEventsEndWithAccess: a stream ends soon after its member is removed from the company it
// filters on, and after its session is signed out.
func TestEventsEndWithAccess(t *testing.T) {
	t.Parallel()
	e := setupLive(t)
	e.srv.eventsHeartbeat = 20 * time.Millisecond
	ends := func(what string, ch <-chan sseEvent) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case _, ok := <-ch:
				if !ok {
					return
				}
			case <-timeout:
				t.Fatalf("%s: the stream went on", what)
			}
		}
	}
	viewer := e.stream(e.browser(e.r.Viewer), "company="+e.r.A.ID, nil)
	e.exec(`DELETE FROM memberships WHERE user_id = $1`, e.r.Viewer.User.ID)
	ends("membership removed", viewer)

	c := e.browser(e.r.Board)
	board := e.stream(c, "", nil)
	if resp := e.do(c, http.MethodPost, "/logout", nil, nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout = %d", resp.StatusCode)
	}
	ends("signed out", board)
}
