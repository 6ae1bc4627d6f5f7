package environment

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"
	"time"
)

// snapshots records what OnWrite received.
type snapshots struct {
	mu   sync.Mutex
	list []LogSnapshot
}

func (s *snapshots) add(snap LogSnapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list = append(s.list, snap)
}

func (s *snapshots) get() []LogSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]LogSnapshot(nil), s.list...)
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func hexSHA256(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestLogBufferKeepsTheFirstLimitBytes(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	cases := []struct {
		name      string
		limit     int
		written   int
		chunk     int
		truncated bool
	}{
		{"3 MiB into the default 1 MiB", 0, 3 * mib, 7919, true},
		{"exactly the limit", mib, mib, 4096, false},
		{"one byte over", mib, mib + 1, 4096, true},
		{"small writes under a small limit", 10, 25, 3, true},
		{"nothing", 10, 0, 1, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			data := randomBytes(t, c.written)
			b := NewLogBuffer(LogOptions{Limit: c.limit})
			for rest := data; len(rest) > 0; {
				n := min(c.chunk, len(rest))
				if w, err := b.Write(rest[:n]); w != n || err != nil {
					t.Fatalf("Write = %d, %v", w, err)
				}
				rest = rest[n:]
			}
			limit := c.limit
			if limit == 0 {
				limit = DefaultLogLimit
			}
			if !bytes.Equal(b.Bytes(), data[:min(limit, len(data))]) {
				t.Fatalf("kept %d bytes that are not the first %d written", len(b.Bytes()), limit)
			}
			if b.Total() != int64(c.written) || b.Truncated() != c.truncated {
				t.Fatalf("total %d truncated %v, want %d %v", b.Total(), b.Truncated(), c.written, c.truncated)
			}
			if got := b.SHA256(); got != hexSHA256(data) {
				t.Fatalf("SHA256 %s is not the hash of the whole stream", got)
			}
		})
	}
}

// TestLogBufferConcurrentWriters: stdout and stderr-like writers at once (run with -race); every
// Write lands whole.
func TestLogBufferConcurrentWriters(t *testing.T) {
	t.Parallel()
	var got snapshots
	b := NewLogBuffer(LogOptions{Limit: 1 << 20, OnWrite: got.add, FlushBytes: 512})
	const writers, lines = 8, 500
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range lines {
				fmt.Fprintf(b, "writer %d line %04d\n", w, i)
				if i%100 == 0 {
					_ = b.Bytes()
					_ = b.SHA256()
				}
			}
		})
	}
	wg.Wait()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	kept := b.Bytes()
	if b.Truncated() || int64(len(kept)) != b.Total() || b.SHA256() != hexSHA256(kept) {
		t.Fatalf("kept %d of %d bytes, hash mismatch or truncation", len(kept), b.Total())
	}
	for w := range writers {
		for i := range lines {
			if !bytes.Contains(kept, fmt.Appendf(nil, "writer %d line %04d\n", w, i)) {
				t.Fatalf("line %d of writer %d is missing or torn", i, w)
			}
		}
	}
	snaps := got.get()
	if len(snaps) == 0 || !snaps[len(snaps)-1].Final || !bytes.Equal(snaps[len(snaps)-1].Data, kept) {
		t.Fatalf("the final snapshot does not hold the final log (%d snapshots)", len(snaps))
	}
}

// TestLogBufferOnWriteByBytes: with an interval too long to matter, OnWrite fires for the first
// output (so a tail shows it at once), then only for each FlushBytes of new output, and Close
// delivers the final state.
func TestLogBufferOnWriteByBytes(t *testing.T) {
	t.Parallel()
	var got snapshots
	const every, total, chunk = 64 << 10, 3 << 20, 16 << 10
	b := NewLogBuffer(LogOptions{Limit: 1 << 20, OnWrite: got.add, FlushInterval: time.Hour, FlushBytes: every})
	data := randomBytes(t, total)
	for i := 0; i < total; i += chunk {
		_, _ = b.Write(data[i : i+chunk])
	}
	waitFor(t, "a snapshot before Close", func() bool { return len(got.get()) > 0 })
	_ = b.Close()
	_ = b.Close() // a second Close does nothing

	snaps := got.get()
	if most := total/every + 2; len(snaps) < 2 || len(snaps) > most {
		t.Fatalf("%d snapshots for %d bytes in %d-byte chunks, want 2 to %d", len(snaps), total, chunk, most)
	}
	var prev int64
	for i, s := range snaps[:len(snaps)-1] {
		if s.Final || (i > 0 && s.Total < prev+every) || int64(len(s.Data)) != min(s.Total, 1<<20) || s.Truncated != (s.Total > 1<<20) {
			t.Fatalf("snapshot %d: final %v total %d (previous %d) kept %d truncated %v", i, s.Final, s.Total, prev, len(s.Data), s.Truncated)
		}
		prev = s.Total
	}
	last := snaps[len(snaps)-1]
	if !last.Final || last.Total != total || !last.Truncated || !bytes.Equal(last.Data, data[:1<<20]) {
		t.Fatalf("final snapshot: final %v total %d truncated %v", last.Final, last.Total, last.Truncated)
	}
}

// TestLogBufferOnWriteByInterval: a trickle below FlushBytes is still reported once the interval
// passes, without waiting for Close.
func TestLogBufferOnWriteByInterval(t *testing.T) {
	t.Parallel()
	var got snapshots
	b := NewLogBuffer(LogOptions{OnWrite: got.add, FlushInterval: 20 * time.Millisecond, FlushBytes: 1 << 30})
	defer b.Close()
	_, _ = b.Write([]byte("hello "))
	waitFor(t, "the first snapshot", func() bool { return len(got.get()) >= 1 })
	_, _ = b.Write([]byte("world"))
	waitFor(t, "the trickle to be reported", func() bool {
		s := got.get()
		return string(s[len(s)-1].Data) == "hello world"
	})
	if s := got.get(); s[len(s)-1].Final {
		t.Fatal("an interval snapshot is marked final")
	}
}

// TestLogBufferSlowOnWriteNeverBlocksWriters: while OnWrite is stuck, writes go on; afterwards it
// gets the latest state, not every intermediate one.
func TestLogBufferSlowOnWriteNeverBlocksWriters(t *testing.T) {
	t.Parallel()
	var got snapshots
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	b := NewLogBuffer(LogOptions{FlushBytes: 1, OnWrite: func(s LogSnapshot) {
		got.add(s)
		select {
		case entered <- struct{}{}:
		default:
		}
		if !s.Final {
			<-release
		}
	}})
	_, _ = b.Write([]byte("x"))
	select {
	case <-entered:
	case <-time.After(testDeadline):
		t.Fatal("OnWrite was not called")
	}
	wrote := make(chan struct{})
	go func() {
		for range 1000 {
			_, _ = b.Write(bytes.Repeat([]byte("y"), 1024))
		}
		close(wrote)
	}()
	select {
	case <-wrote:
	case <-time.After(testDeadline):
		t.Fatal("writes blocked behind a stuck OnWrite")
	}
	close(release)
	_ = b.Close()
	snaps := got.get()
	if len(snaps) > 3 {
		t.Fatalf("%d snapshots: intermediate states were queued, not dropped", len(snaps))
	}
	if last := snaps[len(snaps)-1]; !last.Final || last.Total != 1+1000*1024 {
		t.Fatalf("final snapshot %+v", last.Total)
	}
}

func TestLogBufferWithoutOnWrite(t *testing.T) {
	t.Parallel()
	b := NewLogBuffer(LogOptions{Limit: 4})
	_, _ = b.Write([]byte("abcdef"))
	_ = b.Close()
	_, _ = b.Write([]byte("g")) // still counted after Close
	if string(b.Bytes()) != "abcd" || b.Total() != 7 || b.SHA256() != hexSHA256([]byte("abcdefg")) {
		t.Fatalf("kept %q total %d", b.Bytes(), b.Total())
	}
}
