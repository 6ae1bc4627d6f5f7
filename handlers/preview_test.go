package handlers

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"berth/db"
)

// previewUpstream is a service behind the proxy: /echo reports what reached it, /sse streams
// two events a while apart, /ws switches protocols and echoes raw bytes.
func previewUpstream(t *testing.T) (*httptest.Server, int) {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "berth_session", Value: "evil", Path: "/"})
		http.SetCookie(w, &http.Cookie{Name: "app", Value: "ok", Path: "/"})
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"path": r.URL.Path, "query": r.URL.RawQuery, "host": r.Host,
			"cookie": r.Header.Get("Cookie"), "authorization": r.Header.Get("Authorization"),
			"prefix": r.Header.Get("X-Forwarded-Prefix"), "proto": r.Header.Get("X-Forwarded-Proto"),
			"fwd_host": r.Header.Get("X-Forwarded-Host")})
	})
	mux.HandleFunc("/sse", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-time.After(3 * time.Second):
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: two\n\n")
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "no upgrade", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprint(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		buf := make([]byte, 64)
		for {
			n, err := brw.Read(buf)
			if err != nil {
				return
			}
			conn.Write(buf[:n])
		}
	})
	up := httptest.NewServer(mux)
	t.Cleanup(up.Close)
	port, _ := strconv.Atoi(up.Listener.Addr().(*net.TCPAddr).AddrPort().String()[strings.LastIndex(up.Listener.Addr().String(), ":")+1:])
	return up, port
}

// previewService records a running service of company cid on port (status as given).
func (e *testEnv) previewService(cid, status string, port int) string {
	e.t.Helper()
	ctx := context.Background()
	var pid, ws, id string
	if err := e.pool.QueryRow(ctx, `INSERT INTO projects (company_id, name, key) VALUES ($1, 'P', 'PRV') RETURNING id`, cid).Scan(&pid); err != nil {
		e.t.Fatal(err)
	}
	if err := e.pool.QueryRow(ctx, `INSERT INTO execution_workspaces (company_id, project_id, mode, strategy, ref, status)
		VALUES ($1, $2, 'isolated', 'copy', 'ws-' || md5(random()::text), 'ready') RETURNING id`, cid, pid).Scan(&ws); err != nil {
		e.t.Fatal(err)
	}
	if err := e.pool.QueryRow(ctx, `INSERT INTO runtime_services (company_id, execution_workspace_id, name, status, port, node_id, log_excerpt, exit_code, stop_reason)
		VALUES ($1, $2, 'web', $3, $4, 'n', CASE WHEN $3 = 'failed' THEN 'Error: cannot find module vite' ELSE '' END,
			CASE WHEN $3 = 'failed' THEN 1 END, CASE WHEN $3 = 'failed' THEN 'exited' ELSE '' END) RETURNING id`,
		cid, ws, status, port).Scan(&id); err != nil {
		e.t.Fatal(err)
	}
	return id
}

// TestPreviewProxy: members of the service's company (session or token, any role) reach the
// service with the prefix stripped, forwarded headers set, the upstream Host its own, and
// neither Berth's session cookie nor the Authorization header; the service cannot set Berth's
// cookie; another company gets 404; no credentials → login for browsers, 401 otherwise.
func TestPreviewProxy(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	_, port := previewUpstream(t)
	id := e.previewService(r.A.ID, "running", port)
	base := e.ts.URL + "/preview/" + id

	viewer := e.browser(r.Viewer)
	req, _ := http.NewRequest("GET", base+"/some/page?x=1&y=2", nil)
	req.AddCookie(&http.Cookie{Name: "app", Value: "kept"})
	resp, err := viewer.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != 200 {
		t.Fatalf("viewer through the proxy: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	want := map[string]string{"path": "/some/page", "query": "x=1&y=2", "host": "127.0.0.1:" + strconv.Itoa(port),
		"prefix": "/preview/" + id, "proto": "http", "fwd_host": strings.TrimPrefix(e.ts.URL, "http://"), "authorization": ""}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s upstream = %q, want %q", k, got[k], v)
		}
	}
	if strings.Contains(got["cookie"], "berth_session") || !strings.Contains(got["cookie"], "app=kept") {
		t.Errorf("upstream cookies = %q: Berth's session must go, the app's own stay", got["cookie"])
	}
	for _, c := range resp.Cookies() {
		if c.Name == "berth_session" && c.Value == "evil" {
			t.Error("the service replaced Berth's session cookie")
		}
	}
	if csp := resp.Header.Get("Content-Security-Policy"); csp != "" {
		t.Errorf("Berth's CSP on a proxied response: %q", csp)
	}

	// A bearer token: the Authorization header is Berth's and never reaches the service.
	code, body := e.call(r.Board, "GET", "/preview/"+id+"/", nil)
	if code != 200 || body["authorization"] != "" || body["path"] != "/" {
		t.Fatalf("board with a token: %d %v", code, body)
	}
	// Another company: 404, as for a missing service.
	if code := e.previewStatus(r.Other, "/preview/"+id+"/"); code != 404 {
		t.Fatalf("another company = %d", code)
	}
	// No credentials: a browser goes to /login, a script gets 401.
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ = http.NewRequest("GET", base+"/", nil)
	req.Header.Set("Accept", "text/html,application/xhtml+xml")
	resp, err = noRedirect.Do(req)
	if err != nil || resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login") {
		t.Fatalf("anonymous browser: %v %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	resp, err = noRedirect.Get(base + "/")
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("anonymous script: %v %v", resp.StatusCode, err)
	}
	resp.Body.Close()
}

// TestPreviewStreamsAndUpgrades: an SSE event arrives before the stream ends, and a WebSocket
// upgrade passes both ways.
func TestPreviewStreamsAndUpgrades(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	_, port := previewUpstream(t)
	id := e.previewService(r.A.ID, "running", port)

	req, _ := http.NewRequest("GET", e.ts.URL+"/preview/"+id+"/sse", nil)
	req.Header.Set("Authorization", "Bearer "+r.Viewer.Token)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	resp.Body.Close()
	if err != nil || line != "data: one\n" || time.Since(start) > 2*time.Second {
		t.Fatalf("first SSE event: %q %v after %s", line, err, time.Since(start))
	}

	conn, err := net.Dial("tcp", e.ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET /preview/%s/ws HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
		id, e.ts.Listener.Addr(), r.Viewer.Token)
	br := bufio.NewReader(conn)
	resp, err = http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	if _, err := conn.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo = %q %v", buf, err)
	}
}

// TestPreviewUnavailable: a service that does not run answers a Berth page saying why (503), with
// its log excerpt when it failed; a board member gets a Start button.
func TestPreviewUnavailable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	id := e.previewService(r.A.ID, "failed", 1)
	c := e.browser(r.Board)
	req, _ := http.NewRequest("GET", e.ts.URL+"/preview/"+id+"/", nil)
	req.Header.Set("Accept", "text/html")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "cannot find module vite") ||
		!strings.Contains(body, "exit code 1") || !strings.Contains(body, "/services/web/start") {
		t.Fatalf("failed preview page: %d\n%s", resp.StatusCode, body)
	}
	if code := e.previewStatus(r.Viewer, "/preview/"+id+"/"); code != http.StatusServiceUnavailable {
		t.Fatalf("script on a failed preview = %d", code)
	}
}

// previewStatus is the status of a GET with a's token.
func (e *testEnv) previewStatus(a actor, path string) int {
	e.t.Helper()
	req, _ := http.NewRequest("GET", e.ts.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+a.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestPreviewCacheScope: the preview proxy's short memory of credentials (preview_cache.go) serves
// /preview/ requests only: a token revoked after a preview request is refused at once everywhere
// else. A service row that this node's supervisor does not vouch for (here: none runs it) is read
// per request, so a stopped service is seen by the very next request.
func TestPreviewCacheScope(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	_, port := previewUpstream(t)
	id := e.previewService(r.A.ID, "running", port)
	get := func(path string) int {
		resp := e.do(e.client(), http.MethodGet, path, nil, map[string]string{"Authorization": "Bearer " + r.Viewer.Token})
		readBody(t, resp)
		return resp.StatusCode
	}
	if code := get("/preview/" + id + "/"); code != http.StatusOK {
		t.Fatalf("preview = %d", code)
	}
	if _, err := e.pool.Exec(context.Background(), `UPDATE runtime_services SET status = 'stopped', port = NULL WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if code := get("/preview/" + id + "/"); code != http.StatusServiceUnavailable {
		t.Fatalf("preview of a service stopped a moment ago = %d, want 503", code)
	}
	if _, err := e.pool.Exec(context.Background(), `UPDATE api_tokens SET revoked_at = now() WHERE token_hash = $1`, db.HashToken(r.Viewer.Token)); err != nil {
		t.Fatal(err)
	}
	if code := get("/api/me"); code != http.StatusUnauthorized {
		t.Fatalf("/api/me with a token revoked after a preview request = %d, want 401", code)
	}
}
