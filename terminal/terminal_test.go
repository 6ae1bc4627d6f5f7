package terminal

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// bridge is a test server: one registry, sessions started by start, and an authorizer that
// admits the token "good-<session>" once per mint.
type bridge struct {
	t     *testing.T
	reg   *Registry
	ts    *httptest.Server
	mu    sync.Mutex
	valid map[string]string // token → session
	start func() (Pty, error)
}

func newBridge(t *testing.T, o Options, start func() (Pty, error)) *bridge {
	b := &bridge{t: t, reg: NewRegistry(o), valid: map[string]string{}, start: start}
	up := websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}
	b.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := strings.TrimPrefix(r.URL.Path, "/")
		conn, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		_ = b.reg.Serve(context.Background(), conn, id, func(ctx context.Context, token string) (Attach, error) {
			b.mu.Lock()
			sid, ok := b.valid[token]
			delete(b.valid, token) // spent, whatever happens next
			b.mu.Unlock()
			if !ok || sid != id {
				return Attach{}, &Refusal{Message: "bad token"}
			}
			return Attach{Start: b.start}, nil
		})
	}))
	t.Cleanup(func() {
		b.ts.Close()
	})
	return b
}

func (b *bridge) mint(session string) string {
	tok, _ := NewToken()
	b.mu.Lock()
	b.valid[tok] = session
	b.mu.Unlock()
	return tok
}

// peer is a test client.
type peer struct {
	t    *testing.T
	conn *websocket.Conn
	out  strings.Builder
}

func (b *bridge) dial(session string) *peer {
	b.t.Helper()
	c, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(b.ts.URL, "http")+"/"+session, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { c.Close() })
	return &peer{t: b.t, conn: c}
}

func (b *bridge) attach(session string) *peer {
	p := b.dial(session)
	p.text(map[string]any{"type": "auth", "token": b.mint(session)})
	if f := p.control(5 * time.Second); f.Type != "ready" {
		b.t.Fatalf("first frame = %+v, want ready", f)
	}
	return p
}

func (p *peer) text(v any) {
	p.t.Helper()
	if err := p.conn.WriteJSON(v); err != nil {
		p.t.Fatal(err)
	}
}

func (p *peer) keys(s string) {
	p.t.Helper()
	if err := p.conn.WriteMessage(websocket.BinaryMessage, []byte(s)); err != nil {
		p.t.Fatal(err)
	}
}

// control reads until a control frame arrives (collecting output on the way).
func (p *peer) control(d time.Duration) frame {
	p.t.Helper()
	_ = p.conn.SetReadDeadline(time.Now().Add(d))
	for {
		typ, b, err := p.conn.ReadMessage()
		if err != nil {
			p.t.Fatalf("read: %v (output so far %q)", err, p.out.String())
		}
		if typ == websocket.BinaryMessage {
			p.out.Write(b)
			continue
		}
		var f frame
		if err := json.Unmarshal(b, &f); err != nil {
			p.t.Fatal(err)
		}
		return f
	}
}

// until reads output until it contains want.
func (p *peer) until(want string, d time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(d)
	for !strings.Contains(p.out.String(), want) {
		_ = p.conn.SetReadDeadline(deadline)
		typ, b, err := p.conn.ReadMessage()
		if err != nil {
			p.t.Fatalf("waiting for %q: %v (output %q)", want, err, tail(p.out.String()))
		}
		if typ == websocket.BinaryMessage {
			p.out.Write(b)
		}
	}
}

// closed reads until the connection ends and returns the close code (or -1).
func (p *peer) closed(d time.Duration) (int, []frame) {
	p.t.Helper()
	_ = p.conn.SetReadDeadline(time.Now().Add(d))
	var frames []frame
	for {
		typ, b, err := p.conn.ReadMessage()
		if err != nil {
			if ce, ok := err.(*websocket.CloseError); ok {
				return ce.Code, frames
			}
			return -1, frames
		}
		if typ == websocket.TextMessage {
			var f frame
			_ = json.Unmarshal(b, &f)
			frames = append(frames, f)
		}
	}
}

func tail(s string) string {
	if len(s) > 300 {
		return "…" + s[len(s)-300:]
	}
	return s
}

// shell starts a real /bin/sh on a real pty.
var shell = plainStart([]string{"PATH=/usr/bin:/bin", "PS1=$ ", "TERM=dumb"}, "/bin/sh", "-i")

func TestRealPtyEchoResizeAndExit(t *testing.T) {
	t.Parallel()
	b := newBridge(t, Options{}, shell)
	p := b.attach("s1")
	p.keys("echo hi-$((40+2))\n")
	p.until("hi-42", 5*time.Second)
	p.text(map[string]any{"type": "resize", "cols": 123, "rows": 45})
	p.keys("stty size\n")
	p.until("45 123", 5*time.Second)
	p.text(map[string]any{"type": "resize", "cols": 0, "rows": 45})
	if f := p.control(5 * time.Second); f.Type != "error" {
		t.Fatalf("bad resize answered %+v, want an error frame", f)
	}
	p.keys("exit 7\n")
	f := p.control(5 * time.Second)
	if f.Type != "exit" || f.Code == nil || *f.Code != 7 {
		t.Fatalf("after exit: %+v, want exit 7", f)
	}
}

func TestRefusals(t *testing.T) {
	t.Parallel()
	b := newBridge(t, Options{AuthTimeout: 300 * time.Millisecond}, shell)
	for _, tc := range []struct {
		name string
		send func(p *peer)
	}{
		{"garbage token", func(p *peer) { p.text(map[string]any{"type": "auth", "token": "garbage"}) }},
		{"another session's token", func(p *peer) { p.text(map[string]any{"type": "auth", "token": b.mint("other")}) }},
		{"keystrokes before auth", func(p *peer) { p.keys("ls\n") }},
		{"not an auth frame", func(p *peer) { p.text(map[string]any{"type": "resize", "cols": 80, "rows": 24}) }},
		{"no auth frame", func(p *peer) {}},
	} {
		p := b.dial("s1")
		tc.send(p)
		code, frames := p.closed(5 * time.Second)
		if code != websocket.ClosePolicyViolation || len(frames) != 1 || frames[0].Type != "error" || frames[0].Message == "" {
			t.Errorf("%s: close %d frames %+v, want an error frame and 1008", tc.name, code, frames)
		}
	}
	// A replayed token: the first use spends it.
	tok := b.mint("s1")
	p := b.dial("s1")
	p.text(map[string]any{"type": "auth", "token": tok})
	if f := p.control(5 * time.Second); f.Type != "ready" {
		t.Fatalf("first use: %+v", f)
	}
	q := b.dial("s1")
	q.text(map[string]any{"type": "auth", "token": tok})
	if code, _ := q.closed(5 * time.Second); code != websocket.ClosePolicyViolation {
		t.Fatalf("replayed token: close %d, want 1008", code)
	}
	if b.reg.Get("s1") == nil || !b.reg.Get("s1").Attached() {
		t.Fatal("the refused replay disturbed the attached client")
	}
}

func TestReconnectReplaysScrollbackAndTakeOver(t *testing.T) {
	t.Parallel()
	b := newBridge(t, Options{}, shell)
	p := b.attach("s1")
	p.keys("echo marker-$((1+1))\n")
	p.until("marker-2", 5*time.Second)

	// A second attach takes over: the first gets closed {replaced}, the second the scrollback.
	q := b.attach("s1")
	q.until("marker-2", 5*time.Second)
	code, frames := p.closed(5 * time.Second)
	if code != websocket.CloseNormalClosure || len(frames) == 0 || frames[len(frames)-1].Reason != ReasonReplaced {
		t.Fatalf("replaced client: close %d frames %+v", code, frames)
	}
	q.keys("echo still-$((2+3))\n")
	q.until("still-5", 5*time.Second)

	// A client that vanishes without a close frame: the shell lives on, and the next attach
	// replays everything.
	q.conn.UnderlyingConn().Close()
	s := b.reg.Get("s1")
	waitFor(t, func() bool { return !s.Attached() }, "the vanished client to be detached")
	if !s.Live() {
		t.Fatal("the shell died with its client")
	}
	r := b.attach("s1")
	r.until("still-5", 5*time.Second)
	if !strings.Contains(r.out.String(), "marker-2") {
		t.Fatalf("replay lacks earlier output: %q", tail(r.out.String()))
	}
}

func TestGraceEndsAnAbandonedShell(t *testing.T) {
	t.Parallel()
	b := newBridge(t, Options{Grace: 300 * time.Millisecond}, shell)
	before := runtime.NumGoroutine()
	p := b.attach("s1")
	p.keys("echo x\n")
	p.until("x", 5*time.Second)
	p.conn.UnderlyingConn().Close()
	s := b.reg.Get("s1")
	waitFor(t, func() bool { return !s.Live() }, "the shell to end after the grace period")
	b.reg.Close("s1", ReasonCancelled)
	waitFor(t, func() bool { return runtime.NumGoroutine() <= before+2 }, "goroutines to be freed")
}

// fakePty prints an endless stream (like `yes`) until closed.
type fakePty struct {
	once   sync.Once
	closed chan struct{}
	line   []byte
}

func newYes() *fakePty {
	return &fakePty{closed: make(chan struct{}), line: []byte(strings.Repeat("y\r\n", 10000))}
}

func (f *fakePty) Read(p []byte) (int, error) {
	select {
	case <-f.closed:
		return 0, io.EOF
	case <-time.After(time.Millisecond): // ≈ 30 MB/s, faster than a pty
	}
	return copy(p, f.line), nil
}
func (f *fakePty) Write(p []byte) (int, error) { return len(p), nil }
func (f *fakePty) Resize(int, int) error       { return nil }
func (f *fakePty) Wait() int                   { <-f.closed; return -1 }
func (f *fakePty) Close() error                { f.once.Do(func() { close(f.closed) }); return nil }

func TestClientThatNeverReadsIsCutOff(t *testing.T) {
	t.Parallel()
	for _, real := range []bool{false, true} {
		start := func() (Pty, error) { return newYes(), nil }
		if real {
			start = plainStart(nil, "yes")
		}
		b := newBridge(t, Options{WriteTimeout: 300 * time.Millisecond}, start)
		p := b.dial("s1")
		p.text(map[string]any{"type": "auth", "token": b.mint("s1")})
		s := func() *Session { return b.reg.Get("s1") }
		waitFor(t, func() bool { return s() != nil && (s().Attached() || s().Transcribed() > 0) }, fmt.Sprintf("the attach (real %v)", real))
		// Never read: the server's writes block, the deadline (or the lag) cuts the client off.
		waitFor(t, func() bool { return !s().Attached() }, "the stalled client to be cut off")
		if !s().Live() {
			t.Fatal("the pty died with the stalled client")
		}
		n := s().Transcribed()
		waitFor(t, func() bool { return s().Transcribed() > n+1<<20 }, "the pty to keep printing")
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		if ms.HeapInuse > 256<<20 {
			t.Fatalf("heap in use %d MiB after a stalled client", ms.HeapInuse>>20)
		}
		q := b.attach("s1")
		q.until("y\r\n", 5*time.Second)
		printed := s().Transcribed()
		b.reg.Close("s1", ReasonCancelled)
		t.Logf("real pty %v: %d MiB printed while stalled and after, heap in use %d MiB", real, printed>>20, ms.HeapInuse>>20)
	}
}

func TestCloseSendsReason(t *testing.T) {
	t.Parallel()
	b := newBridge(t, Options{}, shell)
	p := b.attach("s1")
	b.reg.Close("s1", ReasonFinished)
	code, frames := p.closed(5 * time.Second)
	if code != websocket.CloseNormalClosure || len(frames) == 0 || frames[len(frames)-1].Reason != ReasonFinished {
		t.Fatalf("close %d frames %+v, want closed {setup_finished}", code, frames)
	}
	q := b.dial("s1")
	q.text(map[string]any{"type": "auth", "token": b.mint("s1")})
	if f := q.control(5 * time.Second); f.Type != "ready" {
		// A closed id is forgotten: a new attach opens a fresh session (the server side decides,
		// by the session's status in the database, whether that may happen).
		t.Fatalf("attach after close: %+v", f)
	}
}

func TestRing(t *testing.T) {
	t.Parallel()
	r := newRing(8)
	r.write([]byte("abcdef"))
	buf := make([]byte, 16)
	n, next, lagged := r.read(0, buf)
	if string(buf[:n]) != "abcdef" || next != 6 || lagged {
		t.Fatalf("read = %q %d %v", buf[:n], next, lagged)
	}
	r.write([]byte("ghijklmnop"))
	if _, _, lagged := r.read(6, buf); !lagged {
		t.Fatal("a reader 16 bytes behind an 8-byte ring is not lagged")
	}
	n, next, _ = r.read(r.start(), buf)
	if string(buf[:n]) != "ijklmnop" || next != 16 {
		t.Fatalf("tail = %q %d", buf[:n], next)
	}
}

func TestTokens(t *testing.T) {
	t.Parallel()
	a, ha := NewToken()
	b, _ := NewToken()
	if a == b || len(a) != 43 {
		t.Fatalf("tokens %q %q", a, b)
	}
	if h, ok := HashToken(a); !ok || h != ha {
		t.Fatal("a minted token does not hash to its stored form")
	}
	for _, bad := range []string{"", "garbage", a + "x", strings.Repeat("A", 44)} {
		if _, ok := HashToken(bad); ok {
			t.Errorf("HashToken(%q) accepted", bad)
		}
	}
}

func waitFor(t *testing.T, ok func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
