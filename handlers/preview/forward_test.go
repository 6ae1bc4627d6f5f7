package preview

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"berth/db"
)

// forwardTo serves every request with p.forward to upstream's service, as the preview listener
// does once the request is authorized, and returns the listener's URL.
func forwardTo(t *testing.T, upstream *httptest.Server) string {
	t.Helper()
	p := &Proxy{cfg: Config{Log: slog.New(slog.DiscardHandler), BerthCookies: []string{"__Host-berth_session"}},
		cache: newCache(), flushDelay: streamFlushDelay}
	p.tr = p.transport()
	p.buffers = &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}}
	p.rp = p.reverseProxy()
	port := upstream.Listener.Addr().(*net.TCPAddr).Port
	svc := db.RuntimeService{ID: "11111111-1111-1111-1111-111111111111", Status: db.ServiceRunning, Port: port}
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.forward(w, r, &target{svc: svc, strip: true, proto: "http"})
	}))
	t.Cleanup(front.Close)
	t.Cleanup(p.tr.CloseIdleConnections)
	return front.URL
}

// rawGet sends a request written by hand (headers as given, no client defaults) and reads the
// response.
func rawGet(t *testing.T, base, path string, header ...string) (*http.Response, string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\n%s\r\n", path, strings.TrimPrefix(base, "http://"),
		strings.Join(append(header, ""), "\r\n"))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// TestForwardHeaders: what the service gets is the browser's request less the hop-by-hop
// headers (and those its Connection header names), Berth's credentials and cookies, and any
// forwarded header the browser made up; what the browser gets is the service's answer less the
// same hop-by-hop headers, Berth's cookie names (in a trailer too); a service that switches
// protocols unasked gets a 502, not a tunnel.
func TestForwardHeaders(t *testing.T) {
	t.Parallel()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/switch" {
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err == nil {
				fmt.Fprint(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n")
				brw.Flush()
				conn.Close()
			}
			return
		}
		w.Header().Set("Connection", "X-Up-Private")
		w.Header().Set("X-Up-Private", "1")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("Trailer", "Set-Cookie, X-Sum")
		w.Header().Add("Set-Cookie", "app=1; Domain=example.com")
		w.Header().Add("Set-Cookie", "berth_session=evil")
		var names []string
		for k := range r.Header {
			names = append(names, k)
		}
		fmt.Fprintf(w, "%s|%s|%s|%s|%s", strings.Join(names, ","), r.Header.Get("Cookie"), r.Header.Get("X-Forwarded-Host"),
			r.Header.Get("X-Forwarded-Proto"), r.Host)
		w.Header().Set("Set-Cookie", "berth_preview_x=evil")
		w.Header().Set("X-Sum", "ok")
	}))
	t.Cleanup(upstream.Close)
	front := forwardTo(t, upstream)

	resp, body := rawGet(t, front, "/a?b=1", "Authorization: Bearer secret", "Proxy-Authorization: Basic eA==",
		"Connection: keep-alive, X-Private", "X-Private: 1", "Keep-Alive: 300", "Te: trailers, deflate",
		"Forwarded: for=1.2.3.4", "X-Forwarded-For: 1.2.3.4", "X-Forwarded-Prefix: /evil", "X-Forwarded-Host: evil.example",
		"X-Forwarded-Proto: https", "Cookie: app=kept; berth_preview_11111111=s; __Host-berth_session=s", "Accept: */*")
	parts := strings.Split(body, "|")
	if resp.StatusCode != 200 || len(parts) != 5 {
		t.Fatalf("GET = %d %q", resp.StatusCode, body)
	}
	names := "," + strings.ToLower(parts[0]) + ","
	for _, gone := range []string{"authorization", "proxy-authorization", "connection", "x-private", "keep-alive",
		"forwarded", "x-forwarded-for", "x-forwarded-prefix", "user-agent"} {
		if strings.Contains(names, ","+gone+",") {
			t.Errorf("%s reached the service (it got %s)", gone, parts[0])
		}
	}
	if !strings.Contains(names, ",accept,") || !strings.Contains(names, ",te,") {
		t.Errorf("the browser's own headers did not all pass: %s", parts[0])
	}
	if parts[1] != "app=kept" {
		t.Errorf("cookies at the service = %q, want only the app's", parts[1])
	}
	if host := strings.TrimPrefix(front, "http://"); parts[2] != host || parts[3] != "http" || parts[4] != "127.0.0.1:"+upstream.URL[len("http://127.0.0.1:"):] {
		t.Errorf("forwarded host, proto, host = %q %q %q", parts[2], parts[3], parts[4])
	}
	for _, h := range []string{"X-Up-Private", "Keep-Alive"} {
		if resp.Header.Get(h) != "" {
			t.Errorf("the service's hop-by-hop %s reached the browser", h)
		}
	}
	if got := resp.Header.Values("Set-Cookie"); len(got) != 1 || got[0] != "app=1" {
		t.Errorf("Set-Cookie at the browser = %q, want app=1 only, host-only", got)
	}
	if resp.Trailer.Get("X-Sum") != "ok" || resp.Trailer.Get("Set-Cookie") != "" {
		t.Errorf("trailer at the browser = %v, want X-Sum and no Set-Cookie", resp.Trailer)
	}

	resp, _ = rawGet(t, front, "/switch")
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("an unasked protocol switch = %d, want 502", resp.StatusCode)
	}
}

// TestForwardStreams: a body of unknown length that the service sends in parts reaches the
// browser part by part (the first before the service sends the second), and so does an event
// stream.
func TestForwardStreams(t *testing.T) {
	t.Parallel()
	for _, ct := range []string{"text/plain", "text/event-stream"} {
		t.Run(ct, func(t *testing.T) {
			t.Parallel()
			seen := make(chan struct{})
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", ct)
				fmt.Fprint(w, "one\n")
				w.(http.Flusher).Flush()
				select { // past the browser's deadline below
				case <-seen:
				case <-r.Context().Done():
				case <-time.After(time.Minute):
				}
				fmt.Fprint(w, "two\n")
			}))
			t.Cleanup(upstream.Close)
			front := forwardTo(t, upstream)
			type first struct {
				resp *http.Response
				br   *bufio.Reader
				line string
				err  error
			}
			done := make(chan first, 1)
			go func() { // the response's header and first part
				resp, err := http.Get(front + "/")
				if err != nil {
					done <- first{err: err}
					return
				}
				br := bufio.NewReader(resp.Body)
				line, err := br.ReadString('\n')
				done <- first{resp, br, line, err}
			}()
			var f first
			select {
			case f = <-done:
				if f.resp != nil {
					defer f.resp.Body.Close()
				}
				if f.err != nil || f.line != "one\n" {
					t.Fatalf("first part = %q %v", f.line, f.err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the first part did not arrive before the service sent the second")
			}
			close(seen)
			if rest, _ := io.ReadAll(f.br); string(rest) != "two\n" {
				t.Fatalf("second part = %q", rest)
			}
		})
	}
}

// wholeReader returns its whole text with io.EOF in one read, as a body that came in one piece.
type wholeReader struct {
	s    string
	done bool
}

func (r *wholeReader) Read(p []byte) (int, error) {
	if r.done {
		return 0, io.EOF
	}
	r.done = true
	return copy(p, r.s), io.EOF
}

// flushCounter is a ResponseWriter that counts flushes.
type flushCounter struct {
	*httptest.ResponseRecorder
	flushes int
}

func (f *flushCounter) Flush() { f.flushes++; f.ResponseRecorder.Flush() }

// TestCopyBodyFraming: a body of unknown length that comes whole with its first read goes out
// with a Content-Length and no flush of its own (one write, not a chunked body and its end in
// writes of their own), unless a trailer follows; a body of known length is not flushed; an event
// stream is flushed at once and after every read.
func TestCopyBodyFraming(t *testing.T) {
	t.Parallel()
	p := &Proxy{buffers: &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}},
		flushDelay: time.Hour} // no read here waits: a flush would be the copier's own
	page := strings.Repeat("<p>page</p>\n", 1700)
	cases := []struct {
		name          string
		length        int64
		ct            string
		body          io.Reader
		mayFrame      bool
		contentLength string
		maxFlushes    int
		minFlushes    int
	}{
		{"whole at once", -1, "text/html", &wholeReader{s: page}, true, "20400", 0, 0},
		{"whole, a trailer follows", -1, "text/html", &wholeReader{s: page}, false, "", 0, 0},
		{"in parts", -1, "text/html", strings.NewReader(page), true, "", 0, 0},
		{"known length", int64(len(page)), "text/html", strings.NewReader(page), true, "", 0, 0},
		{"event stream", -1, "text/event-stream", iotest.OneByteReader(strings.NewReader("data: 1\n\n")), true, "", 100, 10},
	}
	for _, tc := range cases {
		w := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
		resp := &http.Response{StatusCode: 200, ContentLength: tc.length, Header: http.Header{"Content-Type": {tc.ct}},
			Body: io.NopCloser(tc.body)}
		if err := p.copyBody(w, resp, tc.mayFrame); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if w.Header().Get("Content-Length") != tc.contentLength {
			t.Errorf("%s: Content-Length %q, want %q", tc.name, w.Header().Get("Content-Length"), tc.contentLength)
		}
		if w.flushes > tc.maxFlushes || w.flushes < tc.minFlushes {
			t.Errorf("%s: %d flushes, want %d to %d", tc.name, w.flushes, tc.minFlushes, tc.maxFlushes)
		}
		if tc.ct == "text/html" && w.Body.String() != page {
			t.Errorf("%s: the body changed on the way", tc.name)
		}
	}
}

// TestAppCookiesAllocs: a Cookie header without any of Berth's names passes untouched, with no
// parse (no allocation); one with them keeps only the app's cookies.
func TestAppCookiesAllocs(t *testing.T) {
	p := &Proxy{cfg: Config{BerthCookies: []string{"__Host-berth_session"}}}
	plain := []string{"app=1; theme=dark; _ga=GA1.1.2"}
	if n := testing.AllocsPerRun(100, func() { p.appCookies(plain) }); n != 0 {
		t.Errorf("appCookies of an app-only header: %v allocations, want 0", n)
	}
	if got := p.appCookies(plain); len(got) != 1 || got[0] != plain[0] {
		t.Errorf("app-only header = %q", got)
	}
	mixed := []string{"app=1; berth_preview_abc=x", "__Host-berth_session=y; theme=dark"}
	if got := p.appCookies(mixed); len(got) != 1 || got[0] != "app=1; theme=dark" {
		t.Errorf("mixed header = %q", got)
	}
	if got := p.appCookies([]string{"berth_session=y"}); len(got) != 0 {
		t.Errorf("Berth's cookies only = %q, want no Cookie header", got)
	}
}
