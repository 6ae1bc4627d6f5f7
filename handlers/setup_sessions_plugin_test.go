package handlers

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"berth/db"
	"berth/environment/plugincheck/plugintest"
	"berth/terminal"
	"berth/terminal/imagesetup"

	"berth/environment/datadir"
)

// TestSetupSessionOnPodman: a setup session of a podman environment is the plugin's terminal
// (podman exec -it) in a container of the imported image, over the real WebSocket bridge: a
// command's output comes back, a resize reaches the shell (stty size), Finish is refused with
// image_capture_unsupported (the protocol has no capture; the session stays open), Cancel closes
// the socket and removes the container. A plugin without the terminal capability gets no session
// at all (409 terminal_unsupported, nothing recorded).
func TestSetupSessionOnPodman(t *testing.T) {
	t.Parallel()
	pr := setupPluginRuns(t)
	envID, sock := pr.podmanEnv(map[string]any{})
	terms := terminal.NewRegistry(terminal.Options{AuthTimeout: 5 * time.Second})
	pr.srv.imageSetup = &ImageSetup{Sessions: imagesetup.Sessions{Data: datadir.At(pr.dataDir), Terminals: terms}, Plugins: pr.host}
	ie := &imageEnv{runEnv: pr.runEnv, env: envID, terms: terms}

	code, sess := ie.call(ie.r.Admin, http.MethodPost, "/api/environments/"+envID+"/image-setup-sessions", map[string]any{"ttl_s": 600})
	if code != 201 || sess["status"] != "waiting_for_user" {
		t.Fatalf("start = %d %v", code, sess)
	}
	id := sess["id"].(string)
	row, err := db.SetupSessionByID(context.Background(), pr.pool, pr.r.A.ID, id)
	if err != nil {
		t.Fatal(err)
	}
	container, ok := strings.CutPrefix(row.ProviderRef, "plugin:")
	if !ok || !podmanHas(t, sock, container) {
		t.Fatalf("the session's provider ref %q names no container", row.ProviderRef)
	}

	code, tok := ie.mint(ie.r.Admin, id)
	if code != 201 {
		t.Fatalf("mint = %d", code)
	}
	term, f, err := ie.auth(id, tok)
	if err != nil || f["type"] != "ready" {
		t.Fatalf("attach: %v %v", f, err)
	}
	if err := term.c.WriteMessage(websocket.BinaryMessage, []byte("cat /etc/os-release; echo \"ok-$((6*7))\"\n")); err != nil {
		t.Fatal(err)
	}
	term.until("ok-42")
	if !strings.Contains(term.out.String(), "ID=berth-test") {
		t.Fatalf("the shell is not in the imported image: %q", term.out.String())
	}
	if err := term.c.WriteJSON(map[string]any{"type": "resize", "cols": 123, "rows": 45}); err != nil {
		t.Fatal(err)
	}
	// The resize reaches the container's tty through podman's own resize call, after the
	// plugin's pty: ask again (each answer marked) until the shell reports the new size.
	for n := 0; ; n++ {
		if n == 20 {
			t.Fatalf("the resize did not reach the shell: %q", term.out.String())
		}
		mark := "size-" + strconv.Itoa(n) + "-done"
		if err := term.c.WriteMessage(websocket.BinaryMessage, []byte("stty size; echo size-"+strconv.Itoa(n)+"-\"done\"\n")); err != nil {
			t.Fatal(err)
		}
		term.until(mark)
		if strings.Contains(term.out.String(), "45 123") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The page says what a plugin session is and offers no Finish.
	resp := pr.do(pr.browser(ie.r.Admin), http.MethodGet, "/image-setup-sessions/"+id, nil, nil)
	if page := readBody(t, resp); resp.StatusCode != 200 || !strings.Contains(page, `id="plugin-setup-hint"`) ||
		strings.Contains(page, `id="finish-setup"`) || !strings.Contains(page, `id="cancel-setup"`) {
		t.Fatalf("plugin setup session page = %d %q", resp.StatusCode, page)
	}

	// Finish: no capture through a plugin; nothing changes.
	code, out := ie.call(ie.r.Admin, http.MethodPost, "/api/image-setup-sessions/"+id+"/finish", nil)
	if code != 409 || out["error"].(map[string]any)["code"] != "image_capture_unsupported" {
		t.Fatalf("finish on a plugin session = %d %v, want 409 image_capture_unsupported", code, out)
	}
	if got := ie.waitSession(id, "waiting_for_user"); got["result_version"] != nil {
		t.Fatalf("session after a refused finish = %v", got)
	}

	// Cancel: the socket is told, the container goes.
	if code, out := ie.call(ie.r.Admin, http.MethodPost, "/api/image-setup-sessions/"+id+"/cancel", nil); code != 202 {
		t.Fatalf("cancel = %d %v", code, out)
	}
	for {
		f, err := term.next(time.Now().Add(10 * time.Second))
		if err != nil {
			t.Fatalf("no closed frame after cancel: %v", err)
		}
		if f["type"] == "closed" {
			if f["reason"] != "setup_cancelled" {
				t.Fatalf("closed %v", f)
			}
			break
		}
	}
	if podmanHas(t, sock, container) {
		t.Fatal("the session's container outlived its cancel")
	}

	// A plugin without the terminal capability: refused, nothing recorded.
	sum := plugintest.Build(t, "./environment/plugincheck/testplugin", pr.dir, "keeper")
	keeper := pr.usePlugin("keeper", sum, map[string]any{})
	code, out = ie.call(ie.r.Admin, http.MethodPost, "/api/environments/"+keeper+"/image-setup-sessions", nil)
	if code != 409 || out["error"].(map[string]any)["code"] != "terminal_unsupported" {
		t.Fatalf("setup session on a plugin without a terminal = %d %v, want 409 terminal_unsupported", code, out)
	}
	if n := pr.count(`SELECT count(*) FROM image_setup_sessions WHERE environment_id = $1`, keeper); n != 0 {
		t.Fatalf("%d sessions recorded for a refused start", n)
	}
}
