package terminal

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// make bench's terminal figures (docs/terminal.md "Benchmarks"): the same work on a raw pty read
// with creack/pty, through Berth's bridge (Registry.Serve over a real WebSocket on loopback, a
// real pty), through the same bridge with the shell in the setup jail (bwrap + script(1), as
// production runs it), and through WeTTY when BERTH_BENCH_WETTY names its install
// (scripts/bench-wetty.sh). Every wait has a deadline; nothing here runs under `go test` without
// -bench.

// benchWait bounds every single read or write of a benchmark.
const benchWait = 60 * time.Second

// benchTerm is one terminal under measurement: keystrokes in, output chunks out (io.EOF when
// its process has exited and its output is all delivered). One goroutine uses it.
type benchTerm interface {
	send(p []byte) error
	recv() ([]byte, error)
	close()
}

// rawTerm is the baseline: the pty master read directly.
type rawTerm struct {
	p    *plainPty
	buf  []byte
	kill *time.Timer
}

func startRaw(argv ...string) (*rawTerm, error) {
	p, err := startPlain(benchEnv(), argv...)
	if err != nil {
		return nil, fmt.Errorf("raw pty: %w", err)
	}
	t := &rawTerm{p: p, buf: make([]byte, 32<<10)}
	t.kill = time.AfterFunc(10*time.Minute, t.close) // the backstop if a read never returns
	return t, nil
}

func (t *rawTerm) send(p []byte) error { _, err := t.p.Write(p); return err }

func (t *rawTerm) recv() ([]byte, error) {
	_ = t.p.f.SetReadDeadline(time.Now().Add(benchWait)) // a no-op where the pty is not pollable
	n, err := t.p.Read(t.buf)
	if n > 0 {
		return t.buf[:n], nil
	}
	if errors.Is(err, syscall.EIO) { // Linux: the child side is closed, all output read
		return nil, io.EOF
	}
	return nil, err
}

func (t *rawTerm) close() {
	t.kill.Stop()
	_ = t.p.Close()
}

// berthServer is the bridge as production serves it: a Registry with the default options, a
// gorilla upgrader with the handler's buffer sizes, Serve with an authorizer that admits any
// token, and the transcript file terminal/imagesetup gives a session (TranscriptFile).
type berthServer struct {
	reg *Registry
	ts  *httptest.Server
	dir string
	seq atomic.Int64
	// starts holds each session's pty start (session id → func() (Pty, error)).
	starts sync.Map
}

func newBerthServer(tb testing.TB) *berthServer {
	s := &berthServer{reg: NewRegistry(Options{}), dir: tb.TempDir()}
	up := websocket.Upgrader{ReadBufferSize: 32 << 10, WriteBufferSize: 32 << 10, CheckOrigin: func(*http.Request) bool { return true }}
	s.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := strings.TrimPrefix(r.URL.Path, "/")
		conn, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		start, _ := s.starts.Load(id)
		_ = s.reg.Serve(context.Background(), conn, id, func(context.Context, string) (Attach, error) {
			return Attach{Start: start.(func() (Pty, error)), Transcript: TranscriptFile(s.dir + "/" + id + ".transcript")}, nil
		})
	}))
	tb.Cleanup(s.ts.Close)
	return s
}

// berthTerm is a client of the bridge speaking the protocol of docs/terminal.md.
type berthTerm struct {
	s    *berthServer
	id   string
	conn *websocket.Conn
	buf  []byte
}

// attach opens a new session whose pty start makes, and waits for ready.
func (s *berthServer) attach(start func() (Pty, error)) (*berthTerm, error) {
	id := "bench-" + strconv.FormatInt(s.seq.Add(1), 10)
	s.starts.Store(id, start)
	d := websocket.Dialer{ReadBufferSize: 32 << 10, WriteBufferSize: 32 << 10, HandshakeTimeout: benchWait}
	conn, _, err := d.Dial("ws"+strings.TrimPrefix(s.ts.URL, "http")+"/"+id, nil)
	if err != nil {
		return nil, fmt.Errorf("berth dial: %w", err)
	}
	t := &berthTerm{s: s, id: id, conn: conn, buf: make([]byte, 64<<10)}
	tok, _ := NewToken()
	if err := conn.WriteJSON(map[string]string{"type": "auth", "token": tok}); err != nil {
		t.close()
		return nil, fmt.Errorf("berth auth: %w", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(benchWait))
	typ, msg, err := conn.ReadMessage()
	if err != nil || typ != websocket.TextMessage || !bytes.Contains(msg, []byte(`"ready"`)) {
		t.close()
		return nil, fmt.Errorf("berth attach: %q %v", msg, err)
	}
	return t, nil
}

func (t *berthTerm) send(p []byte) error { return t.conn.WriteMessage(websocket.BinaryMessage, p) }

func (t *berthTerm) recv() ([]byte, error) {
	for {
		_ = t.conn.SetReadDeadline(time.Now().Add(benchWait))
		typ, r, err := t.conn.NextReader()
		if err != nil {
			return nil, err
		}
		n, err := io.ReadFull(r, t.buf)
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			return nil, err
		}
		if typ == websocket.BinaryMessage {
			if n == len(t.buf) {
				return nil, fmt.Errorf("berth frame larger than %d bytes", len(t.buf))
			}
			return t.buf[:n], nil
		}
		var f frame
		_ = json.Unmarshal(t.buf[:n], &f)
		if f.Type == "exit" {
			return nil, io.EOF
		}
		if f.Type == "error" || f.Type == "closed" {
			return nil, fmt.Errorf("berth control frame %q", t.buf[:n])
		}
	}
}

func (t *berthTerm) close() {
	t.conn.Close()
	t.s.reg.Close(t.id, ReasonCancelled)
}

// benchEnv is every shell's environment here (raw, Berth and WeTTY alike): a plain prompt and
// no rc files, so each keystroke's echo is readline's and nothing else.
func benchEnv() []string {
	return []string{"PATH=/usr/bin:/bin", "PS1=$ ", "TERM=xterm-256color", "HOME=/tmp", "LANG=C.UTF-8"}
}

// benchShell is the shell every echo and idle-session figure runs.
var benchShell = []string{"/bin/bash", "--norc", "--noprofile", "-i"}

// benchFile writes the throughput file once per benchmark: base64 text of random bytes in
// 76-column lines, BERTH_BENCH_TERM_MIB MiB (default 64). It returns its path and how many
// bytes a pty delivers for it (ONLCR turns each \n into \r\n).
func benchFile(tb testing.TB, dir string) (string, int64) {
	tb.Helper()
	mib := 64
	if v, err := strconv.Atoi(os.Getenv("BERTH_BENCH_TERM_MIB")); err == nil && v > 0 {
		mib = v
	}
	size := int64(mib) << 20
	path := dir + "/cat-me.txt"
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	raw := make([]byte, 57) // 57 bytes → 76 base64 characters
	line := make([]byte, 77)
	var written, lines int64
	for written < size {
		_, _ = rand.Read(raw)
		base64.StdEncoding.Encode(line, raw)
		line[76] = '\n'
		n := min(int64(len(line)), size-written)
		if n == int64(len(line)) {
			lines++
		}
		_, _ = w.Write(line[:n])
		written += n
	}
	if err := w.Flush(); err != nil {
		tb.Fatal(err)
	}
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
	return path, size + lines
}

// drain reads t to its end (or until want bytes arrived) and returns the bytes delivered and
// when the last of them arrived (a terminal may take a while to say it has ended).
func drain(t benchTerm, want int64) (int64, time.Time, error) {
	var got int64
	last := time.Now()
	for want <= 0 || got < want {
		b, err := t.recv()
		if len(b) > 0 {
			got += int64(len(b))
			last = time.Now()
		}
		if errors.Is(err, io.EOF) {
			return got, last, nil
		}
		if err != nil {
			return got, last, err
		}
	}
	return got, last, nil
}

// waitOutput reads t until its output contains want (matched as a substring: bash emits
// bracketed-paste escapes around its prompt).
func waitOutput(t benchTerm, want string) error {
	var seen []byte
	for !bytes.Contains(seen, []byte(want)) {
		b, err := t.recv()
		if err != nil {
			return fmt.Errorf("waiting for %q: %w (output %q)", want, err, tail(string(seen)))
		}
		seen = append(seen, b...)
		if len(seen) > 1<<16 {
			seen = seen[len(seen)-1<<15:]
		}
	}
	return nil
}

// echoOnce types one character into a shell waiting at its prompt and times the round trip to
// its echo, then rubs it out (untimed) so the line is empty again.
func echoOnce(t benchTerm, c byte) (time.Duration, error) {
	start := time.Now()
	if err := t.send([]byte{c}); err != nil {
		return 0, err
	}
	for {
		b, err := t.recv()
		if err != nil {
			return 0, fmt.Errorf("echo of %q: %w", c, err)
		}
		if bytes.IndexByte(b, c) >= 0 {
			break
		}
	}
	d := time.Since(start)
	if err := t.send([]byte{0x7f}); err != nil {
		return 0, err
	}
	return d, waitOutput(t, "\b")
}

func pct(d []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, len(s)*p/100)]
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// BenchmarkTerminalThroughput times `cat` of a 64 MiB text file to its last byte, alternating
// the terminals in each iteration: a raw pty read, Berth's bridge, Berth with the shell in the
// setup jail (`cat …; exit` typed into it: two ptys, bwrap and script(1) in the path), and
// WeTTY. It reports each median in MB/s (10^6 bytes of pty output per second, as delivered to
// the client) and Berth's ratios (goal: ≥ 0.9× raw, ≥ 1.0× WeTTY). lost-MiB counts output the
// bridge skipped for a client a whole ring behind (the bridge never throttles the pty);
// wetty-lost-KiB the tail WeTTY never delivers: node-pty reports the exit and drops what the pty
// still held (microsoft/node-pty#72), so WeTTY's figure is its delivered bytes until it ends.
func BenchmarkTerminalThroughput(b *testing.B) {
	dir := b.TempDir()
	file, want := benchFile(b, dir)
	srv := newBerthServer(b)
	jailed := newJailedShell(b, file)
	wetty := startWetty(b, "cat "+file)
	rates := map[string][]float64{}
	var lost, wettyLost int64
	mbps := func(n int64, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e6 }

	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		rt, err := startRaw("cat", file)
		if err != nil {
			b.Fatal(err)
		}
		n, last, err := drain(rt, 0)
		d := last.Sub(start)
		rt.close()
		if err != nil || n != want {
			b.Fatalf("raw cat: %d of %d bytes: %v", n, want, err)
		}
		rates["raw"] = append(rates["raw"], mbps(n, d))

		start = time.Now()
		bt, err := srv.attach(plainStart(benchEnv(), "cat", file))
		if err != nil {
			b.Fatal(err)
		}
		n, last, err = drain(bt, 0)
		d = last.Sub(start)
		bt.close()
		if err != nil {
			b.Fatalf("berth cat: %d of %d bytes: %v", n, want, err)
		}
		lost += want - n
		rates["berth"] = append(rates["berth"], mbps(n, d))

		if jailed != nil {
			jt, err := srv.attach(jailed.start)
			if err != nil {
				b.Fatal(err)
			}
			if err := waitOutput(jt, "$ "); err != nil {
				b.Fatalf("jailed shell prompt: %v", err)
			}
			start = time.Now()
			if err := jt.send([]byte("cat /opt/image/cat-me.txt; exit\r")); err != nil {
				b.Fatal(err)
			}
			n, last, err = drain(jt, 0)
			d = last.Sub(start)
			jt.close()
			if err != nil {
				b.Fatalf("jailed cat: %d of %d bytes: %v", n, want, err)
			}
			rates["jailed"] = append(rates["jailed"], mbps(n, d))
		}

		if wetty != nil {
			start = time.Now()
			wt, err := wetty.attach()
			if err != nil {
				b.Fatal(err)
			}
			n, last, err = drain(wt, want)
			d = last.Sub(start)
			wt.close()
			if err != nil {
				b.Fatalf("wetty cat: %d of %d bytes: %v", n, want, err)
			}
			wettyLost += want - n
			rates["wetty"] = append(rates["wetty"], mbps(n, d))
		}
	}
	b.StopTimer()
	raw, berth := median(rates["raw"]), median(rates["berth"])
	b.ReportMetric(raw, "raw-MBps")
	b.ReportMetric(berth, "berth-MBps")
	b.ReportMetric(berth/raw, "ratio-raw")
	b.ReportMetric(float64(lost)/float64(b.N)/(1<<20), "lost-MiB")
	if j := rates["jailed"]; len(j) > 0 {
		b.ReportMetric(median(j), "jailed-MBps")
		b.ReportMetric(median(j)/raw, "jailed-ratio-raw")
	}
	if w := rates["wetty"]; len(w) > 0 {
		b.ReportMetric(median(w), "wetty-MBps")
		b.ReportMetric(berth/median(w), "ratio-wetty")
		b.ReportMetric(float64(wettyLost)/float64(b.N)/(1<<10), "wetty-lost-KiB")
	}
}

// BenchmarkTerminalEcho times one keystroke's round trip to its echo by an interactive bash
// (readline echoes it) waiting at its prompt, each iteration once per terminal, alternating:
// raw pty, Berth's bridge, Berth with the shell in the setup jail, WeTTY. It reports p50 and
// p99 in ms and Berth's p50 over the raw pty's (goal: ≤ 3×, and p99 ≤ 2 ms).
func BenchmarkTerminalEcho(b *testing.B) {
	srv := newBerthServer(b)
	terms := []struct {
		name string
		t    benchTerm
	}{}
	add := func(name string, t benchTerm, err error) {
		if err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		b.Cleanup(t.close)
		if err := waitOutput(t, "$ "); err != nil {
			b.Fatalf("%s prompt: %v", name, err)
		}
		terms = append(terms, struct {
			name string
			t    benchTerm
		}{name, t})
	}
	rt, err := startRaw(benchShell...)
	add("raw", rt, err)
	bt, err := srv.attach(plainStart(benchEnv(), benchShell...))
	add("berth", bt, err)
	if j := newJailedShell(b, ""); j != nil {
		jt, err := srv.attach(j.start)
		add("jailed", jt, err)
	}
	if w := startWetty(b, strings.Join(benchShell, " ")); w != nil {
		wt, err := w.attach()
		add("wetty", wt, err)
	}
	// Warm up each path (first writes allocate buffers, readline loads its keymap).
	for _, t := range terms {
		for range 20 {
			if _, err := echoOnce(t.t, 'w'); err != nil {
				b.Fatalf("%s warm-up: %v", t.name, err)
			}
		}
	}
	lat := map[string][]time.Duration{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c := byte('a' + i%26)
		for _, t := range terms {
			d, err := echoOnce(t.t, c)
			if err != nil {
				b.Fatalf("%s: %v", t.name, err)
			}
			lat[t.name] = append(lat[t.name], d)
		}
	}
	b.StopTimer()
	for _, t := range terms {
		b.ReportMetric(ms(pct(lat[t.name], 50)), t.name+"-p50-ms")
		b.ReportMetric(ms(pct(lat[t.name], 99)), t.name+"-p99-ms")
	}
	b.ReportMetric(float64(pct(lat["berth"], 50))/float64(pct(lat["raw"], 50)), "ratio-p50-raw")
}

// BenchmarkTerminalIdleMemory opens BERTH_BENCH_TERM_SESSIONS (default 20) idle sessions, each an
// interactive bash at its prompt with a client attached, and reports what one costs: for Berth,
// Go heap and stacks in use (the 1 MiB scrollback ring included) and the bench process's RSS
// (which also holds the in-process clients); beyond-scrollback-MiB is heap per session minus
// the ring (goal ≤ 2 MiB). For WeTTY, the node server's RSS per session. The shells are
// separate processes in every case and not counted. One iteration is the whole measurement.
func BenchmarkTerminalIdleMemory(b *testing.B) {
	n := 20
	if v, err := strconv.Atoi(os.Getenv("BERTH_BENCH_TERM_SESSIONS")); err == nil && v > 0 {
		n = v
	}
	var heap, rss, wrss []float64
	for i := 0; i < b.N; i++ {
		srv := newBerthServer(b)
		warm, err := srv.attach(plainStart(benchEnv(), benchShell...))
		if err != nil {
			b.Fatal(err)
		}
		if err := waitOutput(warm, "$ "); err != nil {
			b.Fatal(err)
		}
		h0, r0 := goMem()
		var open []benchTerm
		for range n {
			t, err := srv.attach(plainStart(benchEnv(), benchShell...))
			if err != nil {
				b.Fatal(err)
			}
			open = append(open, t)
			if err := waitOutput(t, "$ "); err != nil {
				b.Fatal(err)
			}
		}
		h1, r1 := goMem()
		heap = append(heap, float64(h1-h0)/float64(n)/(1<<20))
		rss = append(rss, float64(r1-r0)/float64(n)/(1<<20))
		for _, t := range append(open, warm) {
			t.close()
		}

		if w := startWetty(b, strings.Join(benchShell, " ")); w != nil {
			warm, err := w.attach()
			if err != nil {
				b.Fatal(err)
			}
			if err := waitOutput(warm, "$ "); err != nil {
				b.Fatal(err)
			}
			time.Sleep(500 * time.Millisecond)
			r0, err := w.rss()
			if err != nil {
				b.Fatal(err)
			}
			var open []benchTerm
			for range n {
				t, err := w.attach()
				if err != nil {
					b.Fatal(err)
				}
				open = append(open, t)
				if err := waitOutput(t, "$ "); err != nil {
					b.Fatal(err)
				}
			}
			time.Sleep(500 * time.Millisecond)
			r1, err := w.rss()
			if err != nil {
				b.Fatal(err)
			}
			wrss = append(wrss, float64(r1-r0)/float64(n)/(1<<20))
			for _, t := range append(open, warm) {
				t.close()
			}
			w.stop()
		}
	}
	scroll := float64(Options{}.withDefaults().Scrollback) / (1 << 20)
	b.ReportMetric(median(heap), "berth-heap-MiB/session")
	b.ReportMetric(median(heap)-scroll, "beyond-scrollback-MiB")
	b.ReportMetric(median(rss), "berth-rss-MiB/session")
	if len(wrss) > 0 {
		b.ReportMetric(median(wrss), "wetty-rss-MiB/session")
	}
}

// goMem is the Go heap and stacks in use and the process's resident set, after a GC.
func goMem() (heap, rss int64) {
	runtime.GC()
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	r, _ := procRSS(os.Getpid())
	return int64(m.HeapInuse + m.StackInuse), r
}

// procRSS is VmRSS of a process, in bytes.
func procRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}
