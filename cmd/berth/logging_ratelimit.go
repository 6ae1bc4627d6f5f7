package main

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// logRepeatWindow is how often one warning or error message may repeat in the log: while the
// database is down River and every request would otherwise log the same failure many times a
// second.
const logRepeatWindow = 10 * time.Second

// rateLimitLogs wraps log so that each warning or error message (by level and message text)
// appears at most once per window: the first occurrence at once, later ones within the window
// counted and summed up in one line at the window's end (its last occurrence, with
// repeated=N). Info and debug lines, such as the request log, pass untouched.
func rateLimitLogs(log *slog.Logger, window time.Duration) *slog.Logger {
	return slog.New(&rateLimited{next: log.Handler(),
		st: &repeatState{window: window, after: afterFunc, open: map[repeatKey]*repeatWindow{}}})
}

func afterFunc(d time.Duration, f func()) { time.AfterFunc(d, f) }

// rateLimited is the slog.Handler of rateLimitLogs; handlers derived with WithAttrs and
// WithGroup share its state, so River's component logger is limited together with the rest.
type rateLimited struct {
	next slog.Handler
	st   *repeatState
}

type repeatKey struct {
	level slog.Level
	msg   string
}

// repeatState holds the open windows: a message is in the map from its first occurrence until
// a window ends in which it did not repeat.
type repeatState struct {
	window time.Duration
	after  func(time.Duration, func()) // time.AfterFunc; tests end windows by hand
	mu     sync.Mutex
	open   map[repeatKey]*repeatWindow
}

// repeatWindow counts the repeats of one message in the current window and keeps the last of
// them for the summary line.
type repeatWindow struct {
	repeats int
	last    slog.Record
	handler slog.Handler
	ctx     context.Context
}

func (h *rateLimited) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *rateLimited) WithAttrs(as []slog.Attr) slog.Handler {
	return &rateLimited{next: h.next.WithAttrs(as), st: h.st}
}

func (h *rateLimited) WithGroup(name string) slog.Handler {
	return &rateLimited{next: h.next.WithGroup(name), st: h.st}
}

func (h *rateLimited) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return h.next.Handle(ctx, r)
	}
	k := repeatKey{r.Level, r.Message}
	st := h.st
	st.mu.Lock()
	if w, ok := st.open[k]; ok {
		w.repeats++
		w.last, w.handler, w.ctx = r.Clone(), h.next, context.WithoutCancel(ctx)
		st.mu.Unlock()
		return nil
	}
	st.open[k] = &repeatWindow{}
	st.mu.Unlock()
	st.after(st.window, func() { st.end(k) })
	return h.next.Handle(ctx, r)
}

// end closes the window of k: without repeats the message is forgotten; with repeats their
// summary is logged and a new window opens.
func (st *repeatState) end(k repeatKey) {
	st.mu.Lock()
	w := st.open[k]
	if w == nil || w.repeats == 0 {
		delete(st.open, k)
		st.mu.Unlock()
		return
	}
	st.open[k] = &repeatWindow{}
	st.mu.Unlock()
	st.after(st.window, func() { st.end(k) })
	r := w.last
	r.AddAttrs(slog.Int("repeated", w.repeats), slog.Duration("within", st.window))
	_ = w.handler.Handle(w.ctx, r)
}
