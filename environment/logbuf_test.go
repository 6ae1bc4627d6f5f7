package environment

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
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

// keptForm is what a log of data keeps under limit: all of it, or the first and the last half
// with the marker line between them, and the head's length.
func keptForm(data []byte, limit int) ([]byte, int) {
	if len(data) <= limit {
		return data, len(data)
	}
	h, tl := limit/2, limit-limit/2
	head, tail := data[:h], data[len(data)-tl:]
	marker := LogMarker(int64(len(data)-h-tl), h == 0 || head[h-1] == '\n')
	return append(append(append([]byte(nil), head...), marker...), tail...), h
}

func TestLogBufferKeepsHeadAndTail(t *testing.T) {
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
		{"3 MiB in one write", 0, 3 * mib, 3 * mib, true},
		{"exactly the limit", mib, mib, 4096, false},
		{"one byte over", mib, mib + 1, 4096, true},
		{"small writes under a small limit", 10, 25, 3, true},
		{"writes that wrap the tail", 10, 23, 4, true},
		{"an odd limit", 7, 20, 1, true},
		{"a one-byte limit keeps the last byte", 1, 5, 2, true},
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
			want, head := keptForm(data, limit)
			if got := b.Bytes(); !bytes.Equal(got, want) {
				t.Fatalf("kept %d bytes, want %d: the first and last half with the marker", len(got), len(want))
			}
			if snap := b.Snapshot(); snap.Head != head || !bytes.Equal(snap.Data, want) || snap.Truncated != c.truncated {
				t.Fatalf("snapshot head %d truncated %v, want %d %v", snap.Head, snap.Truncated, head, c.truncated)
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

// TestLogBufferKeepsTheLastLine: a 3 MiB line of output followed by the line that matters keeps
// that line at the end, after one marker line saying how much was dropped.
func TestLogBufferKeepsTheLastLine(t *testing.T) {
	t.Parallel()
	b := NewLogBuffer(LogOptions{})
	for range 3000 {
		_, _ = b.Write(bytes.Repeat([]byte("a"), 1000))
	}
	_, _ = b.Write([]byte("\nLAST-LINE\n"))
	kept := string(b.Bytes())
	omitted := int64(3000000+11) - DefaultLogLimit
	if !strings.HasSuffix(kept, "\nLAST-LINE\n") || strings.Count(kept, "bytes omitted") != 1 ||
		!strings.Contains(kept, fmt.Sprintf("a\n… %d bytes omitted …\na", omitted)) {
		t.Fatalf("kept %d bytes, ending %q", len(kept), kept[max(0, len(kept)-30):])
	}
}

// TestLogAfter: offsets count the log's own bytes, so a reader keeps its place in the head, the
// dropped middle and the moving tail.
func TestLogAfter(t *testing.T) {
	t.Parallel()
	full := []byte("0123456789abcdefghij\nKLMNOPQRST\n") // 32 bytes
	kept, head := keptForm(full, 16)                     // "01234567", the marker, "NOPQRST\n"
	total := int64(len(full))
	tail := full[len(full)-8:]
	cases := []struct {
		name   string
		offset int64
		want   string
	}{
		{"from the start", 0, string(kept)},
		{"within the head", 5, string(kept[5:])},
		{"at the end of the head", 8, string(LogMarker(16, false)) + string(tail)},
		{"within the middle", 20, string(LogMarker(4, false)) + string(tail)},
		{"within the tail", 27, string(full[27:])},
		{"at the end", total, ""},
		{"past the end", total + 10, ""},
	}
	for _, c := range cases {
		got, next := LogAfter(kept, head, total, c.offset)
		if string(got) != c.want || next != total {
			t.Errorf("%s: LogAfter(%d) = %q, %d; want %q, %d", c.name, c.offset, got, next, c.want, total)
		}
	}
	// A log under the cap is its own kept form: offsets are plain byte positions.
	if got, next := LogAfter([]byte("hello world"), 11, 11, 6); string(got) != "world" || next != 11 {
		t.Errorf("untruncated: %q, %d", got, next)
	}
	if got, next := LogAfter([]byte("hello world"), 11, 11, 50); len(got) != 0 || next != 11 {
		t.Errorf("untruncated past the end: %q, %d", got, next)
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
		want, _ := keptForm(data[:s.Total], 1<<20)
		if s.Final || (i > 0 && s.Total < prev+every) || !bytes.Equal(s.Data, want) || s.Truncated != (s.Total > 1<<20) {
			t.Fatalf("snapshot %d: final %v total %d (previous %d) kept %d truncated %v", i, s.Final, s.Total, prev, len(s.Data), s.Truncated)
		}
		prev = s.Total
	}
	last := snaps[len(snaps)-1]
	if want, _ := keptForm(data, 1<<20); !last.Final || last.Total != total || !last.Truncated || !bytes.Equal(last.Data, want) {
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
	if string(b.Bytes()) != "ab\n… 3 bytes omitted …\nfg" || b.Total() != 7 || b.SHA256() != hexSHA256([]byte("abcdefg")) {
		t.Fatalf("kept %q total %d", b.Bytes(), b.Total())
	}
}
