package terminal

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// Close reasons the server sends in its closed frame.
const (
	ReasonReplaced  = "replaced"        // another client attached
	ReasonFinished  = "setup_finished"  // the session is being captured
	ReasonCancelled = "setup_cancelled" // the session was cancelled
	ReasonTimedOut  = "setup_timed_out" // the session outlived its ttl
)

// StartFunc starts a session's shell. It is called when a session opens, and again when a client
// attaches after the shell ended (it exited, or its grace period passed with no client).
type StartFunc func() (Pty, error)

// Options tune a Registry; zero fields take the defaults.
type Options struct {
	Grace        time.Duration // how long a shell outlives its last client (default 5 min)
	Scrollback   int           // bytes of output replayed to a new client (default 1 MiB)
	WriteTimeout time.Duration // one socket write's deadline (default 10 s)
	PingInterval time.Duration // keepalive pings; a client silent for 3 intervals is dropped (default 20 s)
	AuthTimeout  time.Duration // time allowed for the auth frame (default 10 s)
	// TranscriptMax caps each session's transcript (default 4 MiB); later output is counted, not kept.
	TranscriptMax int64
}

func (o Options) withDefaults() Options {
	if o.Grace <= 0 {
		o.Grace = 5 * time.Minute
	}
	if o.Scrollback <= 0 {
		o.Scrollback = 1 << 20
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 10 * time.Second
	}
	if o.PingInterval <= 0 {
		o.PingInterval = 20 * time.Second
	}
	if o.AuthTimeout <= 0 {
		o.AuthTimeout = 10 * time.Second
	}
	if o.TranscriptMax <= 0 {
		o.TranscriptMax = 4 << 20
	}
	return o
}

// Registry holds this process's live setup shells by session id.
type Registry struct {
	opts     Options
	mu       sync.Mutex
	sessions map[string]*Session
}

// NewRegistry makes an empty registry.
func NewRegistry(o Options) *Registry {
	return &Registry{opts: o.withDefaults(), sessions: map[string]*Session{}}
}

// Options are the registry's effective options.
func (r *Registry) Options() Options { return r.opts }

// ErrClosed means the session was closed (finished, cancelled or timed out): nothing attaches.
var ErrClosed = errors.New("terminal session closed")

// Session is one setup session's shell: the current pty (nil between shells), its scrollback,
// its transcript and the one attached client.
type Session struct {
	id         string
	reg        *Registry
	start      StartFunc
	transcript io.Writer

	mu          sync.Mutex
	ring        *ring
	pty         Pty
	ptyDone     chan struct{} // closed when the current pty's pump has ended
	client      *client
	grace       *time.Timer
	expiry      *time.Timer
	closed      bool
	transcribed int64 // transcript bytes seen (kept up to TranscriptMax)
}

// Open registers a session and starts its shell now; the session closes itself with
// ReasonTimedOut at expires (zero: never). transcript (may be nil) receives the shell's output up
// to the registry's TranscriptMax. Opening an id that is already open returns it unchanged.
func (r *Registry) Open(id string, start StartFunc, expires time.Time, transcript io.Writer) (*Session, error) {
	s, fresh := r.session(id, start, transcript)
	if !fresh {
		return s, nil
	}
	if !expires.IsZero() {
		s.mu.Lock()
		s.expiry = time.AfterFunc(time.Until(expires), func() { r.Close(id, ReasonTimedOut) })
		s.mu.Unlock()
	}
	s.mu.Lock()
	err := s.ensureShell()
	s.mu.Unlock()
	if err != nil {
		r.Close(id, ReasonCancelled)
		return nil, err
	}
	return s, nil
}

func (r *Registry) session(id string, start StartFunc, transcript io.Writer) (*Session, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s, ok := r.sessions[id]; ok {
		return s, false
	}
	s := &Session{id: id, reg: r, start: start, transcript: transcript, ring: newRing(r.opts.Scrollback)}
	r.sessions[id] = s
	return s, true
}

// Get returns the open session with this id, or nil.
func (r *Registry) Get(id string) *Session {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sessions[id]
}

// Close ends a session: the shell is killed (and waited for), the attached client gets
// closed{reason} and a normal close, and the id is forgotten. Closing an unknown id is nothing.
func (r *Registry) Close(id, reason string) {
	r.mu.Lock()
	s := r.sessions[id]
	delete(r.sessions, id)
	r.mu.Unlock()
	if s != nil {
		s.close(reason)
	}
}

// Live reports whether the session's shell is running now.
func (s *Session) Live() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pty != nil
}

// Attached reports whether a client is attached now.
func (s *Session) Attached() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.client != nil
}

// Transcribed is how many output bytes the session has seen (its transcript keeps the first
// TranscriptMax of them).
func (s *Session) Transcribed() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.transcribed
}

// ensureShell starts a shell when none runs. s.mu is held.
func (s *Session) ensureShell() error {
	if s.closed {
		return ErrClosed
	}
	if s.pty != nil {
		return nil
	}
	p, err := s.start()
	if err != nil {
		return err
	}
	s.pty, s.ptyDone = p, make(chan struct{})
	go s.pump(p, s.ptyDone)
	if s.client == nil {
		s.armGrace()
	}
	return nil
}

// pump copies one pty's output into the ring (and the transcript) until the shell ends, then
// tells the attached client its exit code. It never waits for a client.
func (s *Session) pump(p Pty, done chan struct{}) {
	defer close(done)
	buf := make([]byte, 32<<10)
	for {
		n, err := p.Read(buf)
		if n > 0 {
			s.mu.Lock()
			s.ring.write(buf[:n])
			if s.transcript != nil && s.transcribed < s.reg.opts.TranscriptMax {
				keep := min(int64(n), s.reg.opts.TranscriptMax-s.transcribed)
				_, _ = s.transcript.Write(buf[:keep])
			}
			s.transcribed += int64(n)
			c := s.client
			s.mu.Unlock()
			if c != nil {
				c.wakeUp()
			}
		}
		if err != nil {
			break
		}
	}
	code := p.Wait()
	_ = p.Close()
	s.mu.Lock()
	if s.pty == p {
		s.pty = nil
	}
	c := s.client
	s.mu.Unlock()
	if c != nil {
		c.control(frame{Type: "exit", Code: &code})
	}
}

// armGrace (re)starts the timer that ends the shell when no client comes back. s.mu is held.
func (s *Session) armGrace() {
	if s.grace != nil {
		s.grace.Stop()
	}
	s.grace = time.AfterFunc(s.reg.opts.Grace, func() {
		s.mu.Lock()
		p := s.pty
		idle := s.client == nil
		s.mu.Unlock()
		if idle && p != nil {
			_ = p.Close()
		}
	})
}

func (s *Session) close(reason string) {
	s.mu.Lock()
	s.closed = true
	p, done, c := s.pty, s.ptyDone, s.client
	s.client = nil
	for _, t := range []*time.Timer{s.grace, s.expiry} {
		if t != nil {
			t.Stop()
		}
	}
	s.mu.Unlock()
	if p != nil {
		_ = p.Close()
		<-done
	}
	if c != nil {
		c.finish(frame{Type: "closed", Reason: reason})
		select {
		case <-c.done:
		case <-time.After(s.reg.opts.WriteTimeout + time.Second):
		}
	}
}

// attach makes c the session's client (starting a shell if none runs) and returns the client
// it replaced.
func (s *Session) attach(c *client) (*client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.ensureShell(); err != nil {
		return nil, err
	}
	old := s.client
	s.client = c
	if s.grace != nil {
		s.grace.Stop()
	}
	c.off = s.ring.start()
	return old, nil
}

// detach forgets c if it is still the client, and starts the grace period.
func (s *Session) detach(c *client) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client != c {
		return
	}
	s.client = nil
	if !s.closed && s.pty != nil {
		s.armGrace()
	}
}

func (s *Session) input(b []byte) {
	s.mu.Lock()
	p := s.pty
	s.mu.Unlock()
	if p != nil {
		_, _ = p.Write(b)
	}
}

// resize sets the window size of the session's pty; the protocol allows 1–1000 each, whatever
// the pty behind would take.
func (s *Session) resize(cols, rows int) error {
	if cols < 1 || rows < 1 || cols > 1000 || rows > 1000 {
		return fmt.Errorf("resize: %dx%d is out of range", cols, rows)
	}
	s.mu.Lock()
	p := s.pty
	s.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.Resize(cols, rows)
}

// frame is a JSON control frame, either way.
type frame struct {
	Type    string `json:"type"`
	Token   string `json:"token,omitempty"`
	Cols    int    `json:"cols,omitempty"`
	Rows    int    `json:"rows,omitempty"`
	Code    *int   `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

func (f frame) bytes() []byte {
	b, _ := json.Marshal(f)
	return b
}

// client is one attached socket. Its writer goroutine is the only one that writes to conn.
type client struct {
	conn  *websocket.Conn
	s     *Session
	off   int64         // next ring offset to send (writer only, after attach)
	wake  chan struct{} // output arrived
	ctrl  chan frame    // control frames to send
	last  chan frame    // the final frame, then a close
	drop  chan struct{} // closed when the reader is gone: stop now
	done  chan struct{} // closed when the writer has ended (and closed conn)
	once  sync.Once
	dropO sync.Once
}

func newClient(conn *websocket.Conn, s *Session) *client {
	return &client{conn: conn, s: s, wake: make(chan struct{}, 1), ctrl: make(chan frame, 8),
		last: make(chan frame, 1), drop: make(chan struct{}), done: make(chan struct{})}
}

func (c *client) wakeUp() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// control queues a control frame; a client too far behind to take it is dropped.
func (c *client) control(f frame) {
	select {
	case c.ctrl <- f:
	default:
		c.stop()
	}
}

// finish queues the last frame; the writer sends it after the pending output, then closes.
func (c *client) finish(f frame) {
	c.once.Do(func() { c.last <- f })
}

func (c *client) stop() { c.dropO.Do(func() { close(c.drop) }) }

// writeLoop is the socket's one writer: ready, then the scrollback and live output from the
// ring, control frames, pings, and at the end a closed frame and a close.
func (c *client) writeLoop() {
	defer close(c.done)
	defer c.conn.Close()
	o := c.s.reg.opts
	write := func(typ int, b []byte) bool {
		_ = c.conn.SetWriteDeadline(time.Now().Add(o.WriteTimeout))
		return c.conn.WriteMessage(typ, b) == nil
	}
	buf := make([]byte, 32<<10)
	flush := func() (ok bool) {
		for {
			c.s.mu.Lock()
			n, next, lagged := c.s.ring.read(c.off, buf)
			if lagged {
				// More output came than the ring holds while this client was busy: it skips to
				// the oldest byte held (a terminal repaints; the transcript keeps everything).
				c.off = c.s.ring.start()
				n, next, _ = c.s.ring.read(c.off, buf)
			}
			c.s.mu.Unlock()
			if n == 0 {
				return true
			}
			if !write(websocket.BinaryMessage, buf[:n]) {
				return false
			}
			c.off = next
		}
	}
	closeWith := func(f frame) {
		if write(websocket.TextMessage, f.bytes()) {
			_ = c.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, f.Reason),
				time.Now().Add(time.Second))
		}
	}
	if !write(websocket.TextMessage, frame{Type: "ready"}.bytes()) {
		return
	}
	ping := time.NewTicker(o.PingInterval)
	defer ping.Stop()
	for {
		if !flush() {
			return
		}
		select {
		case <-c.wake:
		case f := <-c.ctrl:
			if !flush() || !write(websocket.TextMessage, f.bytes()) {
				return
			}
		case f := <-c.last:
			if flush() {
				closeWith(f)
			}
			return
		case <-ping.C:
			if c.conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(o.WriteTimeout)) != nil {
				return
			}
		case <-c.drop:
			return
		}
	}
}
