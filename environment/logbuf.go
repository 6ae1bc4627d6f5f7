package environment

import (
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"sync"
	"time"
)

// Defaults of a LogBuffer.
const (
	DefaultLogLimit      = 1 << 20                // bytes kept of a run's log
	DefaultFlushInterval = 250 * time.Millisecond // at most this often, OnWrite …
	DefaultFlushBytes    = 64 << 10               // … unless this much new output is waiting
)

// LogSnapshot is the state of a log handed to OnWrite.
type LogSnapshot struct {
	// Data is the kept prefix of the log. It is shared with the buffer, which only ever appends
	// beyond it: read it, never modify it.
	Data      []byte
	Total     int64 // bytes written in all, kept or not
	Truncated bool  // Total > len(Data)
	Final     bool  // delivered by Close: nothing more will be reported
}

// LogOptions configure a LogBuffer; zero values take the defaults.
type LogOptions struct {
	// Limit is how many leading bytes are kept (default DefaultLogLimit); the rest is counted and
	// hashed, not kept.
	Limit int
	// OnWrite, if set, receives snapshots so the caller can persist the live log for tailing. It is
	// called from one goroutine of the buffer's own, never from Write, at most every FlushInterval
	// unless FlushBytes of new output are waiting; and once more, with Final set, by Close. A slow
	// OnWrite never slows the writer: output keeps accumulating, and when OnWrite returns it gets
	// the latest state (intermediate states are dropped, which loses nothing since each snapshot
	// holds the whole kept log).
	OnWrite       func(LogSnapshot)
	FlushInterval time.Duration
	FlushBytes    int
}

// LogBuffer is a capped log for run and operation output: it keeps the first Limit bytes, counts
// and SHA-256-hashes everything, and is safe for concurrent writers (each Write lands whole). Write
// never fails and never blocks on anything but the buffer's own short lock. When OnWrite is set,
// Close must be called to stop its goroutine and deliver the final snapshot.
type LogBuffer struct {
	mu      sync.Mutex
	limit   int
	buf     []byte // never rewritten below len: snapshots share it
	total   int64
	sum     hash.Hash
	closed  bool
	pending int64     // bytes written since the last snapshot
	last    time.Time // when the last snapshot was taken

	onWrite  func(LogSnapshot)
	interval time.Duration
	every    int64
	kick     chan struct{}
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once
}

// NewLogBuffer returns an empty log; with OnWrite set it starts the goroutine that calls it.
func NewLogBuffer(opts LogOptions) *LogBuffer {
	b := &LogBuffer{limit: opts.Limit, sum: sha256.New(), onWrite: opts.OnWrite, interval: opts.FlushInterval,
		every: int64(opts.FlushBytes)}
	if b.limit <= 0 {
		b.limit = DefaultLogLimit
	}
	if b.interval <= 0 {
		b.interval = DefaultFlushInterval
	}
	if b.every <= 0 {
		b.every = DefaultFlushBytes
	}
	if b.onWrite != nil {
		b.kick, b.stop, b.done = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
		go b.flushLoop()
	}
	return b
}

// Write records p. It always accepts all of p. After Close the bytes are still counted, hashed and
// kept, but OnWrite is not called any more.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	b.sum.Write(p)
	b.total += int64(len(p))
	if room := b.limit - len(b.buf); room > 0 {
		b.buf = append(b.buf, p[:min(room, len(p))]...)
	}
	notify := b.onWrite != nil && !b.closed && len(p) > 0
	if notify {
		b.pending += int64(len(p))
	}
	b.mu.Unlock()
	if notify {
		select {
		case b.kick <- struct{}{}:
		default: // the flusher already has a wake-up waiting
		}
	}
	return len(p), nil
}

// Bytes is a copy of the kept prefix of the log.
func (b *LogBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.buf...)
}

// Total is how many bytes were written in all.
func (b *LogBuffer) Total() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total
}

// Truncated reports whether more was written than is kept.
func (b *LogBuffer) Truncated() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total > int64(len(b.buf))
}

// SHA256 is the lowercase hex SHA-256 of everything written so far, kept or not.
func (b *LogBuffer) SHA256() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return hex.EncodeToString(b.sum.Sum(nil))
}

// Close stops OnWrite's goroutine (waiting for a call in progress) and calls OnWrite a last time
// with Final set. It is safe to call more than once; only the first call does anything.
func (b *LogBuffer) Close() error {
	b.once.Do(func() {
		b.mu.Lock()
		b.closed = true
		b.mu.Unlock()
		if b.onWrite == nil {
			return
		}
		close(b.stop)
		<-b.done
		b.mu.Lock()
		snap := b.snapshotLocked()
		b.mu.Unlock()
		snap.Final = true
		b.onWrite(snap)
	})
	return nil
}

func (b *LogBuffer) snapshotLocked() LogSnapshot {
	n := len(b.buf)
	b.pending, b.last = 0, time.Now()
	return LogSnapshot{Data: b.buf[:n:n], Total: b.total, Truncated: b.total > int64(n)}
}

// flushLoop hands snapshots to OnWrite when output is waiting and either FlushBytes of it have
// piled up or FlushInterval has passed since the last snapshot.
func (b *LogBuffer) flushLoop() {
	defer close(b.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	armed := false
	for {
		select {
		case <-b.stop:
			timer.Stop()
			return
		case <-b.kick:
		case <-timer.C:
			armed = false
		}
		b.mu.Lock()
		if b.pending == 0 {
			b.mu.Unlock()
			continue
		}
		if wait := b.interval - time.Since(b.last); b.pending < b.every && wait > 0 {
			if !armed {
				timer.Reset(wait)
				armed = true
			}
			b.mu.Unlock()
			continue
		}
		snap := b.snapshotLocked()
		b.mu.Unlock()
		b.onWrite(snap)
	}
}
