package handlers

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"berth/db"
)

// Events fans committed changes (db.EventListener's notifications) out to the GET /events
// streams of this node (docs/live.md). It numbers what it receives and keeps the latest in a
// ring, so a stream that reconnects with Last-Event-ID, or a page that subscribes just after it
// rendered, gets what it missed; when the ring no longer reaches back that far, or the listener
// itself lost its connection, the stream is told to re-read once ("resync"). A subscriber that
// does not keep up is dropped, never waited for: the fan-out must not block on one slow client.
type Events struct {
	boot   string // distinguishes this process's cursors from another's (or a restarted one's)
	buffer int    // per-subscriber queue length

	mu   sync.Mutex
	seq  uint64
	ring []hubEvent // the last len(ring) events, ring[seq % len]
	subs map[*subscriber]struct{}

	closed    bool // guarded by mu: Close was called; new streams end at once
	listening atomic.Bool
	published atomic.Uint64
	dropped   atomic.Uint64
}

// hubEvent is an event with its number; resync marks a gap (the listener reconnected).
type hubEvent struct {
	seq    uint64
	ev     db.Event
	resync bool
}

// subscriber is one GET /events stream: its filter, the companies it may see, and its queue
// (closed by the hub when the subscriber is dropped).
type subscriber struct {
	filter    eventFilter
	companies map[string]bool // guarded by Events.mu
	all       bool            // an instance admin: every company
	ch        chan hubEvent
}

// ringSize is how many recent events a reconnecting stream can catch up on; a stream that
// missed more than maxReplay of its own gets resync instead.
const (
	ringSize  = 4096
	maxReplay = 64
)

// NewEvents makes a hub; buffer is each stream's queue length (0: 256).
func NewEvents(buffer int) *Events {
	if buffer <= 0 {
		buffer = 256
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return &Events{boot: hex.EncodeToString(b), buffer: buffer, ring: make([]hubEvent, ringSize),
		subs: map[*subscriber]struct{}{}}
}

// Publish hands one committed change to every stream that wants it (db.EventListener.OnEvent).
func (h *Events) Publish(e db.Event) {
	e.CompanyID = strings.ToLower(e.CompanyID)
	h.publish(hubEvent{ev: e})
}

// Listening is db.EventListener.OnListen: a LISTEN took effect. Whatever was committed while
// no connection listened is unknown, so every stream (and every later catch-up across this
// point) re-reads once.
func (h *Events) Listening() {
	h.listening.Store(true)
	h.publish(hubEvent{resync: true})
}

// IsListening reports whether a LISTEN has taken effect since the hub was made.
func (h *Events) IsListening() bool { return h.listening.Load() }

func (h *Events) publish(he hubEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	he.seq = h.seq
	h.ring[he.seq%ringSize] = he
	h.published.Add(1)
	for s := range h.subs {
		if !s.wants(he) {
			continue
		}
		select {
		case s.ch <- he:
		default: // too slow: drop it; its browser reconnects and catches up from the ring
			h.dropLocked(s)
		}
	}
}

func (h *Events) dropLocked(s *subscriber) {
	delete(h.subs, s)
	close(s.ch)
	h.dropped.Add(1)
}

// cursor is the position of the newest event, as a stream sends it in id: lines.
func (h *Events) cursor() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cursorLocked()
}

func (h *Events) cursorLocked() string { return h.boot + "-" + strconv.FormatUint(h.seq, 10) }

// Cursor is where a page rendered now should start its stream (the after= of its /events URL):
// changes committed after the page read its data come after it.
func (h *Events) Cursor() string {
	if h == nil {
		return ""
	}
	return h.cursor()
}

// subscribe registers a stream and returns, atomically with it, what it missed since cursor
// ("" = nothing to catch up): the matching events after it, or resync when the ring no longer
// reaches back to it or the cursor is another process's.
func (h *Events) subscribe(s *subscriber, cursor string) (missed []hubEvent, resync bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s.ch = make(chan hubEvent, h.buffer)
	if h.closed {
		close(s.ch) // the server is shutting down: the stream ends and its browser reconnects elsewhere
		return nil, false
	}
	h.subs[s] = struct{}{}
	if cursor == "" {
		return nil, false
	}
	boot, n, ok := strings.Cut(cursor, "-")
	seq, err := strconv.ParseUint(n, 10, 64)
	if !ok || err != nil || boot != h.boot || seq > h.seq || h.seq-seq >= ringSize {
		return nil, true
	}
	for i := seq + 1; i <= h.seq; i++ {
		he := h.ring[i%ringSize]
		if he.resync {
			return nil, true
		}
		if s.wants(he) {
			missed = append(missed, he)
		}
	}
	if len(missed) > maxReplay {
		return nil, true // one re-read is cheaper than replaying a long history
	}
	return missed, false
}

// Close ends every stream, now and later (http.Server.RegisterOnShutdown): Shutdown waits for
// handlers to return, and a stream returns only when it is told to.
func (h *Events) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for s := range h.subs {
		delete(h.subs, s)
		close(s.ch)
	}
}

// unsubscribe removes a stream (no-op when the hub dropped it already).
func (h *Events) unsubscribe(s *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[s]; ok {
		delete(h.subs, s)
		close(s.ch)
	}
}

// setCompanies replaces the companies a stream may see (membership re-read while it runs).
func (h *Events) setCompanies(s *subscriber, ids []string, all bool) {
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[strings.ToLower(id)] = true
	}
	h.mu.Lock()
	s.companies, s.all = m, all
	h.mu.Unlock()
}

// Subscribers is how many streams are connected now.
func (h *Events) Subscribers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// Dropped is how many streams were dropped for not keeping up.
func (h *Events) Dropped() uint64 { return h.dropped.Load() }

// wants reports whether the stream receives the event: a resync always; a change only of a
// company it may see and that its filter matches. Called with Events.mu held.
func (s *subscriber) wants(he hubEvent) bool {
	if he.resync {
		return true
	}
	if !s.all && !s.companies[he.ev.CompanyID] {
		return false
	}
	return s.filter.match(he.ev)
}
