// Package plugintest builds plugins and starts rootful podman for tests of plugin environments:
// real executables in a directory the plugin user can reach, and a podman API service on a
// socket of its own.
package plugintest

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"berth/environment"
)

// Dir is a fresh 0755 directory below /var/tmp (reachable by the plugin user; not the jail's
// private /tmp).
func Dir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "berth-plugintest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// moduleDir is the repository root (where go build runs).
func moduleDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// Build builds the main package pkg (relative to the repository root, e.g.
// "./cmd/berth-driver-podman") as dir/name, static, and returns its sha256.
func Build(t testing.TB, pkg, dir, name string) string {
	t.Helper()
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = moduleDir()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, b)
	}
	if err := os.Chmod(out, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Podman starts a rootful podman API service on a socket in a fresh directory, connectable by
// runAs's group, and returns the socket. It uses runc when installed: Debian's crun 1.8 refuses
// hosts whose cgroups are in hybrid mode.
func Podman(t testing.TB, runAs *environment.PluginIdentity) string {
	t.Helper()
	if _, err := exec.LookPath("podman"); err != nil {
		t.Fatal("podman is not installed: run scripts/test-deps.sh")
	}
	sock := filepath.Join(Dir(t), "podman.sock")
	args := []string{"system", "service", "--time=0", "unix://" + sock}
	if _, err := exec.LookPath("runc"); err == nil {
		args = append([]string{"--runtime", "runc"}, args...)
	}
	cmd := exec.Command("podman", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the podman service made no socket within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if runAs != nil {
		if err := os.Chown(sock, 0, runAs.GID); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(sock, 0o660); err != nil {
			t.Fatal(err)
		}
	}
	return sock
}
