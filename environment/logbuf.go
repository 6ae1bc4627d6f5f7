package environment

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
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
	// Data is the kept log (the caller's own copy): all of it while it fits the limit; past the
	// limit, its first half, one marker line (LogMarker) and its last half.
	Data      []byte
	Head      int   // how many leading bytes of Data are the log's first bytes (len(Data) unless Truncated)
	Total     int64 // bytes written in all, kept or not
	Truncated bool  // Total > the limit: the middle was dropped
	Final     bool  // delivered by Close: nothing more will be reported
}

// LogOptions configure a LogBuffer; zero values take the defaults.
type LogOptions struct {
	// Limit is how many bytes of the log are kept (default DefaultLogLimit): a longer log keeps its
	// first Limit/2 and its last Limit/2 bytes with a marker line between them; the middle is
	// counted and hashed, not kept.
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

// LogBuffer is a capped log for run and operation output: it keeps the head and the tail (the
// first and the last half of Limit), so the last lines, usually the error, are never lost;
// counts and SHA-256-hashes everything; and is safe for concurrent writers (each Write lands
// whole). Write never fails and never blocks on anything but the buffer's own short lock. When
// OnWrite is set, Close must be called to stop its goroutine and deliver the final snapshot.
type LogBuffer struct {
	mu       sync.Mutex
	headCap  int
	tailCap  int
	head     []byte // the first headCap bytes written
	ring     []byte // the last tailCap bytes after the head, circular from ringPos once full
	ringPos  int    // where the next tail byte goes
	ringFull bool
	total    int64
	sum      hash.Hash
	closed   bool
	pending  int64     // bytes written since the last snapshot
	last     time.Time // when the last snapshot was taken

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
	limit := opts.Limit
	if limit <= 0 {
		limit = DefaultLogLimit
	}
	b := &LogBuffer{headCap: limit / 2, tailCap: limit - limit/2, sum: sha256.New(), onWrite: opts.OnWrite,
		interval: opts.FlushInterval, every: int64(opts.FlushBytes)}
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
	rest := p
	if room := b.headCap - len(b.head); room > 0 {
		n := min(room, len(rest))
		b.head = append(b.head, rest[:n]...)
		rest = rest[n:]
	}
	b.keepTailLocked(rest)
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

// keepTailLocked puts p, which comes after the head, into the ring of the last tailCap bytes.
func (b *LogBuffer) keepTailLocked(p []byte) {
	if len(p) == 0 || b.tailCap == 0 {
		return
	}
	if b.ring == nil {
		b.ring = make([]byte, b.tailCap)
	}
	if len(p) >= b.tailCap {
		copy(b.ring, p[len(p)-b.tailCap:])
		b.ringPos, b.ringFull = 0, true
		return
	}
	n := copy(b.ring[b.ringPos:], p)
	if n < len(p) {
		copy(b.ring, p[n:])
		b.ringFull = true
	}
	if b.ringPos+len(p) >= b.tailCap {
		b.ringFull = true
	}
	b.ringPos = (b.ringPos + len(p)) % b.tailCap
}

// LogMarker is the line a truncated log keeps between its head and its tail, saying how many
// bytes were dropped. It starts a line of its own: after a head that ends mid-line it begins with
// a newline.
func LogMarker(omitted int64, afterNewline bool) []byte {
	m := fmt.Appendf(nil, "… %d bytes omitted …\n", omitted)
	if !afterNewline {
		m = append([]byte{'\n'}, m...)
	}
	return m
}

// keptLocked assembles the kept log: head and tail in order, with the marker between them when
// the middle was dropped. It returns a fresh slice and the head's length within it.
func (b *LogBuffer) keptLocked() ([]byte, int) {
	tailLen := b.ringPos
	if b.ringFull {
		tailLen = b.tailCap
	}
	omitted := b.total - int64(len(b.head)) - int64(tailLen)
	var marker []byte
	if omitted > 0 {
		marker = LogMarker(omitted, len(b.head) == 0 || b.head[len(b.head)-1] == '\n')
	}
	out := make([]byte, 0, len(b.head)+len(marker)+tailLen)
	out = append(out, b.head...)
	out = append(out, marker...)
	if b.ringFull {
		out = append(out, b.ring[b.ringPos:]...)
	}
	out = append(out, b.ring[:b.ringPos]...)
	if omitted > 0 {
		return out, len(b.head)
	}
	return out, len(out)
}

// Bytes is a copy of the kept log: all of it, or its head, the marker line and its tail.
func (b *LogBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	out, _ := b.keptLocked()
	return out
}

// Snapshot is the log's current state (Final unset), as OnWrite would receive it.
func (b *LogBuffer) Snapshot() LogSnapshot {
	b.mu.Lock()
	defer b.mu.Unlock()
	data, head := b.keptLocked()
	return LogSnapshot{Data: data, Head: head, Total: b.total, Truncated: b.truncatedLocked()}
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
	return b.truncatedLocked()
}

func (b *LogBuffer) truncatedLocked() bool { return b.total > int64(b.headCap+b.tailCap) }

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
	b.pending, b.last = 0, time.Now()
	data, head := b.keptLocked()
	return LogSnapshot{Data: data, Head: head, Total: b.total, Truncated: b.truncatedLocked()}
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

// LogAfter is what a reader that has read offset bytes of a log reads next from its kept form
// (data, whose first head bytes are the log's first bytes, of total bytes written), and the
// offset to ask with next time (the total). Offsets count the log's own bytes, not the kept
// ones, so a tail keeps its place while the kept tail moves: a reader within the head gets the
// rest of it, the marker and the tail; a reader within the dropped middle gets a marker with its
// own count, then the tail; a reader within the tail gets the rest of it.
func LogAfter(data []byte, head int, total, offset int64) ([]byte, int64) {
	offset = max(offset, 0)
	if head < 0 || head >= len(data) { // nothing dropped after the head: data is the log's start
		next := max(total, int64(len(data)))
		if offset >= int64(len(data)) {
			return nil, next
		}
		return data[offset:], next
	}
	i := bytes.IndexByte(data[head+1:], '\n')
	if i < 0 { // no marker line: not a kept form LogBuffer wrote
		return LogAfter(data, len(data), total, offset)
	}
	tail := data[head+1+i+1:]
	tailStart := total - int64(len(tail))
	switch {
	case offset < int64(head):
		return data[offset:], total
	case offset >= tailStart:
		return tail[min(offset-tailStart, int64(len(tail))):], total
	default:
		return append(LogMarker(tailStart-offset, false), tail...), total
	}
}
