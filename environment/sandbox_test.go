package environment

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sandboxFixture is a data dir like Berth's with a workspace and an image layer holding a tool
// and an env file, and a sandbox driver over them.
type sandboxFixture struct {
	data, ws, image string
}

func newSandboxFixture(t *testing.T) sandboxFixture {
	t.Helper()
	root := workDir(t)
	f := sandboxFixture{data: filepath.Join(root, "data")}
	f.ws = filepath.Join(f.data, "workspaces", "ws-s")
	f.image = filepath.Join(f.data, "images", "env-1", "1")
	for _, d := range []string{f.ws, filepath.Join(f.image, "bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(f.data, "secret.key"), "the-secret-key", 0o644)
	write(t, filepath.Join(f.image, "bin", "berth-hello"), "#!/bin/sh\necho hello from the image\n", 0o755)
	write(t, filepath.Join(f.image, "env"), "# image variables\nGREETING=hi there\n", 0o644)
	return f
}

func (f sandboxFixture) driver(t *testing.T, cfg SandboxConfig) *sandbox {
	t.Helper()
	d, err := newSandbox(Config{Driver: DriverSandbox, Sandbox: cfg}, Options{Jail: &testJail, DataDir: f.data, ImageDir: f.image})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func (f sandboxFixture) run(t *testing.T, ctx context.Context, d *sandbox, command string, timeout time.Duration) (ExecResult, string) {
	t.Helper()
	var log bytes.Buffer
	res, err := execWithin(t, ctx, d, ExecRequest{Command: command, Dir: f.ws, Tag: newTag(t), Log: &log, Timeout: timeout,
		Env: map[string]string{"BERTH_RUN_TOKEN": "run-token"}})
	if err != nil {
		t.Fatalf("exec %q: %v (log %q)", command, err, log.String())
	}
	return res, log.String()
}

// TestSandbox checks the sandbox profile's promises on real bubblewrap: what a command sees, what
// it cannot reach, and who it is.
func TestSandbox(t *testing.T) {
	t.Parallel()
	f := newSandboxFixture(t)
	d := f.driver(t, SandboxConfig{MemoryMB: 256, PidsMax: 256})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	refused := []struct{ name, command string }{
		{"see the data dir", "ls " + f.data},
		{"read the secret key", "cat " + filepath.Join(f.data, "secret.key")},
		{"see /root or /home", "ls /root || ls -A /home | grep ."},
		{"see the host's /etc/shadow", "cat /etc/shadow"},
		{"see the host's /var", "ls /var/lib"},
		{"reach the network", "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", " + port + "), 2)'"},
		{"write the image", "touch /opt/image/planted"},
		{"write /usr", "touch /usr/planted"},
		{"see a host process", "ps -eo args | grep -a -- '-test\\.' | grep -v grep"},
		{"keep a capability", "grep -q '^CapEff:[[:space:]]*0*$' /proc/self/status && exit 1 || exit 0"},
	}
	for _, c := range refused {
		t.Run(c.name, func(t *testing.T) {
			if res, log := f.run(t, t.Context(), d, c.command, 30*time.Second); res.ExitCode == 0 {
				t.Fatalf("%q succeeded in the sandbox: %q", c.command, log)
			}
		})
	}
	allowed := []struct{ name, command, want string }{
		{"run as the sandbox user", "id -u; id -g", fmt.Sprintf("%d\n%d\n", testJail.SandboxUser().UID, testJail.SandboxUser().GID)},
		{"work in /workspace", "pwd; echo ok > made.txt; cat made.txt", "/workspace\nok\n"},
		{"write a private /tmp", "echo ok > /tmp/x && cat /tmp/x", "ok\n"},
		{"find the image's tools first on PATH", "berth-hello; echo $PATH | cut -d: -f1", "hello from the image\n/opt/image/bin\n"},
		{"get the image's variables", `echo "$GREETING"`, "hi there\n"},
		{"get the run's variables", `echo "$BERTH_RUN_TOKEN"`, "run-token\n"},
		{"list a minimal root", "ls /", "bin\ndev\netc\nlib\nlib64\nopt\nproc\nsbin\ntmp\nusr\nworkspace\n"},
		// Also when bubblewrap runs as root and the command as the run user: /etc is not root's alone.
		{"read its /etc", "id -un; test -r /etc/passwd && test -r /etc/ld.so.cache && ls /etc/ssl/certs >/dev/null && echo readable",
			"berth\nreadable\n"},
	}
	for _, c := range allowed {
		t.Run(c.name, func(t *testing.T) {
			res, log := f.run(t, t.Context(), d, c.command, 30*time.Second)
			if res.ExitCode != 0 || log != c.want {
				t.Fatalf("%q: exit %d, output %q, want %q", c.command, res.ExitCode, log, c.want)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(f.ws, "made.txt")); err != nil {
		t.Errorf("/workspace is not the workspace: %v", err)
	}
	if _, err := os.Stat(filepath.Join(f.image, "planted")); err == nil {
		t.Error("the image layer was written")
	}
}

// TestSandboxLimits: memory_mb, pids_max and timeout_s hold, and an escapee dies with the command.
func TestSandboxLimits(t *testing.T) {
	t.Parallel()
	f := newSandboxFixture(t)
	t.Run("memory", func(t *testing.T) {
		d := f.driver(t, SandboxConfig{MemoryMB: 64})
		res, log := f.run(t, t.Context(), d, "python3 -c 'x = bytearray(256 << 20); print(len(x))'", 30*time.Second)
		if res.ExitCode == 0 || !strings.Contains(log, "MemoryError") {
			t.Fatalf("256 MiB under a 64 MiB limit: exit %d, %q", res.ExitCode, log)
		}
		res, log = f.run(t, t.Context(), d, "python3 -c 'x = bytearray(16 << 20); print(len(x))'", 30*time.Second)
		if res.ExitCode != 0 {
			t.Fatalf("16 MiB under a 64 MiB limit: exit %d, %q", res.ExitCode, log)
		}
	})
	t.Run("pids", func(t *testing.T) {
		d := f.driver(t, SandboxConfig{PidsMax: 20})
		res, log := f.run(t, t.Context(), d, "n=0; for i in $(seq 60); do sleep 5 & n=$((n+1)); done 2>&1; kill $(jobs -p) 2>/dev/null; echo started", 30*time.Second)
		if !strings.Contains(log, "fork") && !strings.Contains(log, "Resource temporarily unavailable") && !strings.Contains(log, "Cannot") {
			t.Fatalf("60 processes under pids_max 20: exit %d, %q", res.ExitCode, log)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		d := f.driver(t, SandboxConfig{TimeoutS: 1})
		start := time.Now()
		res, _ := f.run(t, t.Context(), d, "sleep 60", 0)
		if !res.TimedOut {
			t.Fatalf("timeout_s 1: %+v after %s", res, time.Since(start))
		}
	})
	t.Run("escapee", func(t *testing.T) {
		d := f.driver(t, SandboxConfig{})
		marker := "334." + strconv.Itoa(os.Getpid())
		f.run(t, t.Context(), d, "setsid env -u BERTH_RUN_ID sleep "+marker+" & sleep 0.2", 0)
		deadline := time.Now().Add(5 * time.Second)
		for len(findCmdline("sleep "+marker)) > 0 {
			if time.Now().After(deadline) {
				t.Fatal("the escapee outlived the sandbox by 5 s")
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// TestSandboxNetworkOn: network: true shares the host network.
func TestSandboxNetworkOn(t *testing.T) {
	t.Parallel()
	f := newSandboxFixture(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	d := f.driver(t, SandboxConfig{Network: true})
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	res, log := f.run(t, t.Context(), d, "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", "+port+"), 2)'", 30*time.Second)
	if res.ExitCode != 0 {
		t.Fatalf("network on: exit %d %q", res.ExitCode, log)
	}
}

func TestSandboxProbe(t *testing.T) {
	t.Parallel()
	f := newSandboxFixture(t)
	r, err := f.driver(t, SandboxConfig{}).Probe(context.Background())
	if err != nil || !r.OK {
		t.Fatalf("probe = %+v, %v", r, err)
	}
}

func TestReadImageEnvRefuses(t *testing.T) {
	t.Parallel()
	for _, body := range []string{"NOEQUALS\n", "BERTH_RUN_TOKEN=x\n", "1BAD=x\n", "A B=x\n"} {
		dir := workDir(t)
		write(t, filepath.Join(dir, "env"), body, 0o644)
		if _, err := readImageEnv(dir); err == nil {
			t.Errorf("env file %q accepted", body)
		}
	}
}
