package terminal

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf16"

	"github.com/gorilla/websocket"
)

// wettyServer is WeTTY (npm wetty, installed by scripts/bench-wetty.sh into the directory
// BERTH_BENCH_WETTY names) serving one command on a loopback port in its local, ssh-less mode:
// as root and with its default ssh host (localhost) it runs `--command` itself on a node-pty.
type wettyServer struct {
	cmd  *exec.Cmd
	url  string
	log  *os.File
	once sync.Once
}

// startWetty starts WeTTY for command, or is nil (and says why in the log) when it is not
// installed or cannot run its command without ssh here.
func startWetty(b *testing.B, command string) *wettyServer {
	b.Helper()
	dir := os.Getenv("BERTH_BENCH_WETTY")
	if dir == "" {
		b.Log("WeTTY figures skipped: BERTH_BENCH_WETTY is not set (make bench sets it)")
		return nil
	}
	main := filepath.Join(dir, "node_modules", "wetty", "build", "main.js")
	if _, err := os.Stat(main); err != nil {
		b.Logf("WeTTY figures skipped: %v", err)
		return nil
	}
	if os.Geteuid() != 0 {
		// Not root, WeTTY logs in over ssh for every command: not the same work as a pty.
		b.Log("WeTTY figures skipped: WeTTY runs --command on a local pty only as root")
		return nil
	}
	node, err := exec.LookPath("node")
	if err != nil {
		b.Logf("WeTTY figures skipped: %v", err)
		return nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	logf, err := os.CreateTemp(b.TempDir(), "wetty-*.log")
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(node, main, "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--base", "/wetty",
		"--command", command, "--log-level", "warn")
	cmd.Env = append(benchEnv(), "NODE_ENV=production")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatalf("start WeTTY: %v", err)
	}
	w := &wettyServer{cmd: cmd, log: logf, url: fmt.Sprintf("ws://127.0.0.1:%d/wetty/socket.io/?EIO=4&transport=websocket", port)}
	b.Cleanup(w.stop)
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
			return w
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(logf.Name())
			b.Fatalf("WeTTY did not listen on %d within 30 s: %s", port, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (w *wettyServer) stop() {
	w.once.Do(func() {
		_ = syscall.Kill(-w.cmd.Process.Pid, syscall.SIGKILL)
		_ = w.cmd.Wait()
		w.log.Close()
	})
}

func (w *wettyServer) rss() (int64, error) { return procRSS(w.cmd.Process.Pid) }

// wettyTerm is a socket.io v4 client over Engine.IO 4's WebSocket transport, speaking what
// WeTTY's page speaks: input and resize out, data (a string) in, and commit for WeTTY's flow
// control (it pauses the pty with 2 MiB unacknowledged). It acknowledges each data event at
// once, as a client that renders instantly would.
type wettyTerm struct {
	conn   *websocket.Conn
	exited bool
}

func (w *wettyServer) attach() (*wettyTerm, error) {
	d := websocket.Dialer{ReadBufferSize: 32 << 10, WriteBufferSize: 32 << 10, HandshakeTimeout: benchWait}
	conn, _, err := d.Dial(w.url, nil)
	if err != nil {
		return nil, fmt.Errorf("wetty dial: %w", err)
	}
	t := &wettyTerm{conn: conn}
	// Engine.IO open ("0{sid,…}"), then the socket.io connect to "/" ("40" → "40{sid}").
	if msg, err := t.read(); err != nil || !strings.HasPrefix(msg, "0{") {
		t.close()
		return nil, fmt.Errorf("wetty engine.io open: %q %v", msg, err)
	}
	if err := conn.WriteMessage(websocket.TextMessage, []byte("40")); err != nil {
		t.close()
		return nil, err
	}
	for {
		msg, err := t.read()
		if err != nil {
			t.close()
			return nil, fmt.Errorf("wetty socket.io connect: %w", err)
		}
		if strings.HasPrefix(msg, "40") {
			return t, nil
		}
		if strings.HasPrefix(msg, "44") {
			t.close()
			return nil, fmt.Errorf("wetty refused the connect: %s", msg)
		}
	}
}

func (t *wettyTerm) read() (string, error) {
	wait := benchWait
	if t.exited {
		wait = 300 * time.Millisecond // output a batch timer still holds follows logout
	}
	_ = t.conn.SetReadDeadline(time.Now().Add(wait))
	_, b, err := t.conn.ReadMessage()
	return string(b), err
}

func (t *wettyTerm) emit(args ...any) error {
	b, err := json.Marshal(args)
	if err != nil {
		return err
	}
	return t.conn.WriteMessage(websocket.TextMessage, append([]byte("42"), b...))
}

func (t *wettyTerm) send(p []byte) error { return t.emit("input", string(p)) }

func (t *wettyTerm) recv() ([]byte, error) {
	for {
		msg, err := t.read()
		if err != nil {
			var ne net.Error
			if t.exited && errors.As(err, &ne) && ne.Timeout() {
				return nil, io.EOF
			}
			return nil, err
		}
		switch {
		case msg == "2": // Engine.IO ping
			if err := t.conn.WriteMessage(websocket.TextMessage, []byte("3")); err != nil {
				return nil, err
			}
		case strings.HasPrefix(msg, "41"):
			return nil, io.EOF
		case strings.HasPrefix(msg, "42"):
			var ev []json.RawMessage
			if err := json.Unmarshal([]byte(msg[2:]), &ev); err != nil || len(ev) == 0 {
				return nil, fmt.Errorf("wetty event %q: %v", tail(msg), err)
			}
			var name string
			_ = json.Unmarshal(ev[0], &name)
			switch name {
			case "data":
				var s string
				if len(ev) < 2 || json.Unmarshal(ev[1], &s) != nil {
					return nil, fmt.Errorf("wetty data event %q", tail(msg))
				}
				// WeTTY counts JavaScript string length (UTF-16 code units).
				if err := t.emit("commit", len(utf16.Encode([]rune(s)))); err != nil {
					return nil, err
				}
				return []byte(s), nil
			case "logout":
				t.exited = true
			}
		}
	}
}

func (t *wettyTerm) close() { t.conn.Close() }
