// Package live is the live event hub: it fans the committed changes this node's
// db.EventListener hears (LISTEN berth_events) out to the open GET /events streams, with
// numbering, a catch-up ring and a resync signal (docs/live.md). It owns no route and writes no
// response: handlers parses the stream's filter, checks who may see which companies, and writes
// the Server-Sent Events. It may read db's Event type; it imports nothing else of Berth.
package live

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"berth/db"
)

// Hub fans committed changes (db.EventListener's notifications) out to the GET /events
// streams of this node (docs/live.md). It numbers what it receives and keeps the latest in a
// ring, so a stream that reconnects with Last-Event-ID, or a page that subscribes just after it
// rendered, gets what it missed; when the ring no longer reaches back that far, or the listener
// itself lost its connection, the stream is told to re-read once ("resync"). A subscriber that
// does not keep up is dropped, never waited for: the fan-out must not block on one slow client.
type Hub struct {
	boot   string // distinguishes this process's cursors from another's (or a restarted one's)
	buffer int    // per-subscriber queue length

	mu   sync.Mutex
	seq  uint64
	ring []Event // the last len(ring) events, ring[seq % len]
	subs map[*Subscription]struct{}

	closed    bool // guarded by mu: Close was called; new streams end at once
	listening atomic.Bool
	published atomic.Uint64
	dropped   atomic.Uint64
}

// Event is a change with its number; Resync marks a gap (the listener reconnected, or the
// stream's cursor is out of reach): the page re-reads what it shows once.
type Event struct {
	Seq    uint64
	Change db.Event
	Resync bool
}

// Subscription is one GET /events stream: its filter, the companies it may see, and its queue
// (closed by the hub when the stream is dropped or the hub closes).
type Subscription struct {
	hub       *Hub
	filter    func(db.Event) bool
	companies map[string]bool // guarded by Hub.mu
	all       bool            // an instance admin: every company
	ch        chan Event
}

// ringSize is how many recent events a reconnecting stream can catch up on; a stream that
// missed more than maxReplay of its own gets resync instead.
const (
	ringSize  = 4096
	maxReplay = 64
)

// New makes a hub; buffer is each stream's queue length (0: 256).
func New(buffer int) *Hub {
	if buffer <= 0 {
		buffer = 256
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return &Hub{boot: hex.EncodeToString(b), buffer: buffer, ring: make([]Event, ringSize),
		subs: map[*Subscription]struct{}{}}
}

// Publish hands one committed change to every stream that wants it (db.EventListener.OnEvent).
func (h *Hub) Publish(e db.Event) {
	e.CompanyID = strings.ToLower(e.CompanyID)
	h.publish(Event{Change: e})
}

// Listening is db.EventListener.OnListen: a LISTEN took effect. Whatever was committed while
// no connection listened is unknown, so every stream (and every later catch-up across this
// point) re-reads once.
func (h *Hub) Listening() {
	h.listening.Store(true)
	h.publish(Event{Resync: true})
}

// IsListening reports whether a LISTEN has taken effect since the hub was made.
func (h *Hub) IsListening() bool { return h.listening.Load() }

func (h *Hub) publish(he Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	he.Seq = h.seq
	h.ring[he.Seq%ringSize] = he
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

func (h *Hub) dropLocked(s *Subscription) {
	delete(h.subs, s)
	close(s.ch)
	h.dropped.Add(1)
}

func (h *Hub) cursorLocked() string { return h.boot + "-" + strconv.FormatUint(h.seq, 10) }

// Cursor is the position of the newest event, as a stream sends it in id: lines, and where a
// page rendered now should start its stream (the after= of its /events URL): changes committed
// after the page read its data come after it. "" for no hub.
func (h *Hub) Cursor() string {
	if h == nil {
		return ""
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cursorLocked()
}

// Subscribe makes a stream's subscription with its filter (nil: every change of its
// companies); SetCompanies says which companies it may see, Start connects it.
func (h *Hub) Subscribe(filter func(db.Event) bool) *Subscription {
	return &Subscription{hub: h, filter: filter}
}

// Start connects the subscription and returns, atomically with it, what it missed since cursor
// ("" = nothing to catch up): the matching events after it, or resync when the ring no longer
// reaches back to it or the cursor is another process's. A closed hub closes the queue at once.
func (s *Subscription) Start(cursor string) (missed []Event, resync bool) {
	h := s.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	s.ch = make(chan Event, h.buffer)
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
		if he.Resync {
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
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for s := range h.subs {
		delete(h.subs, s)
		close(s.ch)
	}
}

// C is the subscription's queue (after Start); it is closed when the stream was dropped for
// falling behind or the hub closed.
func (s *Subscription) C() <-chan Event { return s.ch }

// Stop disconnects the subscription (no-op when the hub dropped it already).
func (s *Subscription) Stop() {
	h := s.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[s]; ok {
		delete(h.subs, s)
		close(s.ch)
	}
}

// SetCompanies replaces the companies the stream may see (all: every company, an instance
// admin); called before Start and again whenever membership is re-read while it runs.
func (s *Subscription) SetCompanies(ids []string, all bool) {
	h := s.hub
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[strings.ToLower(id)] = true
	}
	h.mu.Lock()
	s.companies, s.all = m, all
	h.mu.Unlock()
}

// Subscribers is how many streams are connected now.
func (h *Hub) Subscribers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// DropAll cuts every connected stream as if it had fallen behind: each browser reconnects with
// its cursor and catches up from the ring (what a restarted proxy in front of Berth causes).
func (h *Hub) DropAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		h.dropLocked(s)
	}
}

// Published is how many events (changes and resyncs) the hub has numbered since it was made.
func (h *Hub) Published() uint64 { return h.published.Load() }

// Dropped is how many streams were dropped for not keeping up.
func (h *Hub) Dropped() uint64 { return h.dropped.Load() }

// wants reports whether the stream receives the event: a resync always; a change only of a
// company it may see and that its filter matches. Called with Hub.mu held.
func (s *Subscription) wants(he Event) bool {
	if he.Resync {
		return true
	}
	if !s.all && !s.companies[he.Change.CompanyID] {
		return false
	}
	return s.filter == nil || s.filter(he.Change)
}
