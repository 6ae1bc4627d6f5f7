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
		w.Header().Add("Set-Cookie", "wide=1; Domain=localhost; Path=/")
		w.Header().Add("Set-Cookie", "__Host-berth_session=evil; Path=/; Secure")
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

// origin is the preview origin of service id ("http://localhost:PORT"), its listener opened.
func (e *testEnv) origin(id string) string {
	e.t.Helper()
	svc, err := db.RuntimeServiceForProxy(context.Background(), e.pool, id)
	if err != nil {
		e.t.Fatal(err)
	}
	u := strings.TrimSuffix(e.srv.preview.URL(svc), "/")
	if !strings.HasPrefix(u, "http://localhost:") {
		e.t.Fatalf("preview URL %q is not on a preview origin", u)
	}
	return u
}

// openPreview follows Berth's /preview/{id}{path} to the preview origin as a browser would
// (the ticket exchange included) and returns each hop's response, the last one the page.
func (e *testEnv) openPreview(c *http.Client, id, path string) []*http.Response {
	e.t.Helper()
	u := e.ts.URL + "/preview/" + id + path
	var hops []*http.Response
	for range 6 {
		req, _ := http.NewRequest("GET", u, nil)
		req.Header.Set("Accept", "text/html")
		resp, err := c.Do(req)
		if err != nil {
			e.t.Fatal(err)
		}
		resp.Body.Close()
		hops = append(hops, resp)
		loc, err := resp.Location()
		if err != nil {
			break
		}
		u = loc.String()
	}
	return hops
}

// TestPreviewOrigin: a preview is served on an origin of its own, never Berth's. Berth's
// /preview/{id}/… answers a member with a redirect carrying a single-use ticket; the preview
// origin spends it once and sets a preview-only cookie; the service then sees the path and query
// unchanged, its own Host, the forwarded headers, and neither Berth's session cookie, a preview
// cookie nor an Authorization header; its Set-Cookie for Berth's names is dropped and a Domain
// attribute removed. Bearer tokens work on the preview origin directly. Another company gets
// 404 on both origins; no credentials: Berth sends a browser to /login, the preview origin sends
// it to Berth, scripts get 401.
func TestPreviewOrigin(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	_, port := previewUpstream(t)
	id := e.previewService(r.A.ID, "running", port)
	origin := e.origin(id)

	viewer := e.browser(r.Viewer)
	hops := e.openPreview(viewer, id, "/some/page?x=1&y=2")
	if len(hops) != 3 || hops[0].StatusCode != http.StatusSeeOther || hops[1].StatusCode != http.StatusSeeOther {
		t.Fatalf("hops = %d, first %d", len(hops), hops[0].StatusCode)
	}
	ticketURL := hops[0].Header.Get("Location")
	if !strings.HasPrefix(ticketURL, origin+"/__berth/preview-ticket?") {
		t.Fatalf("Berth's origin sent the browser to %q, want the preview origin's ticket path", ticketURL)
	}
	if hops[0].Header.Get("Content-Type") == "application/json" {
		t.Fatal("Berth's origin answered with the service's bytes")
	}
	var cookie *http.Cookie
	for _, c := range hops[1].Cookies() {
		if strings.HasPrefix(c.Name, "berth_preview_") {
			cookie = c
		}
	}
	if cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteLaxMode || cookie.Domain != "" || cookie.Path != "/" {
		t.Fatalf("preview cookie = %+v, want HttpOnly, SameSite=Lax, host-only", cookie)
	}
	page := hops[2]
	if page.StatusCode != 200 || page.Request.URL.String() != origin+"/some/page?x=1&y=2" {
		t.Fatalf("page = %d at %s", page.StatusCode, page.Request.URL)
	}
	// The same ticket again: refused, no cookie.
	resp, err := e.client().Get(ticketURL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || len(resp.Cookies()) != 0 {
		t.Fatalf("replayed ticket = %d %v", resp.StatusCode, resp.Cookies())
	}

	// What reached the service, and what it may set.
	req, _ := http.NewRequest("GET", origin+"/some/page?x=1&y=2", nil)
	req.AddCookie(&http.Cookie{Name: "app", Value: "kept"})
	resp, err = viewer.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != 200 {
		t.Fatalf("viewer on the preview origin: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	want := map[string]string{"path": "/some/page", "query": "x=1&y=2", "host": "127.0.0.1:" + strconv.Itoa(port),
		"prefix": "", "proto": "http", "fwd_host": strings.TrimPrefix(origin, "http://"), "authorization": ""}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s upstream = %q, want %q", k, got[k], v)
		}
	}
	if strings.Contains(got["cookie"], "berth_") || !strings.Contains(got["cookie"], "app=kept") {
		t.Errorf("upstream cookies = %q: Berth's and the preview's cookies must go, the app's own stay", got["cookie"])
	}
	sawApp := false
	for _, v := range resp.Header.Values("Set-Cookie") {
		if strings.HasPrefix(v, "berth_session=") || strings.Contains(strings.ToLower(v), "domain=") {
			t.Errorf("a Set-Cookie passed unconfined: %q", v)
		}
		sawApp = sawApp || strings.HasPrefix(v, "app=ok")
	}
	if !sawApp {
		t.Errorf("the app's own cookie did not pass: %q", resp.Header.Values("Set-Cookie"))
	}

	// A bearer token works on the preview origin; the header never reaches the service.
	req, _ = http.NewRequest("GET", origin+"/", nil)
	req.Header.Set("Authorization", "Bearer "+r.Board.Token)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got = map[string]string{}
	_ = json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if resp.StatusCode != 200 || got["authorization"] != "" || got["path"] != "/" {
		t.Fatalf("board with a token: %d %v", resp.StatusCode, got)
	}
	// Another company: 404 on both origins, as for a missing service.
	if code := e.previewStatus(r.Other, "/preview/"+id+"/"); code != 404 {
		t.Fatalf("another company on Berth's origin = %d", code)
	}
	if code := originStatus(t, origin+"/", r.Other.Token); code != 404 {
		t.Fatalf("another company on the preview origin = %d", code)
	}
	if code := originStatus(t, origin+"/", "not-a-token"); code != 401 {
		t.Fatalf("a bad token on the preview origin = %d", code)
	}
	// No credentials.
	noRedirect := e.client()
	req, _ = http.NewRequest("GET", e.ts.URL+"/preview/"+id+"/", nil)
	req.Header.Set("Accept", "text/html,application/xhtml+xml")
	resp, err = noRedirect.Do(req)
	if err != nil || resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login") {
		t.Fatalf("anonymous browser on Berth: %v %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	req, _ = http.NewRequest("GET", origin+"/deep?q=1", nil)
	req.Header.Set("Accept", "text/html")
	resp, err = noRedirect.Do(req)
	if err != nil || resp.StatusCode != http.StatusSeeOther ||
		resp.Header.Get("Location") != e.ts.URL+"/preview/"+id+"/?next=%2Fdeep%3Fq%3D1" {
		t.Fatalf("anonymous browser on the preview origin: %v %q %v", resp.StatusCode, resp.Header.Get("Location"), err)
	}
	resp.Body.Close()
	if code := originStatus(t, origin+"/", ""); code != http.StatusUnauthorized {
		t.Fatalf("anonymous script on the preview origin = %d", code)
	}
}

// originStatus is the status of a GET of u with token ("" for none).
func originStatus(t *testing.T, u, token string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", u, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestPreviewCookieScope: the preview cookie is worth nothing beyond its own service's origin:
// Berth's API refuses it, another service's origin ignores it, a ticket minted for one service
// does not open another, and a request another page made (Sec-Fetch-Site cross-site/same-site,
// not a navigation) does not carry it; the same cookie on a navigation of its own origin does.
func TestPreviewCookieScope(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	_, port := previewUpstream(t)
	_, port2 := previewUpstream(t)
	id := e.previewService(r.A.ID, "running", port)
	other := e.otherService(r.A.ID, port2)
	origin, otherOrigin := e.origin(id), e.origin(other)
	hops := e.openPreview(e.browser(r.Viewer), id, "/")
	var cookie *http.Cookie
	for _, c := range hops[1].Cookies() {
		if strings.HasPrefix(c.Name, "berth_preview_") {
			cookie = c
		}
	}
	if cookie == nil || hops[len(hops)-1].StatusCode != 200 {
		t.Fatalf("no preview session: %v", hops)
	}
	get := func(u string, h map[string]string) int {
		req, _ := http.NewRequest("GET", u, nil)
		req.AddCookie(cookie)
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(origin+"/", nil); code != 200 {
		t.Fatalf("the cookie on its own origin = %d (the probe must work)", code)
	}
	if code := get(e.ts.URL+"/api/me", nil); code != http.StatusUnauthorized {
		t.Errorf("the preview cookie on Berth's API = %d, want 401", code)
	}
	renamed := *cookie
	renamed.Name = "berth_preview_" + strings.ReplaceAll(other, "-", "")
	req, _ := http.NewRequest("GET", otherOrigin+"/", nil)
	req.AddCookie(&renamed)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("service A's cookie value under service B's name = %d, want 401", resp.StatusCode)
	}
	if code := get(otherOrigin+"/", nil); code != http.StatusUnauthorized {
		t.Errorf("service A's cookie on service B's origin = %d, want 401", code)
	}
	for _, site := range []string{"cross-site", "same-site"} {
		if code := get(origin+"/", map[string]string{"Sec-Fetch-Site": site, "Sec-Fetch-Mode": "cors"}); code != http.StatusUnauthorized {
			t.Errorf("a %s fetch with the cookie = %d, want 401", site, code)
		}
	}
	if code := get(origin+"/", map[string]string{"Origin": otherOrigin}); code != http.StatusUnauthorized {
		t.Errorf("a request from another origin with the cookie = %d, want 401", code)
	}
	if code := get(origin+"/", map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}); code != 200 {
		t.Errorf("a top-level navigation with the cookie = %d, want 200", code)
	}
	// A ticket for service A spent on service B's origin sets nothing.
	ticket := e.openPreview(e.browser(r.Viewer), id, "/")[0].Header.Get("Location")
	resp, err = http.Get(strings.Replace(ticket, origin, otherOrigin, 1))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || len(resp.Cookies()) != 0 {
		t.Errorf("service A's ticket on service B's origin = %d %v", resp.StatusCode, resp.Cookies())
	}
}

// otherService records a second running service of company cid, in a workspace of its own.
func (e *testEnv) otherService(cid string, port int) string {
	e.t.Helper()
	ctx := context.Background()
	var pid, ws, id string
	if err := e.pool.QueryRow(ctx, `SELECT id FROM projects WHERE company_id = $1 LIMIT 1`, cid).Scan(&pid); err != nil {
		e.t.Fatal(err)
	}
	if err := e.pool.QueryRow(ctx, `INSERT INTO execution_workspaces (company_id, project_id, mode, strategy, ref, status)
		VALUES ($1, $2, 'isolated', 'copy', 'ws-' || md5(random()::text), 'ready') RETURNING id`, cid, pid).Scan(&ws); err != nil {
		e.t.Fatal(err)
	}
	if err := e.pool.QueryRow(ctx, `INSERT INTO runtime_services (company_id, execution_workspace_id, name, status, port, node_id)
		VALUES ($1, $2, 'api', 'running', $3, 'n') RETURNING id`, cid, ws, port).Scan(&id); err != nil {
		e.t.Fatal(err)
	}
	return id
}

// TestPreviewStreamsAndUpgrades: an SSE event arrives before the stream ends, and a WebSocket
// upgrade passes both ways.
func TestPreviewStreamsAndUpgrades(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	_, port := previewUpstream(t)
	id := e.previewService(r.A.ID, "running", port)

	origin := e.origin(id)
	req, _ := http.NewRequest("GET", origin+"/sse", nil)
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

	host := strings.TrimPrefix(origin, "http://")
	conn, err := net.Dial("tcp", strings.Replace(host, "localhost", "127.0.0.1", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
		host, r.Viewer.Token)
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
	id := e.previewService(r.A.ID, "running", 1)
	origin := e.origin(id) // it had a preview origin while it ran
	if _, err := e.pool.Exec(context.Background(), `UPDATE runtime_services SET status = 'failed', log_excerpt = 'Error: cannot find module vite',
		exit_code = 1, stop_reason = 'exited' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
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
	// On the preview origin: a browser is sent to Berth's page, a script gets 503.
	if code := originStatus(t, origin+"/", r.Viewer.Token); code != http.StatusServiceUnavailable {
		t.Fatalf("script on the failed preview's origin = %d", code)
	}
	req, _ = http.NewRequest("GET", origin+"/", nil)
	req.Header.Set("Accept", "text/html")
	req.Header.Set("Authorization", "Bearer "+r.Viewer.Token)
	resp, err = e.client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != e.ts.URL+"/preview/"+id+"/" {
		t.Fatalf("browser on the failed preview's origin: %d %q", resp.StatusCode, resp.Header.Get("Location"))
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

// TestPreviewCacheScope: the preview origin's short memory (handlers/preview/cache.go) never
// outlives what it may: a service row that this node's supervisor does not vouch for (here: none
// runs it) is read per request, so a stopped service is seen by the very next request; and
// Berth's own routes resolve a credential per request, so a token revoked after a preview
// request is refused there at once.
func TestPreviewCacheScope(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	_, port := previewUpstream(t)
	id := e.previewService(r.A.ID, "running", port)
	origin := e.origin(id)
	if code := originStatus(t, origin+"/", r.Viewer.Token); code != http.StatusOK {
		t.Fatalf("preview = %d", code)
	}
	if _, err := e.pool.Exec(context.Background(), `UPDATE runtime_services SET status = 'stopped', port = NULL WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if code := originStatus(t, origin+"/", r.Viewer.Token); code != http.StatusServiceUnavailable {
		t.Fatalf("preview of a service stopped a moment ago = %d, want 503", code)
	}
	if _, err := e.pool.Exec(context.Background(), `UPDATE api_tokens SET revoked_at = now() WHERE token_hash = $1`, db.HashToken(r.Viewer.Token)); err != nil {
		t.Fatal(err)
	}
	resp := e.do(e.client(), http.MethodGet, "/api/me", nil, map[string]string{"Authorization": "Bearer " + r.Viewer.Token})
	readBody(t, resp)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("/api/me with a token revoked after a preview request = %d, want 401", resp.StatusCode)
	}
}
