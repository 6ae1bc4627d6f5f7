package main

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRateLimitLogs: a warning repeated 500 times in one window is one line at once plus one
// summary line with repeated=499 when the window ends; a window without repeats forgets the
// message; info lines and other messages are untouched; derived loggers share the limit.
func TestRateLimitLogs(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var buf bytes.Buffer
	log := rateLimitLogs(slog.New(slog.NewTextHandler(&lockedWriter{mu: &mu, w: &buf}, nil)), time.Hour)
	st := log.Handler().(*rateLimited).st
	var pending []func()
	st.after = func(_ time.Duration, f func()) { pending = append(pending, f) }
	endWindows := func() {
		fs := pending
		pending = nil
		for _, f := range fs {
			f()
		}
	}
	lines := func() []string {
		mu.Lock()
		defer mu.Unlock()
		s := strings.TrimSpace(buf.String())
		buf.Reset()
		if s == "" {
			return nil
		}
		return strings.Split(s, "\n")
	}

	river := log.With("component", "river")
	for i := range 500 {
		river.Error("producer: error fetching jobs", "attempt", i)
		log.Info("http request", "i", i)
	}
	log.Warn("another warning")
	got := lines()
	if n := len(got); n != 502 {
		t.Fatalf("%d lines, want 500 info + 1 error + 1 other warning", n)
	}
	if !strings.Contains(got[0], "error fetching jobs") || !strings.Contains(got[0], "attempt=0") {
		t.Fatalf("first line %q", got[0])
	}

	endWindows()
	got = lines()
	if len(got) != 1 || !strings.Contains(got[0], "repeated=499") || !strings.Contains(got[0], "attempt=499") ||
		!strings.Contains(got[0], "component=river") {
		t.Fatalf("window end: %q", got)
	}
	// The flood goes on: counted in the new window.
	log.Error("producer: error fetching jobs")
	log.Error("producer: error fetching jobs")
	if got := lines(); len(got) != 0 {
		t.Fatalf("repeats inside the second window were printed: %q", got)
	}
	endWindows()
	if got := lines(); len(got) != 1 || !strings.Contains(got[0], "repeated=2") {
		t.Fatalf("second window end: %q", got)
	}
	// A window without repeats: nothing printed, and the message is forgotten.
	endWindows()
	if got := lines(); len(got) != 0 {
		t.Fatalf("a quiet window printed %q", got)
	}
	log.Error("producer: error fetching jobs", "after", "quiet")
	if got := lines(); len(got) != 1 || !strings.Contains(got[0], "after=quiet") {
		t.Fatalf("after a quiet window: %q", got)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
