package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"berth/environment"
	"berth/environment/plugincheck"
)

// podmanService starts a rootful podman API service on a socket in a fresh directory, readable
// by the plugin user's group, and returns the socket path. Hosts whose cgroups are in hybrid mode
// (cgroup v1 with a v2 hierarchy that has controllers) need runc: Debian's crun 1.8 refuses them.
func podmanService(t *testing.T, runAs *environment.PluginIdentity) string {
	t.Helper()
	if _, err := exec.LookPath("podman"); err != nil {
		t.Fatal("podman is not installed: run scripts/test-deps.sh")
	}
	dir, err := os.MkdirTemp("/var/tmp", "berth-podman-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "podman.sock")
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
			t.Fatal("the podman service did not make its socket within a minute")
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

// buildPlugin builds this plugin, static, into a directory the plugin user can reach.
func buildPlugin(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "berth-podman-plugin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "berth-driver-podman")
	build := exec.Command("go", "build", "-o", out, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, b)
	}
	return out
}

// TestContractOnPodman runs `berth plugin test`'s suite against this plugin on real rootful
// podman: containers from an image layer, commands through podman exec, capsules in and out.
func TestContractOnPodman(t *testing.T) {
	t.Parallel()
	runAs, err := environment.PluginRunAs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sock := podmanService(t, runAs)
	settings, _ := json.Marshal(map[string]any{"socket": sock})
	var out strings.Builder
	rep, err := plugincheck.Run(context.Background(), plugincheck.Options{Path: buildPlugin(t), Settings: settings, RunAs: runAs, Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || len(rep.Steps) != 12 {
		t.Fatalf("the podman plugin breaks the contract:\n%s", out.String())
	}
	fmt.Fprint(os.Stderr, out.String())
}
