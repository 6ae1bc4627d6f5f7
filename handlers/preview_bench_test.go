package handlers

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"berth/db"
)

// benchUpstream serves a 20 KB page at / and a WebSocket echo at /ws, as a dev server would.
func benchUpstream(b *testing.B) (string, int) {
	page := bytes.Repeat([]byte("<p>preview of the workspace</p>\n"), 20<<10/32)
	up := websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = w.Write(page)
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			t, m, err := c.ReadMessage()
			if err != nil || c.WriteMessage(t, m) != nil {
				return
			}
		}
	})
	srv := httptest.NewServer(mux)
	b.Cleanup(srv.Close)
	return srv.URL, srv.Listener.Addr().(*net.TCPAddr).Port
}

// loadRPS runs 32 clients against url for d and returns requests per second.
func loadRPS(b *testing.B, url, token string, d time.Duration) float64 {
	const clients = 32
	tr := &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	var n atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for range clients {
		wg.Go(func() {
			for time.Now().Before(stop) {
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				req.Header.Set("Authorization", "Bearer "+token)
				resp, err := c.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Errorf("GET %s = %d", url, resp.StatusCode)
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	return float64(n.Load()) / d.Seconds()
}

// latencyP50 is the median time of n sequential GETs of url by one client.
func latencyP50(b *testing.B, url, token string, n int) time.Duration {
	c := &http.Client{Transport: &http.Transport{}}
	ds := make([]time.Duration, 0, n)
	for range n {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		t0 := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		ds = append(ds, time.Since(t0))
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// pageServer is a dev server's stand-in: a Go HTTP server that listens on $PORT and serves a
// 20 KB page, built from source and run as a real runtime service.
const pageServer = `package main

import (
	"bytes"
	"net/http"
	"os"
)

func main() {
	page := bytes.Repeat([]byte("<p>preview of the workspace</p>\n"), 20<<10/32)
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.Write(page)
	})
	http.ListenAndServe("127.0.0.1:"+os.Getenv("PORT"), nil)
}
`

// BenchmarkPreviewProxy: a 20 KB page through /preview/{id}/ vs straight from the server, at 32
// concurrent clients (requests/s, ratio) and one client (the proxy's added p50, which includes
// authenticating the request). The server is a Go binary started as a runtime service through
// the API, so the proxy takes its real path: this node's supervisor runs the service. Goals:
// ratio >= 0.8, added p50 <= 1 ms.
func BenchmarkPreviewProxy(b *testing.B) {
	re := setupRuns(b)
	ws, dir := re.serviceWorkspace("standard", map[string]string{"main.go": pageServer},
		db.ServiceDefinition{Name: "web", Command: "exec ./server", PortEnv: "PORT", HealthPath: "/", ReadyTimeoutS: 20,
			StopPolicy: "manual", Lifecycle: "ephemeral"})
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "server"), "main.go")
	build.Dir = dir
	build.Env = append(os.Environ(), "GO111MODULE=off", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("go build: %v %s", err, out)
	}
	base := "/api/execution-workspaces/" + ws.ID + "/runtime-services"
	if code, out := re.call(re.r.Board, http.MethodPost, base+"/start", map[string]any{"name": "web"}); code != http.StatusAccepted {
		b.Fatalf("start = %d %v", code, out)
	}
	sv := re.waitService(ws.ID, "web", "healthy", serviceIs("running", "healthy"))
	proxied := re.ts.URL + "/preview/" + sv["id"].(string) + "/"
	direct := "http://127.0.0.1:" + strconv.Itoa(int(sv["port"].(float64))) + "/"
	token := re.r.Viewer.Token
	// The reference: a bare httputil.ReverseProxy in front of the same server, no Berth at all.
	// On a machine where the clients, the proxy and the server share a few cores, it shows what
	// a second HTTP hop costs by itself.
	up, _ := url.Parse(direct)
	bare := httptest.NewServer(httputil.NewSingleHostReverseProxy(up))
	defer bare.Close()
	latencyP50(b, proxied, token, 200) // warm up both paths
	latencyP50(b, direct, token, 200)
	var dRPS, pRPS, bRPS float64
	var dP50, pP50 time.Duration
	for b.Loop() {
		dRPS += loadRPS(b, direct, token, 2*time.Second)
		pRPS += loadRPS(b, proxied, token, 2*time.Second)
		bRPS += loadRPS(b, bare.URL+"/", token, 2*time.Second)
		dP50 += latencyP50(b, direct, token, 2000)
		pP50 += latencyP50(b, proxied, token, 2000)
	}
	n := float64(b.N)
	b.ReportMetric(dRPS/n, "direct-rps")
	b.ReportMetric(pRPS/n, "proxied-rps")
	b.ReportMetric(pRPS/dRPS, "ratio")
	b.ReportMetric(bRPS/n, "bare-proxy-rps")
	b.ReportMetric(pRPS/bRPS, "ratio-bare-proxy")
	b.ReportMetric(float64(dP50)/n/1e6, "direct-p50-ms")
	b.ReportMetric(float64(pP50)/n/1e6, "proxied-p50-ms")
	b.ReportMetric(float64(pP50-dP50)/n/1e6, "added-p50-ms")
}

// wsRTT is the median round trip of n echo messages over one WebSocket to url.
func wsRTT(b *testing.B, url, token string, n int) time.Duration {
	h := http.Header{"Authorization": {"Bearer " + token}}
	c, resp, err := websocket.DefaultDialer.Dial(url, h)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		b.Fatalf("dial %s: %v (%d)", url, err, status)
	}
	defer c.Close()
	msg := []byte(`{"type":"update","path":"/src/main.js","timestamp":` + strconv.Itoa(n) + `}`)
	ds := make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		if err := c.WriteMessage(websocket.TextMessage, msg); err != nil {
			b.Fatal(err)
		}
		if _, _, err := c.ReadMessage(); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(t0))
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// BenchmarkPreviewWebSocket: echo round trip through the proxy vs straight to the server (p50
// of 2000 messages on one connection each). Goal: ratio <= 2.
func BenchmarkPreviewWebSocket(b *testing.B) {
	e := setup(b)
	r := e.roles()
	direct, port := benchUpstream(b)
	proxied := "ws" + e.ts.URL[len("http"):] + "/preview/" + e.previewService(r.A.ID, "running", port) + "/ws"
	direct = "ws" + direct[len("http"):] + "/ws"
	var d, p time.Duration
	for b.Loop() {
		d += wsRTT(b, direct, r.Viewer.Token, 2000)
		p += wsRTT(b, proxied, r.Viewer.Token, 2000)
	}
	n := float64(b.N)
	b.ReportMetric(float64(d)/n/1e3, "direct-rtt-us")
	b.ReportMetric(float64(p)/n/1e3, "proxied-rtt-us")
	b.ReportMetric(float64(p)/float64(d), "ratio")
}
