package environment

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// testPlugin builds the test plugin (plugincheck/testplugin) as dir/name, mode 0755, and returns
// its sha256.
func testPlugin(t *testing.T, dir, name string) string { return testPluginB(t, dir, name) }

// testPluginB is testPlugin for tests and benchmarks.
func testPluginB(t testing.TB, dir, name string) string {
	t.Helper()
	out := filepath.Join(dir, name)
	if b, err := exec.Command("go", "build", "-o", out, "./plugincheck/testplugin").CombinedOutput(); err != nil {
		t.Fatalf("build the test plugin: %v\n%s", err, b)
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

// pluginDir is a fresh 0755 directory below /var/tmp: plugins run as the plugin user, which must
// reach their executable and state.
func pluginDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("/var/tmp", "berth-plugin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// pluginWorld is a plugin dir with one test plugin, a host and a driver for it.
type pluginWorld struct {
	dir, state string
	host       *PluginHost
	cfg        Config
	runAs      *PluginIdentity
}

func newPluginWorld(t *testing.T, name string) *pluginWorld {
	t.Helper()
	w := &pluginWorld{dir: pluginDir(t), state: pluginDir(t)}
	sum := testPlugin(t, w.dir, name)
	var err error
	if w.runAs, err = PluginRunAs(context.Background()); err != nil {
		t.Fatal(err)
	}
	w.host = NewPluginHost(PluginHostOptions{Dir: w.dir, StateDir: w.state, RunAs: w.runAs})
	t.Cleanup(func() { w.host.Close() })
	w.cfg = Config{Driver: DriverPlugin, Plugin: PluginConfig{Name: name, SHA256: sum, Settings: []byte("{}"), TimeoutS: 60}}
	return w
}

func (w *pluginWorld) driver(t *testing.T) Driver {
	t.Helper()
	d, err := New(w.cfg, Options{Plugins: w.host, Grace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// starts lists the uids the plugin's processes ran as, one per start.
func (w *pluginWorld) starts(t *testing.T) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(w.state, w.cfg.Plugin.Name, "started-*"))
	var uids []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		uids = append(uids, string(b))
	}
	return uids
}

func TestPluginPinnedBySHA256(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newPluginWorld(t, "pinned")
	good := w.cfg
	w.cfg.Plugin.SHA256 = strings.Repeat("ab", 32)
	_, err := w.driver(t).Probe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r, _ := w.driver(t).Probe(ctx)
	if r.OK || !strings.Contains(r.Summary, "plugin_digest_mismatch") {
		t.Fatalf("a plugin with another digest was not refused: %+v", r)
	}
	if _, err := w.host.Info(ctx, w.cfg.Plugin); !errors.Is(err, ErrPluginDigest) {
		t.Fatalf("Info of a mismatched plugin: %v, want ErrPluginDigest", err)
	}
	if n := len(w.starts(t)); n != 0 {
		t.Fatalf("the mismatched plugin ran %d times", n)
	}
	// Negative control: the right digest runs it, as its own user.
	w.cfg = good
	if r, err := w.driver(t).Probe(ctx); err != nil || !r.OK {
		t.Fatalf("the pinned plugin: %+v %v", r, err)
	}
	uids := w.starts(t)
	if len(uids) != 1 {
		t.Fatalf("started %d times, want once", len(uids))
	}
	want := itoa(os.Getuid())
	if w.runAs != nil {
		want = itoa(w.runAs.UID)
		if want == "0" {
			t.Fatal("the plugin identity is root")
		}
	}
	if uids[0] != want {
		t.Fatalf("the plugin ran as uid %s, want %s", uids[0], want)
	}
}

func TestPluginFileOthersCanWriteIsRefused(t *testing.T) {
	t.Parallel()
	w := newPluginWorld(t, "writable")
	if err := os.Chmod(filepath.Join(w.dir, "writable"), 0o777); err != nil {
		t.Fatal(err)
	}
	_, err := w.host.Info(context.Background(), w.cfg.Plugin)
	if !errors.Is(err, ErrDriverUnavailable) || !strings.Contains(err.Error(), "writable by nobody else") {
		t.Fatalf("a world-writable plugin: %v", err)
	}
	if n := len(w.starts(t)); n != 0 {
		t.Fatalf("it ran %d times", n)
	}
}

func TestPluginCrashFailsTheCallAndRestarts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newPluginWorld(t, "tp-crash")
	d := w.driver(t)
	inst, err := d.Acquire(ctx, AcquireRequest{Key: "lease-1:1", Tag: "run-1"})
	if err != nil {
		t.Fatal(err)
	}
	ws := workDir(t)
	if err := os.WriteFile(filepath.Join(ws, "a.txt"), []byte("a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	real, err := d.Realize(ctx, RealizeRequest{Instance: inst, WorkspaceRef: "ws-1", HostPath: ws})
	if err != nil {
		t.Fatal(err)
	}
	res, err := d.Exec(ctx, ExecRequest{Command: "echo hi", Dir: real.Root, Tag: "run-1"})
	if !errors.Is(err, ErrDriverUnavailable) || !strings.Contains(err.Error(), "driver_unavailable") {
		t.Fatalf("exec on a crashing plugin: %v, want driver_unavailable", err)
	}
	if res.Started.IsZero() {
		t.Fatal("the command had started; the result must say so (the run is settled as started)")
	}
	// The next call starts the plugin again.
	if r, err := d.Probe(ctx); err != nil || !r.OK {
		t.Fatalf("probe after the crash: %+v %v", r, err)
	}
	if err := d.Release(ctx, inst); err != nil {
		t.Fatalf("release after the crash: %v", err)
	}
	if n := len(w.starts(t)); n != 2 {
		t.Fatalf("started %d times, want 2 (once, and once after the crash)", n)
	}
}

func TestPluginSyncRefusesALyingCapsule(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		refused bool
	}{{"tp-liar", true}, {"tp-honest", false}} {
		w := newPluginWorld(t, tc.name)
		d := w.driver(t)
		inst, err := d.Acquire(ctx, AcquireRequest{Key: "lease-2:1", Tag: "run-2"})
		if err != nil {
			t.Fatal(err)
		}
		ws := workDir(t)
		if err := os.WriteFile(filepath.Join(ws, "a.txt"), []byte("original\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		real, err := d.Realize(ctx, RealizeRequest{Instance: inst, WorkspaceRef: "ws-2", HostPath: ws})
		if err != nil {
			t.Fatal(err)
		}
		if res, err := d.Exec(ctx, ExecRequest{Command: "echo changed > a.txt", Dir: real.Root, Tag: "run-2"}); err != nil || res.ExitCode != 0 {
			t.Fatalf("exec: %+v %v", res, err)
		}
		err = d.Sync(ctx, SyncRequest{Instance: inst, Root: real.Root, HostPath: ws})
		b, _ := os.ReadFile(filepath.Join(ws, "a.txt"))
		if tc.refused {
			if !errors.Is(err, ErrCapsuleMismatch) || string(b) != "original\n" {
				t.Fatalf("%s: sync %v, a.txt %q: a lying capsule must be refused and nothing applied", tc.name, err, b)
			}
		} else if err != nil || string(b) != "changed\n" {
			t.Fatalf("%s: sync %v, a.txt %q", tc.name, err, b)
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
