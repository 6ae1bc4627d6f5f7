package imagesetup

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"berth/environment"
	"berth/environment/datadir"
	"berth/environment/jail"
	"berth/environment/jail/jailtest"
	"berth/terminal"
)

// setup is a node's setup sessions over a fresh data dir, with this machine's jail (nil: none)
// and a registry whose sessions are closed when the test ends.
func setup(t *testing.T, withJail bool) *Sessions {
	t.Helper()
	n := &Sessions{Data: datadir.At(jailtest.Dir(t)), Terminals: terminal.NewRegistry(terminal.Options{})}
	if withJail {
		h, err := jail.Detect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		n.Jail = &h
	}
	return n
}

// sandbox is a sandbox session of environment "env" over base version base, closed at the end.
func sandbox(t *testing.T, n *Sessions, id string, base int) Session {
	t.Cleanup(func() { n.Terminals.Close(id, terminal.ReasonCancelled) })
	return Session{ID: id, EnvironmentID: "env", BaseVersion: base, Expires: time.Now().Add(time.Minute),
		Sandbox: environment.SandboxConfig{PidsMax: 256}}
}

// typeLine attaches a client to session s over a real WebSocket (the registry's Serve, with
// Attach as the authorizer's answer), types line and returns the output up to want.
func typeLine(t *testing.T, n *Sessions, s Session, line, want string) string {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		_ = n.Terminals.Serve(context.Background(), conn, s.ID, func(context.Context, string) (terminal.Attach, error) {
			return n.Attach(s), nil
		})
	}))
	t.Cleanup(ts.Close)
	c, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(ts.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.WriteJSON(map[string]string{"type": "auth", "token": "t"}); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteMessage(websocket.BinaryMessage, []byte(line+"\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	var out strings.Builder
	for !strings.Contains(out.String(), want) {
		typ, b, err := c.ReadMessage()
		if err != nil {
			t.Fatalf("waiting for %q: %v; output %q", want, err, out.String())
		}
		if typ == websocket.BinaryMessage {
			out.Write(b)
		}
	}
	return out.String()
}

func write(t *testing.T, path, text string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

// TestOpenCopiesTheBaseLayer: Open copies the base version whole into the session's scratch
// layer (contents, executable bits, nested directories, symlinks), leaves the base alone, starts
// the jailed shell in the registry and transcribes its output into a 0600 file in a 0700
// directory.
func TestOpenCopiesTheBaseLayer(t *testing.T) {
	t.Parallel()
	n := setup(t, true)
	base := n.Data.ImageLayer("env", 3)
	write(t, filepath.Join(base, "bin", "tool"), "#!/bin/sh\necho hi\n", 0o755)
	write(t, filepath.Join(base, "env"), "A=1\n", 0o644)
	write(t, filepath.Join(base, "share", "deep", "note"), "deep\n", 0o644)
	if err := os.Symlink("bin/tool", filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	s := sandbox(t, n, "s1", 3)
	if err := n.Open(context.Background(), s); err != nil {
		t.Fatal(err)
	}

	scratch := n.Data.ScratchLayer("env", "s1")
	for name, want := range map[string]string{"bin/tool": "#!/bin/sh\necho hi\n", "env": "A=1\n", "share/deep/note": "deep\n"} {
		b, err := os.ReadFile(filepath.Join(scratch, name))
		if err != nil || string(b) != want {
			t.Errorf("scratch %s = %q %v, want %q", name, b, err, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(scratch, "bin", "tool")); err != nil || fi.Mode().Perm()&0o111 == 0 {
		t.Errorf("scratch bin/tool lost its executable bits: %v %v", fi, err)
	}
	if target, err := os.Readlink(filepath.Join(scratch, "link")); err != nil || target != "bin/tool" {
		t.Errorf("scratch link = %q %v, want the symlink to bin/tool", target, err)
	}
	write(t, filepath.Join(scratch, "new"), "x", 0o644)
	if _, err := os.Stat(filepath.Join(base, "new")); !os.IsNotExist(err) {
		t.Errorf("a change to the scratch layer reached the base version: %v", err)
	}

	sess := n.Terminals.Get("s1")
	if sess == nil || !sess.Live() {
		t.Fatalf("no live shell in the registry after Open: %v", sess)
	}
	// The interactive shell prints its prompt: it reaches the transcript.
	transcript := filepath.Join(n.Data.SetupSession("s1"), "transcript")
	deadline := time.Now().Add(20 * time.Second)
	for sess.Transcribed() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the shell wrote nothing to its transcript")
		}
		time.Sleep(20 * time.Millisecond)
	}
	fi, err := os.Stat(transcript)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Size() == 0 {
		t.Fatalf("transcript %v %v, want a non-empty 0600 file", fi, err)
	}
	if di, err := os.Stat(filepath.Dir(transcript)); err != nil || di.Mode().Perm() != 0o700 {
		t.Fatalf("transcript directory %v %v, want 0700", di, err)
	}

	// The shell runs over the scratch layer at /opt/image, writable, and the base stays as it was.
	out := typeLine(t, n, s, `/opt/image/bin/tool && cat /opt/image/new && touch /opt/image/made && echo "ok-$((6*7))"`, "ok-42")
	if !strings.Contains(out, "hi\r\nx") {
		t.Errorf("the shell's output %q lacks the layer's tool and file", out)
	}
	if _, err := os.Stat(filepath.Join(scratch, "made")); err != nil {
		t.Errorf("the shell's file is not in the scratch layer: %v", err)
	}
	if _, err := os.Stat(filepath.Join(base, "made")); !os.IsNotExist(err) {
		t.Errorf("the shell's file reached the base version: %v", err)
	}

	n.Terminals.Close("s1", terminal.ReasonCancelled)
	if n.Terminals.Get("s1") != nil {
		t.Fatal("the session is still in the registry after Close")
	}
}

// TestVersionOneIsMadeEmpty: version 1 is the empty layer, made on first use, and its scratch
// copy is empty too.
func TestVersionOneIsMadeEmpty(t *testing.T) {
	t.Parallel()
	n := setup(t, false)
	if err := n.copyLayer(Session{ID: "s1", EnvironmentID: "env", BaseVersion: 1}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{n.Data.ImageLayer("env", 1), n.Data.ScratchLayer("env", "s1")} {
		entries, err := os.ReadDir(d)
		if err != nil || len(entries) != 0 {
			t.Errorf("%s = %v %v, want an empty directory", d, entries, err)
		}
	}
	if fi, err := os.Stat(n.Data.ImageLayer("env", 1)); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("version 1's layer %v %v, want 0755", fi, err)
	}
}

// TestOpenStartFailure: a shell that does not start is Open's error, and the registry holds no
// session for it (the caller records the failure and drops the scratch layer).
func TestOpenStartFailure(t *testing.T) {
	t.Parallel()
	n := setup(t, true)
	missing := filepath.Join(t.TempDir(), "no-such-tool")
	n.Jail.Bwrap, n.Jail.Prlimit = missing, missing
	err := n.Open(context.Background(), sandbox(t, n, "s1", 1))
	if err == nil {
		t.Fatal("Open started a shell with no bubblewrap")
	}
	if n.Terminals.Get("s1") != nil {
		t.Fatal("a failed start left its session in the registry")
	}
	// Negative control: the same session on the real jail opens.
	n2 := setup(t, true)
	if err := n2.Open(context.Background(), sandbox(t, n2, "s1", 1)); err != nil {
		t.Fatalf("the real jail: %v", err)
	}
}

// TestOpenRefuses: no jail for a sandbox session, a request already gone and ids that are no
// path element are refused before anything is copied or started; an attach on a node without a
// jail gets an error from its start, not a panic.
func TestOpenRefuses(t *testing.T) {
	t.Parallel()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name     string
		withJail bool
		ctx      context.Context
		id, env  string
		want     error
	}{
		{"no jail", false, context.Background(), "s1", "env", ErrUnavailable},
		{"request gone", true, cancelled, "s1", "env", context.Canceled},
		{"session id with a slash", true, context.Background(), "../s1", "env", nil},
		{"environment id dot-dot", true, context.Background(), "s1", "..", nil},
		{"empty id", true, context.Background(), "", "env", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			n := setup(t, c.withJail)
			s := sandbox(t, n, c.id, 1)
			s.EnvironmentID = c.env
			err := n.Open(c.ctx, s)
			if err == nil || (c.want != nil && !errors.Is(err, c.want)) {
				t.Fatalf("Open = %v, want %v", err, c.want)
			}
			if entries, _ := os.ReadDir(n.Data.Root); len(entries) != 0 {
				t.Fatalf("a refused Open left %v in the data dir", entries)
			}
			if n.Terminals.Get(c.id) != nil {
				t.Fatal("a refused Open left a session in the registry")
			}
		})
	}
	n := setup(t, false)
	if _, err := n.Attach(sandbox(t, n, "s1", 1)).Start(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("attach without a jail: start = %v, want ErrUnavailable", err)
	}
}

// TestTranscriptAppends: the transcript is created 0600 in a 0700 directory and each write is
// appended to what is already there (a later shell of the same session adds to it).
func TestTranscriptAppends(t *testing.T) {
	t.Parallel()
	n := setup(t, false)
	for _, part := range []string{"first shell\n", "second ", "shell\n"} {
		if _, err := n.transcript("s1").Write([]byte(part)); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(n.Data.SetupSession("s1"), "transcript")
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "first shell\nsecond shell\n" {
		t.Fatalf("transcript = %q %v", b, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("transcript mode %v %v, want 0600", fi, err)
	}
	if di, err := os.Stat(filepath.Dir(path)); err != nil || di.Mode().Perm() != 0o700 {
		t.Fatalf("transcript directory %v %v, want 0700", di, err)
	}
}
