package handlers

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"berth/db"
	"berth/environment"
	"berth/environment/jail"
	"berth/terminal"
	"berth/terminal/imagesetup"

	"berth/environment/datadir"
)

// imageEnv is a runEnv with setup sessions on: a sandbox environment (image version 1 active)
// as the project's environment, and a terminal registry.
type imageEnv struct {
	*runEnv
	env   string
	terms *terminal.Registry
}

func setupImages(t *testing.T) *imageEnv {
	t.Helper()
	re := setupRuns(t)
	re.workspaceWith("")
	env := re.useSandbox(environment.SandboxConfig{PidsMax: 256, TimeoutS: 120})
	host, err := jail.Detect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	terms := terminal.NewRegistry(terminal.Options{AuthTimeout: 2 * time.Second})
	re.srv.imageSetup = &ImageSetup{Sessions: imagesetup.Sessions{Data: datadir.At(re.dataDir), Jail: &host, Terminals: terms}}
	return &imageEnv{runEnv: re, env: env, terms: terms}
}

// socket dials the session's terminal with an Origin header ("" for none).
func (ie *imageEnv) socket(id, origin string) (*websocket.Conn, *http.Response, error) {
	h := http.Header{}
	if origin != "" {
		h.Set("Origin", origin)
	}
	c, resp, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(ie.ts.URL, "http")+"/api/image-setup-sessions/"+id+"/terminal", h)
	if err == nil {
		ie.t.Cleanup(func() { c.Close() })
	}
	return c, resp, err
}

func (ie *imageEnv) mint(a actor, id string) (int, string) {
	code, out := ie.call(a, http.MethodPost, "/api/image-setup-sessions/"+id+"/terminal-token", nil)
	tok, _ := out["token"].(string)
	return code, tok
}

// wsPeer reads a terminal socket.
type wsPeer struct {
	t    testing.TB
	c    *websocket.Conn
	out  strings.Builder
	last map[string]any
}

// next reads one frame: output is collected, a control frame is returned (nil on close).
func (p *wsPeer) next(deadline time.Time) (map[string]any, error) {
	_ = p.c.SetReadDeadline(deadline)
	for {
		typ, b, err := p.c.ReadMessage()
		if err != nil {
			return nil, err
		}
		if typ == websocket.BinaryMessage {
			p.out.Write(b)
			continue
		}
		var f map[string]any
		_ = json.Unmarshal(b, &f)
		p.last = f
		return f, nil
	}
}

func (p *wsPeer) until(want string) {
	p.t.Helper()
	_ = p.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	for !strings.Contains(p.out.String(), want) {
		typ, b, err := p.c.ReadMessage()
		if err != nil {
			p.t.Fatalf("waiting for %q: %v; output %q", want, err, p.out.String())
		}
		if typ == websocket.BinaryMessage {
			p.out.Write(b)
		}
	}
}

// auth presents a token and returns the peer and its first control frame.
func (ie *imageEnv) auth(id, token string) (*wsPeer, map[string]any, error) {
	c, _, err := ie.socket(id, ie.ts.URL)
	if err != nil {
		ie.t.Fatal(err)
	}
	p := &wsPeer{t: ie.t, c: c}
	if err := c.WriteJSON(map[string]any{"type": "auth", "token": token}); err != nil {
		ie.t.Fatal(err)
	}
	f, err := p.next(time.Now().Add(20 * time.Second))
	return p, f, err
}

// refused asserts the socket got an error frame and close 1008.
func refused(t testing.TB, what string, p *wsPeer, f map[string]any, err error) {
	t.Helper()
	if err != nil || f["type"] != "error" {
		t.Fatalf("%s: first frame %v %v, want an error frame", what, f, err)
	}
	_, err = p.next(time.Now().Add(5 * time.Second))
	if ce, ok := err.(*websocket.CloseError); !ok || ce.Code != websocket.ClosePolicyViolation {
		t.Fatalf("%s: close %v, want 1008", what, err)
	}
}

func (ie *imageEnv) waitSession(id, status string) map[string]any {
	ie.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, out := ie.call(ie.r.Admin, http.MethodGet, "/api/image-setup-sessions/"+id, nil)
		if code == 200 && out["status"] == status {
			return out
		}
		if time.Now().After(deadline) {
			ie.t.Fatalf("session %s = %d %v, want %s", id, code, out, status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runLog runs command as a task on the sandbox and returns its status and log.
func (ie *imageEnv) runLog(command string) (string, string) {
	ie.t.Helper()
	task := ie.task(command)
	id := ie.start(task.ID, nil)
	run := ie.waitRun(id, "the end", ended)
	return run["status"].(string), ie.log(id)
}

// TestSetupSessionBuildsAnImage: an admin installs a tool through the terminal, finishes, and
// runs see it on a read-only /opt/image; rollback to version 1 removes it again. Token refusals
// and the Origin check are exercised on the way.
func TestSetupSessionBuildsAnImage(t *testing.T) {
	t.Parallel()
	ie := setupImages(t)
	start := "/api/environments/" + ie.env + "/image-setup-sessions"
	if code, out := ie.call(ie.r.Board, http.MethodPost, start, nil); code != 403 {
		t.Fatalf("board member starts a session = %d %v, want 403", code, out)
	}
	if code, out := ie.call(ie.r.Other, http.MethodPost, start, nil); code != 404 {
		t.Fatalf("another company starts a session = %d %v, want 404", code, out)
	}
	if code, out := ie.call(ie.r.Admin, http.MethodPost, start, map[string]any{"ttl_s": 86401}); code != 422 {
		t.Fatalf("ttl over the maximum = %d %v, want 422", code, out)
	}
	code, sess := ie.call(ie.r.Admin, http.MethodPost, start, map[string]any{"ttl_s": 600})
	if code != 201 || sess["status"] != "waiting_for_user" || sess["base_version"] != 1.0 || sess["expires_at"] == nil {
		t.Fatalf("start = %d %v", code, sess)
	}
	id := sess["id"].(string)
	if code, out := ie.call(ie.r.Admin, http.MethodPost, start, nil); code != 409 {
		t.Fatalf("a second live session = %d %v, want 409", code, out)
	}

	// Minting: instance admins only.
	if code, _ := ie.mint(ie.r.Board, id); code != 403 {
		t.Fatalf("board member mints = %d, want 403", code)
	}
	if code, _ := ie.mint(ie.r.Other, id); code != 404 {
		t.Fatalf("another company mints = %d, want 404", code)
	}
	// A foreign Origin is refused before the upgrade.
	if _, resp, err := ie.socket(id, "http://evil.example"); err == nil || resp == nil || resp.StatusCode != 403 {
		t.Fatalf("foreign Origin: %v %v, want 403", resp, err)
	}
	// Garbage, expired and another session's tokens.
	p, f, err := ie.auth(id, "garbage")
	refused(t, "garbage", p, f, err)
	expired, hash := terminal.NewToken()
	if _, err := ie.pool.Exec(context.Background(), `INSERT INTO terminal_tokens (token_hash, company_id, session_id, user_id,
		environment_id, created_at, expires_at) VALUES ($1, $2, $3, $4, $5, now() - interval '2 minutes', now() - interval '1 minute')`,
		hash[:], ie.r.A.ID, id, ie.r.Admin.User.ID, ie.env); err != nil {
		t.Fatal(err)
	}
	p, f, err = ie.auth(id, expired)
	refused(t, "expired", p, f, err)

	code, tok := ie.mint(ie.r.Admin, id)
	if code != 201 || tok == "" {
		t.Fatalf("admin mints = %d", code)
	}
	if n := ie.count(`SELECT count(*) FROM terminal_tokens WHERE token_hash = $1`, sha256Of(tok)); n != 1 {
		t.Fatalf("token stored %d times by its hash", n)
	}
	if n := ie.count(`SELECT count(*) FROM audit_events WHERE details::text LIKE '%' || $1 || '%'`, tok); n != 0 {
		t.Fatal("the token is in the audit trail")
	}
	term, f, err := ie.auth(id, tok)
	if err != nil || f["type"] != "ready" {
		t.Fatalf("attach: %v %v", f, err)
	}
	p, f, err = ie.auth(id, tok)
	refused(t, "replayed", p, f, err)

	// Install a tool into the image.
	install := `mkdir -p /opt/image/bin && printf '#!/bin/sh\necho tool-says-hi\n' > /opt/image/bin/mytool && chmod +x /opt/image/bin/mytool && echo "ok-$((6*7))"` + "\n"
	if err := term.c.WriteMessage(websocket.BinaryMessage, []byte(install)); err != nil {
		t.Fatal(err)
	}
	term.until("ok-42")

	// Finish: the client is told, the capture makes version 2 active.
	code, out := ie.call(ie.r.Admin, http.MethodPost, "/api/image-setup-sessions/"+id+"/finish", nil)
	if code != 202 || out["status"] != "capturing" {
		t.Fatalf("finish = %d %v", code, out)
	}
	for {
		f, err := term.next(time.Now().Add(10 * time.Second))
		if err != nil {
			t.Fatalf("no closed frame after finish: %v", err)
		}
		if f["type"] == "closed" {
			if f["reason"] != "setup_finished" {
				t.Fatalf("closed %v", f)
			}
			break
		}
	}
	done := ie.waitSession(id, "promoted")
	if done["result_version"] != 2.0 {
		t.Fatalf("promoted session = %v", done)
	}
	code, list := ie.call(ie.r.Viewer, http.MethodGet, "/api/environments/"+ie.env+"/image-versions", nil)
	items := list["items"].([]any)
	v2, v1 := items[0].(map[string]any), items[1].(map[string]any)
	if code != 200 || v2["number"] != 2.0 || v2["status"] != "active" || !strings.HasPrefix(v2["digest"].(string), "sha256:") ||
		v2["session_id"] != id || v1["status"] != "available" {
		t.Fatalf("versions after finish = %v", list)
	}
	if _, err := os.Stat(datadir.At(ie.dataDir).ScratchLayer(ie.env, id)); !os.IsNotExist(err) {
		t.Fatalf("scratch layer left after the capture: %v", err)
	}

	probe := `mytool; if touch /opt/image/x 2>/dev/null; then echo image-writable; else echo image-read-only; fi`
	status, log := ie.runLog(probe)
	if status != "succeeded" || !strings.Contains(log, "tool-says-hi") || !strings.Contains(log, "image-read-only") {
		t.Fatalf("run on version 2 = %s %q", status, log)
	}

	// Rollback to version 1: the tool is gone.
	if code, out := ie.call(ie.r.Board, http.MethodPost, "/api/environments/"+ie.env+"/image-versions/1/activate", nil); code != 403 {
		t.Fatalf("board member activates = %d %v", code, out)
	}
	code, out = ie.call(ie.r.Admin, http.MethodPost, "/api/environments/"+ie.env+"/image-versions/1/activate", nil)
	if code != 200 || out["number"] != 1.0 || out["status"] != "active" {
		t.Fatalf("rollback = %d %v", code, out)
	}
	status, log = ie.runLog(probe)
	if strings.Contains(log, "tool-says-hi") || !strings.Contains(log, "image-read-only") {
		t.Fatalf("run after rollback = %s %q", status, log)
	}
	for _, action := range []string{"image_setup_session.started", "terminal_token.minted", "terminal_token.refused",
		"terminal_token.mint.denied", "image_setup_session.finished", "image_setup_session.promoted", "image_version.rolled_back",
		"terminal.origin_refused"} {
		if n := ie.count(`SELECT count(*) FROM audit_events WHERE action = $1`, action); n == 0 {
			t.Errorf("no %s audit event", action)
		}
	}
}

// TestSetupSessionCancel: cancel discards the scratch layer, closes the terminal with
// setup_cancelled and leaves the active version alone; the session takes no more tokens.
func TestSetupSessionCancel(t *testing.T) {
	t.Parallel()
	ie := setupImages(t)
	code, sess := ie.call(ie.r.Admin, http.MethodPost, "/api/environments/"+ie.env+"/image-setup-sessions", nil)
	if code != 201 {
		t.Fatalf("start = %d %v", code, sess)
	}
	id := sess["id"].(string)
	_, tok := ie.mint(ie.r.Admin, id)
	term, f, err := ie.auth(id, tok)
	if err != nil || f["type"] != "ready" {
		t.Fatalf("attach: %v %v", f, err)
	}
	_ = term.c.WriteMessage(websocket.BinaryMessage, []byte("touch /opt/image/junk && echo made-$((1+1))\n"))
	term.until("made-2")
	code, out := ie.call(ie.r.Admin, http.MethodPost, "/api/image-setup-sessions/"+id+"/cancel", nil)
	if code != 202 || out["status"] != "cancelled" {
		t.Fatalf("cancel = %d %v", code, out)
	}
	if f, err := term.next(time.Now().Add(10 * time.Second)); err != nil || f["type"] != "closed" || f["reason"] != "setup_cancelled" {
		t.Fatalf("after cancel: %v %v", f, err)
	}
	if _, err := os.Stat(datadir.At(ie.dataDir).ScratchLayer(ie.env, id)); !os.IsNotExist(err) {
		t.Fatalf("scratch layer left after cancel: %v", err)
	}
	if n := ie.count(`SELECT count(*) FROM image_versions WHERE environment_id = $1`, ie.env); n != 1 {
		t.Fatalf("%d versions after cancel, want 1", n)
	}
	if code, _ := ie.mint(ie.r.Admin, id); code != 409 {
		t.Fatalf("mint after cancel = %d, want 409", code)
	}
	if code, _ := ie.call(ie.r.Admin, http.MethodPost, "/api/image-setup-sessions/"+id+"/finish", nil); code != 409 {
		t.Fatalf("finish after cancel = %d, want 409", code)
	}
	// A new session may start now.
	if code, out := ie.call(ie.r.Admin, http.MethodPost, "/api/environments/"+ie.env+"/image-setup-sessions", nil); code != 201 {
		t.Fatalf("a new session after cancel = %d %v", code, out)
	}
	if n := ie.count(`SELECT count(*) FROM audit_events WHERE action = 'image_setup_session.cancelled' AND target_id = $1`, id); n != 1 {
		t.Fatalf("cancel audited %d times", n)
	}
}

// TestSetupSessionStartFailure: a shell that does not start is a 500 that leaves the session
// failed with the error's text, its scratch layer dropped and nothing in the registry; the
// environment is free for the next session, which starts on a working jail.
func TestSetupSessionStartFailure(t *testing.T) {
	t.Parallel()
	ie := setupImages(t)
	is := ie.srv.imageSetup
	good, broken := is.Jail, *is.Jail
	missing := filepath.Join(t.TempDir(), "no-such-tool")
	broken.Bwrap, broken.Prlimit = missing, missing
	is.Jail = &broken
	start := "/api/environments/" + ie.env + "/image-setup-sessions"
	if code, out := ie.call(ie.r.Admin, http.MethodPost, start, nil); code != 500 {
		t.Fatalf("start on a broken jail = %d %v, want 500", code, out)
	}
	var id, status, msg string
	if err := ie.pool.QueryRow(context.Background(), `SELECT id, status, error FROM image_setup_sessions
		WHERE environment_id = $1`, ie.env).Scan(&id, &status, &msg); err != nil {
		t.Fatal(err)
	}
	if status != db.SetupFailed || !strings.HasPrefix(msg, "start pty: ") || !strings.Contains(msg, missing) {
		t.Fatalf("the failed session = %s %q, want failed with the start's error", status, msg)
	}
	if _, err := os.Stat(datadir.At(ie.dataDir).ScratchLayer(ie.env, id)); !os.IsNotExist(err) {
		t.Fatalf("scratch layer left after a failed start: %v", err)
	}
	if ie.terms.Get(id) != nil {
		t.Fatal("a failed start left its session in the registry")
	}
	is.Jail = good
	if code, out := ie.call(ie.r.Admin, http.MethodPost, start, nil); code != 201 || out["status"] != db.SetupWaitingForUser {
		t.Fatalf("the next session = %d %v, want 201 waiting_for_user", code, out)
	}
}

func sha256Of(tok string) []byte {
	s := sha256.Sum256([]byte(tok))
	return s[:]
}

var _ = db.SetupCapturing
