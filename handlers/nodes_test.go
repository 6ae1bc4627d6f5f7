package handlers

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"berth/db"
	"berth/environment/seal"
	"berth/jobs"
	"berth/static"
	"berth/workspace/receipt"
)

// nodeTestKey is the node-to-node key of the test nodes.
var nodeTestKey = NodeKey(bytes.Repeat([]byte{7}, 32))

// otherNode starts a second web server on the same database as node id, serving only its
// internal listener, and registers the node with that listener's URL.
func (e *testEnv) otherNode(id string, base *url.URL) *httptest.Server {
	e.t.Helper()
	assets, err := static.New()
	if err != nil {
		e.t.Fatal(err)
	}
	secret := bytes.Repeat([]byte{7}, 32)
	sealer, err := seal.New(secret)
	if err != nil {
		e.t.Fatal(err)
	}
	srv, err := New(Deps{Pool: e.pool, Assets: assets, Secrets: sealer, ReceiptKey: receipt.DeriveKey(secret), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		BaseURL: base, Version: "test", Nodes: &Nodes{Self: id, Key: nodeTestKey}})
	if err != nil {
		e.t.Fatal(err)
	}
	ts := httptest.NewServer(srv.InternalHandler())
	e.t.Cleanup(func() { ts.Close(); srv.Close() })
	if err := db.RegisterNode(context.Background(), e.pool, db.NodeRegistration{ID: id, Kind: db.NodeWorker,
		InternalURL: ts.URL, Works: true}); err != nil {
		e.t.Fatal(err)
	}
	return ts
}

// TestInternalListenerRefuses: the internal listener answers only signed, fresh node-to-node
// requests for its own routes: no signature, a wrong key, a tampered path or user, an old
// signature → 401; a signed request for anything else (the API, pages) → 404; a signed preview
// of a service this node does not run → 404.
func TestInternalListenerRefuses(t *testing.T) {
	t.Parallel()
	e := setup(t, func(d *Deps) { d.Nodes = &Nodes{Self: "n1", Key: nodeTestKey} })
	r := e.roles()
	_, port := previewUpstream(t)
	svc := e.previewService(r.A.ID, "running", port) // on node "n", not n1
	in := httptest.NewServer(e.srv.InternalHandler())
	t.Cleanup(in.Close)

	send := func(path, user string, sign func(*http.Request)) int {
		t.Helper()
		req, _ := http.NewRequest("GET", in.URL+path, nil)
		if user != "" {
			req.Header.Set(nodeUserHeader, user)
		}
		if sign != nil {
			sign(req)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	signed := func(key []byte, at time.Time) func(*http.Request) {
		return func(r *http.Request) { signNodeRequest(r, key, at) }
	}
	now := time.Now()
	preview := "/internal/preview/" + svc + "/"
	cases := []struct {
		name, path, user string
		sign             func(*http.Request)
		want             int
	}{
		{"unsigned preview", preview, r.Viewer.User.ID, nil, 401},
		{"unsigned API", "/api/me", "", nil, 401},
		{"wrong key", preview, r.Viewer.User.ID, signed(NodeKey([]byte("another secret key of 32 bytes!!")), now), 401},
		{"stale", preview, r.Viewer.User.ID, signed(nodeTestKey, now.Add(-2*time.Minute)), 401},
		{"garbage", preview, r.Viewer.User.ID, func(r *http.Request) { r.Header.Set(nodeAuthHeader, "x.y") }, 401},
		{"tampered path", preview + "other", r.Viewer.User.ID, func(req *http.Request) {
			signNodeRequest(req, nodeTestKey, now)
			req.URL.Path += "x"
		}, 401},
		{"tampered user", preview, r.Viewer.User.ID, func(req *http.Request) {
			signNodeRequest(req, nodeTestKey, now)
			req.Header.Set(nodeUserHeader, r.Board.User.ID)
		}, 401},
		{"signed API", "/api/me", "", signed(nodeTestKey, now), 404},
		{"signed page", "/", "", signed(nodeTestKey, now), 404},
		{"signed preview of another node's service", preview, r.Viewer.User.ID, signed(nodeTestKey, now), 404},
	}
	for _, tc := range cases {
		if got := send(tc.path, tc.user, tc.sign); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	// The signature covers the body: a body changed after signing (same length or not) is
	// refused; the body as signed passes verification (and then meets the 404 of a service that
	// is not on this node).
	post := func(body string, tamper func(*http.Request)) int {
		t.Helper()
		req, _ := http.NewRequest("POST", in.URL+preview, strings.NewReader(body))
		req.Header.Set(nodeUserHeader, r.Viewer.User.ID)
		if err := signNodeRequest(req, nodeTestKey, now); err != nil {
			t.Fatal(err)
		}
		if tamper != nil {
			tamper(req)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		name   string
		tamper func(*http.Request)
		want   int
	}{
		{"body as signed", nil, 404},
		{"body replaced, same length", func(req *http.Request) {
			req.Body, req.ContentLength = io.NopCloser(strings.NewReader(`{"amount":9}`)), 12
		}, 401},
		{"body appended to", func(req *http.Request) {
			req.Body, req.ContentLength = io.NopCloser(strings.NewReader(`{"amount":1}&more`)), 17
		}, 401},
		{"body digest header swapped for the new body's", func(req *http.Request) {
			req.Body, req.ContentLength = io.NopCloser(strings.NewReader(`{"amount":9}`)), 12
			req.Header.Set(nodeBodyHeader, bodyDigest([]byte(`{"amount":9}`)))
		}, 401},
	} {
		if got := post(`{"amount":1}`, tc.tamper); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}

	// A server without a node key refuses everything.
	bare := httptest.NewServer(setup(t).srv.InternalHandler())
	t.Cleanup(bare.Close)
	req, _ := http.NewRequest("GET", bare.URL+preview, nil)
	signNodeRequest(req, nil, now)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 401 {
		t.Fatalf("no key: %v %v", resp, err)
	}
	if bytes.Equal(nodeTestKey, bytes.Repeat([]byte{7}, 32)) || len(nodeTestKey) != 32 {
		t.Fatal("the node key is not derived")
	}
}

// TestPreviewForwardedToOwningNode: a preview of a service another node runs goes through that
// node's internal listener: a member gets the service's answer (cookies and Authorization
// stripped, the forwarded host the web node's), WebSockets pass both hops, a non-member gets the
// same 404 as ever, and a dead owner is a 503 node_unavailable.
func TestPreviewForwardedToOwningNode(t *testing.T) {
	t.Parallel()
	e := setup(t, func(d *Deps) { d.Nodes = &Nodes{Self: "web", Key: nodeTestKey, DeadAfter: 30 * time.Second} })
	r := e.roles()
	_, port := previewUpstream(t)
	svc := e.previewService(r.A.ID, "running", port)
	if _, err := e.pool.Exec(context.Background(), `UPDATE runtime_services SET node_id = 'w9' WHERE id = $1`, svc); err != nil {
		t.Fatal(err)
	}
	base, _ := url.Parse(e.ts.URL)
	e.otherNode("w9", base)

	viewer := e.browser(r.Viewer)
	origin := e.origin(svc) // this (web) node's preview listener
	hops := e.openPreview(viewer, svc, "/deep/page?q=1")
	if last := hops[len(hops)-1]; last.StatusCode != 200 || last.Request.URL.String() != origin+"/deep/page?q=1" {
		t.Fatalf("ticket flow to a forwarded preview ended at %s with %d", last.Request.URL, last.StatusCode)
	}
	resp, err := viewer.Get(origin + "/deep/page?q=1")
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != 200 {
		t.Fatalf("forwarded preview: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	want := map[string]string{"path": "/deep/page", "query": "q=1", "host": "127.0.0.1:" + strconv.Itoa(port),
		"prefix": "", "fwd_host": strings.TrimPrefix(origin, "http://"), "authorization": ""}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s upstream = %q, want %q", k, got[k], v)
		}
	}
	if strings.Contains(got["cookie"], "berth_") {
		t.Errorf("Berth's session reached the other node's service: %q", got["cookie"])
	}

	// A WebSocket, through the web node and the owning node's internal listener.
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
	up, err := http.ReadResponse(br, nil)
	if err != nil || up.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade through two hops: %v %v", up, err)
	}
	if _, err := conn.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through two hops = %q %v", buf, err)
	}

	// Another company's member: 404, decided on the web node.
	other, _ := http.NewRequest("GET", origin+"/", nil)
	other.Header.Set("Authorization", "Bearer "+r.Other.Token)
	if resp, err := http.DefaultClient.Do(other); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("another company's member: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	// The owner goes silent: 503 node_unavailable (after the web node's short cache).
	if _, err := e.pool.Exec(context.Background(), `UPDATE nodes SET heartbeat_at = now() - interval '1 minute' WHERE id = 'w9'`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(nodeURLTTL + 100*time.Millisecond)
	resp, err = viewer.Get(origin + "/")
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "node that runs this is down") {
		t.Fatalf("dead owner: %d %s", resp.StatusCode, body)
	}
}

// TestNodesAPI: instance admins list the nodes with what each holds; anyone else gets 404.
func TestNodesAPI(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	ctx := context.Background()
	for _, n := range []db.NodeRegistration{{ID: "a", Kind: db.NodeServe}, {ID: "b", Kind: db.NodeWorker, Works: true, Capacity: 8, InternalURL: "http://10.0.0.2:9000"}} {
		if err := db.RegisterNode(ctx, e.pool, n); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.pool.Exec(ctx, `UPDATE nodes SET heartbeat_at = now() - interval '1 minute' WHERE id = 'a'`); err != nil {
		t.Fatal(err)
	}
	_, port := previewUpstream(t)
	svc := e.previewService(r.A.ID, "running", port)
	if _, err := e.pool.Exec(ctx, `UPDATE runtime_services SET node_id = 'b' WHERE id = $1`, svc); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", e.ts.URL+"/api/nodes", nil)
	req.Header.Set("Authorization", "Bearer "+r.Admin.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Items []nodeJSON `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
		t.Fatalf("admin: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if len(out.Items) != 2 || out.Items[0].ID != "b" || !out.Items[0].Alive || out.Items[0].Holds.Services != 1 ||
		out.Items[0].InternalURL != "http://10.0.0.2:9000" || out.Items[0].Capacity != 8 ||
		out.Items[1].ID != "a" || out.Items[1].Alive || out.Items[1].Kind != "serve" || out.Items[1].Capacity != 0 {
		t.Fatalf("nodes = %+v", out.Items)
	}
	for name, a := range map[string]actor{"board": r.Board, "viewer": r.Viewer} {
		if code, _ := e.call(a, "GET", "/api/nodes", nil); code != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", name, code)
		}
		if resp, err := e.browser(a).Get(e.ts.URL + "/admin/nodes"); err != nil || resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s page: %v %v", name, resp.StatusCode, err)
		}
	}
	resp, err = e.browser(r.Admin).Get(e.ts.URL + "/admin/nodes")
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 200 || !strings.Contains(body, "silent") || !strings.Contains(body, ">b<") ||
		!strings.Contains(body, "0 of 8 runs") {
		t.Fatalf("admin page: %d %s", resp.StatusCode, body)
	}
}

// TestCloseOnDeadNode: a workspace whose node was taken over closes at once, from another node,
// as cleanup_failed with the reason (and an audit event); while its node lives, the ordinary
// close is asked of that node (its queue).
func TestCloseOnDeadNode(t *testing.T) {
	t.Parallel()
	e := setup(t, func(d *Deps) {
		client, err := jobs.NewClient(jobs.Deps{Pool: d.Pool, Log: d.Log}, jobs.ClientOptions{Work: false})
		if err != nil {
			t.Fatal(err)
		}
		d.Jobs = client
		d.Nodes = &Nodes{Self: "web", Key: nodeTestKey}
	})
	r := e.roles()
	ctx := context.Background()
	var pid, ws string
	if err := e.pool.QueryRow(ctx, `INSERT INTO projects (company_id, name, key) VALUES ($1, 'P', 'DED') RETURNING id`, r.A.ID).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if err := e.pool.QueryRow(ctx, `INSERT INTO execution_workspaces (company_id, project_id, mode, strategy, ref, status, node_id)
		VALUES ($1, $2, 'isolated', 'copy', 'ws-' || md5(random()::text), 'ready', 'gone') RETURNING id`, r.A.ID, pid).Scan(&ws); err != nil {
		t.Fatal(err)
	}
	if err := db.RegisterNode(ctx, e.pool, db.NodeRegistration{ID: "gone", Kind: db.NodeWorker, Works: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE nodes SET taken_over_at = now(), heartbeat_at = now() - interval '1 hour' WHERE id = 'gone'`); err != nil {
		t.Fatal(err)
	}
	code, out := e.call(r.Board, "PATCH", "/api/execution-workspaces/"+ws, map[string]any{"status": "closed"})
	if code != http.StatusAccepted || out["status"] != "cleanup_failed" || !strings.Contains(fmt.Sprint(out["cleanup_reason"]), "node gone is dead") ||
		out["node_id"] != "gone" {
		t.Fatalf("close on a dead node: %d %v", code, out)
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE action = 'execution_workspace.close_node_dead' AND target_id = $1`, ws); n != 1 {
		t.Errorf("audit events = %d", n)
	}
	if n := e.count(`SELECT count(*) FROM river_job WHERE kind = 'close_workspace'`); n != 0 {
		t.Errorf("%d close jobs for a workspace nobody can reach", n)
	}
	if code, _ := e.call(r.Viewer, "PATCH", "/api/execution-workspaces/"+ws, map[string]any{"status": "closed"}); code != http.StatusForbidden && code != http.StatusNotFound {
		t.Errorf("a viewer's close: %d", code)
	}
}

// TestTerminalForwardedToOwningNode: a setup session's terminal WebSocket reaching a web node
// that does not hold the session's shell is passed, signed, to the owning node's internal
// listener and switches protocols through it; the Origin check still comes first.
func TestTerminalForwardedToOwningNode(t *testing.T) {
	t.Parallel()
	e := setup(t, func(d *Deps) { d.Nodes = &Nodes{Self: "web", Key: nodeTestKey, DeadAfter: 30 * time.Second} })
	r := e.roles()
	ctx := context.Background()
	var env, sess string
	if err := e.pool.QueryRow(ctx, `INSERT INTO environments (company_id, name, driver, config)
		VALUES ($1, 'sb', 'sandbox', '{}') RETURNING id`, r.A.ID).Scan(&env); err != nil {
		t.Fatal(err)
	}
	if err := e.pool.QueryRow(ctx, `INSERT INTO image_setup_sessions (company_id, environment_id, base_version, status,
			expires_at, node_id) VALUES ($1, $2, 1, 'waiting_for_user', now() + interval '1 hour', 'w9') RETURNING id`,
		r.A.ID, env).Scan(&sess); err != nil {
		t.Fatal(err)
	}
	// The owning node's internal listener, faked: it checks the signature and echoes raw bytes.
	seen := make(chan string, 1)
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !verifyNodeRequest(req, nodeTestKey, time.Now()) || req.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "refused", http.StatusUnauthorized)
			return
		}
		seen <- req.URL.Path + " origin=" + req.Header.Get("Origin")
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
	}))
	t.Cleanup(owner.Close)
	if err := db.RegisterNode(ctx, e.pool, db.NodeRegistration{ID: "w9", Kind: db.NodeServe, InternalURL: owner.URL, Works: true}); err != nil {
		t.Fatal(err)
	}
	dial := func(origin string) (*http.Response, *bufio.Reader, net.Conn) {
		t.Helper()
		conn, err := net.Dial("tcp", e.ts.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(conn, "GET /api/image-setup-sessions/%s/terminal HTTP/1.1\r\nHost: %s\r\nOrigin: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
			sess, e.ts.Listener.Addr(), origin)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		return resp, br, conn
	}
	if resp, _, _ := dial("http://evil.example"); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-origin: %d, want 403 before any forwarding", resp.StatusCode)
	}
	resp, br, conn := dial(e.ts.URL)
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("forwarded upgrade: %d", resp.StatusCode)
	}
	if got := <-seen; got != "/internal/image-setup-sessions/"+sess+"/terminal origin="+e.ts.URL {
		t.Errorf("the owner saw %q", got)
	}
	if _, err := conn.Write([]byte("keys")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "keys" {
		t.Fatalf("echo through the web node = %q %v", buf, err)
	}
}
