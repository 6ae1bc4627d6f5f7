package environment

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestNew(t *testing.T) {
	t.Parallel()
	d, err := New(Config{Driver: DriverLocal}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if l, ok := d.(*local); !ok || l.grace != DefaultGrace {
		t.Fatalf("New(local) = %#v, want the local driver with the default grace", d)
	}
	if d, err := New(Config{Driver: DriverSandbox}, Options{ImageDir: "/var/lib/berth/images/e/1"}); err != nil {
		t.Fatal(err)
	} else if _, ok := d.(*sandbox); !ok {
		t.Fatalf("New(sandbox) = %#v", d)
	}
	for _, driver := range []string{"docker", ""} {
		if d, err := New(Config{Driver: driver}, Options{}); !errors.Is(err, ErrDriverUnavailable) || d != nil {
			t.Errorf("New(%q) = %v, %v; want ErrDriverUnavailable", driver, d, err)
		}
	}
	if got := absolutePath("/usr/bin::.:bin:/bin"); got != "/usr/bin:/bin" {
		t.Errorf("absolutePath kept %q", got)
	}
	bad := []struct {
		name string
		cfg  Config
		opts Options
	}{
		{"secret without its value", Config{Driver: DriverLocal, Env: []EnvVar{{Name: "TOKEN", Secret: true}}}, Options{}},
		{"reserved variable", Config{Driver: DriverLocal, Env: []EnvVar{{Name: "DATABASE_URL", Value: "x"}}}, Options{}},
		{"relative home", Config{Driver: DriverLocal}, Options{Home: "home"}},
		{"sandbox without an image layer", Config{Driver: DriverSandbox}, Options{}},
		{"ssh without a host", Config{Driver: DriverSSH}, Options{}},
	}
	for _, c := range bad {
		if _, err := New(c.cfg, c.opts); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%s: New = %v, want ErrInvalidRequest", c.name, err)
		}
	}
}

func TestLocalLifecycle(t *testing.T) {
	t.Parallel()
	d, err := New(Config{Driver: DriverLocal}, Options{NodeID: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	inst, err := d.Acquire(ctx, AcquireRequest{Key: "lease-1", Tag: "run-1"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := d.Acquire(ctx, AcquireRequest{Key: "lease-1", Tag: "run-1"})
	if err != nil || again != inst || inst != (Instance{Driver: DriverLocal, Ref: "local:node-a"}) {
		t.Fatalf("Acquire = %+v then %+v, %v", inst, again, err)
	}

	root := t.TempDir()
	real, err := d.Realize(ctx, RealizeRequest{Instance: inst, WorkspaceRef: "ws-1", HostPath: root})
	if err != nil || real.Root != root {
		t.Fatalf("Realize = %+v, %v; want the host path itself", real, err)
	}
	file := filepath.Join(root, "file")
	link := filepath.Join(t.TempDir(), "link")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(root, link); err != nil {
		t.Fatal(err)
	}
	otherNode := Instance{Driver: DriverLocal, Ref: "local:node-b"}
	for name, req := range map[string]RealizeRequest{
		"relative path":  {Instance: inst, HostPath: "ws"},
		"unclean path":   {Instance: inst, HostPath: root + "/../" + filepath.Base(root)},
		"missing path":   {Instance: inst, HostPath: filepath.Join(root, "missing")},
		"a file":         {Instance: inst, HostPath: file},
		"a symlink":      {Instance: inst, HostPath: link},
		"another node":   {Instance: otherNode, HostPath: root},
		"another driver": {Instance: Instance{Driver: DriverSSH, Ref: inst.Ref}, HostPath: root},
	} {
		if _, err := d.Realize(ctx, req); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("Realize with %s: %v, want ErrInvalidRequest", name, err)
		}
	}

	if err := d.Sync(ctx, SyncRequest{Instance: inst, Root: root, HostPath: root}); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(ctx, SyncRequest{Instance: otherNode, Root: root, HostPath: root}); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("Sync on another node's instance: %v", err)
	}
	for range 2 { // idempotent
		if err := d.Release(ctx, inst); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Release(ctx, otherNode); err != nil {
		t.Fatalf("Release of a vanished node's instance: %v", err)
	}
	if err := d.Release(ctx, Instance{Driver: DriverSandbox, Ref: "x"}); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("Release of a sandbox instance: %v", err)
	}
}
