package environment

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"berth/environment/jail"
	"berth/environment/jail/jailtest"
)

// serviceFixture is a data dir with one workspace below it and the local jail placement of a
// service there (the data dir masked, the workspace re-exposed at its real path).
type serviceFixture struct {
	data, root string
	pl         Placement
	sup        *Supervisor
}

func newServiceFixture(t testing.TB) serviceFixture {
	t.Helper()
	data := jailtest.Dir(t)
	root := filepath.Join(data, "workspaces", "ws-1")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Driver: DriverLocal}
	h := testJail
	pl, err := ServicePlacement(cfg, Options{Jail: &h, DataDir: data, Masks: []string{data}, Path: "/usr/local/bin:/usr/bin:/bin"},
		filepath.Join(data, "home", "ws-1"))
	if err != nil {
		t.Fatal(err)
	}
	return serviceFixture{data: data, root: root, pl: pl, sup: &Supervisor{Grace: time.Second}}
}

func (f serviceFixture) spec(t testing.TB, id, command string, timeout time.Duration) ServiceSpec {
	t.Helper()
	port, err := ReservePort(0, func(int) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	return ServiceSpec{ID: id, WorkspaceID: "ws-1", Command: command, Root: f.root, Port: port, HealthPath: "/",
		ReadyTimeout: timeout, LogPath: filepath.Join(f.data, id+".log"), Placement: f.pl}
}

func serviceGone(t *testing.T, id string, port int) {
	t.Helper()
	m, err := TaggedServices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(m[id]) > 0 {
		t.Fatalf("service %s still has processes %v", id, m[id])
	}
	if !PortFree(port) {
		t.Fatalf("port %d still in use", port)
	}
}

// TestServiceHealthyServesWorkspace: a python http.server in the local jail becomes healthy,
// serves the workspace's files, carries its variables, and stops with nothing left.
func TestServiceHealthyServesWorkspace(t *testing.T) {
	t.Parallel()
	f := newServiceFixture(t)
	if err := os.WriteFile(filepath.Join(f.root, "index.html"), []byte("hello from the workspace"), 0o644); err != nil {
		t.Fatal(err)
	}
	id := "svc-healthy-" + strconv.Itoa(os.Getpid())
	sp := f.spec(t, id, `env | grep ^BERTH_ > berth-env.txt; echo "home=$HOME" >> berth-env.txt; exec /usr/bin/python3 -m http.server "$PORT" --bind 127.0.0.1`, 15*time.Second)
	ctx := context.Background()
	p, err := f.sup.Start(ctx, sp)
	if err != nil {
		b, _ := os.ReadFile(sp.LogPath)
		t.Fatalf("start: %v\n%s", err, b)
	}
	if p.PID <= 0 || p.StartTime == 0 || !ServiceAlive(id, p.PID, p.StartTime) {
		t.Fatalf("process not recorded: %+v", p)
	}
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(sp.Port) + "/index.html")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "hello from the workspace" {
		t.Fatalf("body = %q", body)
	}
	env, _ := os.ReadFile(filepath.Join(f.root, "berth-env.txt"))
	for _, want := range []string{ServiceVar + "=" + id, WorkspaceVar + "=ws-1", PreviewBaseVar + "=/\n",
		"home=" + filepath.Join(f.data, "home", "ws-1")} {
		if !strings.Contains(string(env), want) {
			t.Errorf("service env lacks %s:\n%s", want, env)
		}
	}
	if fi, err := os.Stat(sp.LogPath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("log file: %v %v", fi, err)
	}
	if err := f.sup.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	serviceGone(t, id, sp.Port)
}

// TestServiceExitFails: a command that exits 1 fails the start with its exit code and its log.
func TestServiceExitFails(t *testing.T) {
	t.Parallel()
	f := newServiceFixture(t)
	id := "svc-exit-" + strconv.Itoa(os.Getpid())
	sp := f.spec(t, id, `echo "cannot find vite.config"; exit 1`, 10*time.Second)
	p, err := f.sup.Start(context.Background(), sp)
	if !errors.Is(err, ErrServiceExited) {
		t.Fatalf("err = %v, want ErrServiceExited", err)
	}
	if p == nil || p.ExitCode() != 1 {
		t.Fatalf("exit code = %v", p)
	}
	excerpt, _ := LogTail(sp.LogPath, 4096)
	if !strings.Contains(excerpt, "cannot find vite.config") {
		t.Fatalf("log excerpt = %q", excerpt)
	}
	serviceGone(t, id, sp.Port)
}

// TestServiceNeverHealthyFails: a server that accepts connections but never answers fails after
// its ready timeout, and nothing of it is left.
func TestServiceNeverHealthyFails(t *testing.T) {
	t.Parallel()
	f := newServiceFixture(t)
	id := "svc-mute-" + strconv.Itoa(os.Getpid())
	sp := f.spec(t, id, `exec /usr/bin/python3 -c 'import os,socket,time
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(os.environ["PORT"]))); s.listen(64)
time.sleep(600)'`, 2*time.Second)
	start := time.Now()
	_, err := f.sup.Start(context.Background(), sp)
	if !errors.Is(err, ErrServiceNotReady) {
		t.Fatalf("err = %v, want ErrServiceNotReady", err)
	}
	if d := time.Since(start); d < 2*time.Second || d > 12*time.Second {
		t.Fatalf("failed after %s, want about the 2 s timeout", d)
	}
	serviceGone(t, id, sp.Port)
}

// TestServiceStopTrapsTermAndGrandchild: a server that ignores SIGTERM and leaves a detached
// grandchild behind is still gone as a whole after stop, its port free.
func TestServiceStopTrapsTermAndGrandchild(t *testing.T) {
	t.Parallel()
	f := newServiceFixture(t)
	id := "svc-stubborn-" + strconv.Itoa(os.Getpid())
	sp := f.spec(t, id, `trap '' TERM; setsid sleep 600 & (sleep 700 &); /usr/bin/python3 -m http.server "$PORT" --bind 127.0.0.1; wait`, 15*time.Second)
	ctx := context.Background()
	if _, err := f.sup.Start(ctx, sp); err != nil {
		t.Fatal(err)
	}
	m, _ := TaggedServices(ctx)
	if len(m[id]) < 4 {
		t.Fatalf("want the jail, the shell, python and the sleeps tagged; got %v", m[id])
	}
	start := time.Now()
	if err := f.sup.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 900*time.Millisecond {
		t.Fatalf("stop took %s: the grace was not given", d)
	}
	serviceGone(t, id, sp.Port)
}

// TestServiceStopGivesGrace: SIGTERM reaches the server itself (not only the jail), so a server
// that cleans up on TERM gets to.
func TestServiceStopGivesGrace(t *testing.T) {
	t.Parallel()
	f := newServiceFixture(t)
	id := "svc-grace-" + strconv.Itoa(os.Getpid())
	sp := f.spec(t, id, `trap 'echo cleaned > cleaned.txt; exit 0' TERM; /usr/bin/python3 -m http.server "$PORT" --bind 127.0.0.1 & wait`, 15*time.Second)
	ctx := context.Background()
	if _, err := f.sup.Start(ctx, sp); err != nil {
		t.Fatal(err)
	}
	if err := f.sup.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(f.root, "cleaned.txt")); err != nil || string(b) != "cleaned\n" {
		t.Fatalf("the TERM trap did not run: %q %v", b, err)
	}
	serviceGone(t, id, sp.Port)
}

// TestServicePlacementRefusals: ssh and a sandbox without network cannot host previews.
func TestServicePlacementRefusals(t *testing.T) {
	t.Parallel()
	h := jail.Host{Bwrap: "/usr/bin/bwrap"}
	for _, cfg := range []Config{{Driver: DriverSSH}, {Driver: DriverSandbox}} {
		if _, err := ServicePlacement(cfg, Options{Jail: &h, ImageDir: "/nonexistent"}, ""); !errors.Is(err, ErrServicesUnsupported) {
			t.Errorf("%s: err = %v", cfg.Driver, err)
		}
	}
}
