package handlers

import (
	"net/http"
	"testing"

	"github.com/gorilla/websocket"
)

// TestSetupShellResize: a resize frame over the real WebSocket reaches the jailed shell: `stty
// size` and `tput cols` read the new size, and a program waiting in the foreground that traps
// SIGWINCH (as full-screen programs do to redraw) gets the signal and reads the new size. The
// first `stty size` (before any resize) is the negative control: 24 80.
func TestSetupShellResize(t *testing.T) {
	t.Parallel()
	ie := setupImages(t)
	code, sess := ie.call(ie.r.Admin, http.MethodPost, "/api/environments/"+ie.env+"/image-setup-sessions", map[string]any{"ttl_s": 600})
	if code != 201 {
		t.Fatalf("start = %d %v", code, sess)
	}
	id := sess["id"].(string)
	code, tok := ie.mint(ie.r.Admin, id)
	if code != 201 {
		t.Fatalf("mint = %d", code)
	}
	term, f, err := ie.auth(id, tok)
	if err != nil || f["type"] != "ready" {
		t.Fatalf("attach: %v %v", f, err)
	}
	send := func(line string) {
		t.Helper()
		if err := term.c.WriteMessage(websocket.BinaryMessage, []byte(line+"\n")); err != nil {
			t.Fatal(err)
		}
	}
	resize := func(cols, rows int) {
		t.Helper()
		if err := term.c.WriteJSON(map[string]any{"type": "resize", "cols": cols, "rows": rows}); err != nil {
			t.Fatal(err)
		}
	}
	// The markers are computed in the shell, so the echoed command line never matches them.
	send(`echo "size-$(stty size | tr ' ' x)-$((1+1))"`)
	term.until("size-24x80-2")

	resize(100, 30)
	send(`echo "size-$(stty size | tr ' ' x)-cols-$(tput cols)-$((2+1))"`)
	term.until("size-30x100-cols-100-3")

	// A foreground program that redraws on SIGWINCH: it prints the size it then reads.
	send(`sh -c 'trap "echo redraw-\$(tput cols)x\$(tput lines)" WINCH; echo "armed-$((3+1))"; i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done'`)
	term.until("armed-4")
	resize(90, 20)
	term.until("redraw-90x20")
}
