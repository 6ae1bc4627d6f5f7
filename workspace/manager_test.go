package workspace

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestValidRef(t *testing.T) {
	t.Parallel()
	good := newRef()
	if !ValidRef(good) {
		t.Fatalf("fresh ref %q not valid", good)
	}
	for _, s := range []string{"", "ws-", "ws-0123", "ws-0123456789abcdef0123456789ABCDEF", "xx-0123456789abcdef0123456789abcdef",
		"ws-0123456789abcdef0123456789abcde/", "ws-../../../../etc/passwd0000000", "ws-0123456789abcdef0123456789abcdef0"} {
		if ValidRef(s) {
			t.Errorf("ValidRef(%q) = true", s)
		}
	}
	if r1, r2 := newRef(), newRef(); r1 == r2 {
		t.Fatal("two fresh refs are equal")
	}
}

func TestManagerBaseIsPrivate(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	if err := os.MkdirAll(filepath.Join(data, "workspaces"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(data, "workspaces"), 0o777); err != nil {
		t.Fatal(err)
	}
	m, err := NewManager(data, Options{})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(m.Base())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Fatalf("base mode %o, want 0700", fi.Mode().Perm())
	}
	if _, err := NewManager("relative/dir", Options{}); !errors.Is(err, ErrUnsafePath) {
		t.Fatalf("relative data dir: %v", err)
	}
}

func TestDestroyOnlyOwnedRoots(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	src := t.TempDir()
	writeFiles(t, src, map[string]string{"a.txt": "a"})

	res, err := m.RealizeCopy(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	// A directory made by hand under the base, even with a valid-looking ref name, is never adopted.
	foreign := newRef()
	if err := os.Mkdir(filepath.Join(m.Base(), foreign), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.Destroy(ctx, foreign); !errors.Is(err, ErrNotManaged) {
		t.Fatalf("destroy foreign dir: %v", err)
	}
	if _, err := os.Stat(filepath.Join(m.Base(), foreign)); err != nil {
		t.Fatalf("foreign dir was touched: %v", err)
	}
	if err := m.Destroy(ctx, "../../etc"); !errors.Is(err, ErrBadRef) {
		t.Fatalf("destroy bad ref: %v", err)
	}
	un, err := m.Unmanaged(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(un, []string{foreign}) {
		t.Fatalf("Unmanaged = %v, want [%s]", un, foreign)
	}
	list, err := m.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Ref != res.Ref || list[0].Missing {
		t.Fatalf("List = %+v", list)
	}

	// A live holder blocks Destroy; releasing (twice, idempotently) unblocks it.
	release, err := m.Acquire(res.Ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Destroy(ctx, res.Ref); !errors.Is(err, ErrBusy) {
		t.Fatalf("destroy held root: %v", err)
	}
	release()
	release()
	if err := m.Destroy(ctx, res.Ref); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	if _, err := os.Stat(filepath.Join(m.Base(), res.Ref)); !os.IsNotExist(err) {
		t.Fatalf("root still there: %v", err)
	}
	if _, err := m.Acquire(res.Ref); !errors.Is(err, ErrNotManaged) {
		t.Fatalf("acquire destroyed: %v", err)
	}
}

func TestDestroyRefusesReplacedRoot(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	src := t.TempDir()
	writeFiles(t, src, map[string]string{"a.txt": "a"})
	res, err := m.RealizeCopy(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(m.Base(), res.Ref)
	// Swap the managed root for a symlink to a directory Berth must never delete.
	victim := t.TempDir()
	writeFiles(t, victim, map[string]string{"keep.txt": "keep"})
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, root); err != nil {
		t.Fatal(err)
	}
	if err := m.Destroy(ctx, res.Ref); !errors.Is(err, ErrNotManaged) {
		t.Fatalf("destroy replaced root: %v", err)
	}
	if mustRead(t, filepath.Join(victim, "keep.txt")) != "keep" {
		t.Fatal("victim changed")
	}
	// Same with a directory recreated under the same name (new inode).
	os.Remove(root)
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.Destroy(ctx, res.Ref); !errors.Is(err, ErrNotManaged) {
		t.Fatalf("destroy recreated root: %v", err)
	}
	list, _ := m.List(ctx)
	if len(list) != 1 || !list[0].Missing {
		t.Fatalf("List = %+v, want the ref marked missing", list)
	}
	// Once the foreign directory is gone, Destroy finishes the bookkeeping (a retried close).
	mustDo(t, os.Remove(root))
	if err := m.Destroy(ctx, res.Ref); err != nil {
		t.Fatalf("destroy with the directory gone: %v", err)
	}
	if list, _ := m.List(ctx); len(list) != 0 {
		t.Fatalf("List = %+v after cleanup", list)
	}
}

func TestSharedIsNeverDestroyed(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	proj := t.TempDir()
	writeFiles(t, proj, map[string]string{"main.go": "package main"})
	res, err := m.RealizeShared(ctx, proj)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Shared || res.Strategy != StrategyShared || res.Cwd != "" {
		t.Fatalf("result %+v", res)
	}
	root, err := m.Root(res.Ref)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := filepath.EvalSymlinks(proj); root != want {
		t.Fatalf("Root = %q, want %q", root, want)
	}
	if err := m.Destroy(ctx, res.Ref); !errors.Is(err, ErrNotManaged) {
		t.Fatalf("destroy shared: %v", err)
	}
	if mustRead(t, filepath.Join(proj, "main.go")) != "package main" {
		t.Fatal("project changed")
	}
	if _, err := m.RealizeShared(ctx, m.Base()); !errors.Is(err, ErrUnsafePath) {
		t.Fatalf("sharing the base: %v", err)
	}
	if err := m.Forget(res.Ref); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(proj); err != nil {
		t.Fatal("Forget removed the project")
	}
}

// TestAcquireDestroyRace runs holders against Destroy: whoever wins, a successful Acquire always
// names a root that still exists until it is released.
func TestAcquireDestroyRace(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	src := t.TempDir()
	writeFiles(t, src, map[string]string{"a": "a"})
	for range 20 {
		res, err := m.RealizeCopy(ctx, src)
		mustDo(t, err)
		root := filepath.Join(m.Base(), res.Ref)
		done := make(chan error, 1)
		go func() { done <- m.Destroy(ctx, res.Ref) }()
		for {
			release, err := m.Acquire(res.Ref)
			if err != nil {
				if !errors.Is(err, ErrNotManaged) && !errors.Is(err, ErrBusy) {
					t.Fatalf("acquire: %v", err)
				}
				if errors.Is(err, ErrNotManaged) {
					break
				}
				continue
			}
			if _, err := os.Stat(root); err != nil {
				t.Fatalf("acquired a root that is gone: %v", err)
			}
			release()
			break
		}
		if err := <-done; err != nil && !errors.Is(err, ErrBusy) {
			t.Fatalf("destroy: %v", err)
		}
	}
}
