package preview

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// streamFlushDelay is how long a body of unknown length may wait unflushed for the service's
// next bytes.
const streamFlushDelay = time.Millisecond

// copyBody writes resp's status and body to w (its header already in w). A body of known length
// is written as it is read. An event stream is flushed at once and after every read. Any other
// body of unknown length is flushed only when the service keeps the proxy waiting for its next
// bytes longer than p.flushDelay (streamFlushDelay); and when it came whole with its first
// read, it goes out with a Content-Length (unless mayFrame is false: a trailer follows), in as
// few writes as net/http allows, rather than chunked with its end in a write of its own.
func (p *Proxy) copyBody(w http.ResponseWriter, resp *http.Response, mayFrame bool) error {
	buf := p.buffers.Get()
	defer p.buffers.Put(buf)
	if resp.ContentLength >= 0 {
		w.WriteHeader(resp.StatusCode)
		_, err := io.CopyBuffer(writerOnly{w}, resp.Body, buf)
		return err
	}
	s := &stream{rc: http.NewResponseController(w), w: w, status: resp.StatusCode, now: eventStream(resp.Header)}
	s.mu.Lock()
	defer s.stop()
	if s.now {
		s.sendHeader()
		_ = s.rc.Flush() // the header now: the first event may be a while
	} else {
		s.t = time.AfterFunc(p.flushDelay, s.fire)
	}
	for first := true; ; first = false {
		s.mu.Unlock()
		n, rerr := resp.Body.Read(buf)
		s.mu.Lock()
		if first && rerr == io.EOF && n > 0 && mayFrame && !s.sent {
			w.Header().Set("Content-Length", strconv.Itoa(n)) // the whole body, read at once
		}
		s.sendHeader()
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				return err
			}
			s.dirty = true
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
		if s.now {
			_ = s.rc.Flush()
			s.dirty = false
		} else if s.dirty {
			s.t.Reset(p.flushDelay)
		}
	}
}

// writerOnly hides w's ReadFrom, so that io.CopyBuffer uses the pooled buffer.
type writerOnly struct{ io.Writer }

// eventStream reports whether h is a text/event-stream response's.
func eventStream(h http.Header) bool {
	ct, _, _ := strings.Cut(h.Get("Content-Type"), ";")
	return strings.EqualFold(strings.TrimSpace(ct), "text/event-stream")
}

// stream is a response of unknown length on its way: its copier holds mu whenever it touches
// the response, so the timer's flush runs only while the copier waits for the service, and never
// after stop.
type stream struct {
	rc     *http.ResponseController
	w      http.ResponseWriter
	status int
	now    bool // flush after every read (an event stream)
	mu     sync.Mutex
	t      *time.Timer // the flush while waiting; nil when now
	sent   bool        // the status line and header are written
	dirty  bool        // written and not flushed
	done   bool
}

func (s *stream) sendHeader() {
	if !s.sent {
		s.w.WriteHeader(s.status)
		s.sent = true
	}
}

// fire sends what is written so far (the header at least) while the service keeps the copier
// waiting.
func (s *stream) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done || s.sent && !s.dirty {
		return
	}
	s.sendHeader()
	_ = s.rc.Flush()
	s.dirty = false
}

// stop ends the timer's part in the response (the handler's end flushes what is left).
func (s *stream) stop() {
	s.done = true
	if s.t != nil {
		s.t.Stop()
	}
	s.mu.Unlock()
}
