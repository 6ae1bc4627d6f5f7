package workspace

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// specialTree builds a directory holding one of every kind of entry the copy rule must skip.
func specialTree(t *testing.T) (dir, outside string) {
	t.Helper()
	dir = t.TempDir()
	outside = t.TempDir()
	writeFiles(t, outside, map[string]string{"secret.txt": "OUTSIDE"})
	writeFiles(t, dir, map[string]string{
		"plain.txt": "plain", "sub/deep.txt": "deep", ".git/config": "[core]",
		"hard.txt": "hard", "back\\slash": "odd name",
	})
	mustDo(t, os.WriteFile(filepath.Join(dir, "run.sh"), []byte("#!/bin/sh\n"), 0o755))
	mustDo(t, os.WriteFile(filepath.Join(dir, "suid"), []byte("x"), 0o644))
	mustDo(t, os.Chmod(filepath.Join(dir, "suid"), 0o4755|os.ModeSetuid|os.ModeSetgid))
	mustDo(t, os.Mkdir(filepath.Join(dir, "sticky"), 0o755))
	mustDo(t, os.Chmod(filepath.Join(dir, "sticky"), 0o1777|os.ModeSticky))
	mustDo(t, os.Symlink(outside, filepath.Join(dir, "link-out")))
	mustDo(t, os.Symlink("plain.txt", filepath.Join(dir, "link-in")))
	mustDo(t, os.Link(filepath.Join(dir, "hard.txt"), filepath.Join(outside, "hard-twin")))
	mustDo(t, unix.Mkfifo(filepath.Join(dir, "fifo"), 0o644))
	l, err := net.Listen("unix", filepath.Join(dir, "sock"))
	mustDo(t, err)
	t.Cleanup(func() { l.Close() })
	if err := unix.Mknod(filepath.Join(dir, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Logf("mknod unavailable (%v); device case not covered here", err)
	}
	return dir, outside
}

func mustDo(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestCopySkipRules(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	src, _ := specialTree(t)
	res, err := m.RealizeCopy(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, s := range res.Skipped {
		got[s.Path] = s.Reason
	}
	want := map[string]string{
		".git": SkipGit, "link-out": SkipSymlink, "link-in": SkipSymlink, "hard.txt": SkipHardLink,
		"fifo": SkipFIFO, "sock": SkipSocket, "back\\slash": SkipName,
	}
	if _, err := os.Lstat(filepath.Join(src, "null")); err == nil {
		want["null"] = SkipDevice
	}
	for p, r := range want {
		if got[p] != r {
			t.Errorf("skipped[%q] = %q, want %q", p, got[p], r)
		}
	}
	if len(got) != len(want) {
		t.Errorf("skipped %v, want exactly %v", got, want)
	}
	root := filepath.Join(m.Base(), res.Cwd)
	if mustRead(t, filepath.Join(root, "sub/deep.txt")) != "deep" {
		t.Fatal("nested file not copied")
	}
	for p, mode := range map[string]os.FileMode{"run.sh": 0o755, "plain.txt": 0o644, "suid": 0o755, "sticky": 0o777 | os.ModeDir} {
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != mode {
			t.Errorf("%s mode %v, want %v (setuid/setgid/sticky dropped)", p, fi.Mode(), mode)
		}
	}
	for _, p := range []string{".git", "link-out", "link-in", "fifo", "sock", "hard.txt", "null"} {
		if _, err := os.Lstat(filepath.Join(root, p)); !os.IsNotExist(err) {
			t.Errorf("%s was copied", p)
		}
	}
	// The recorded digest is the capsule digest of the copy and of the source.
	var buf bytes.Buffer
	c, err := Pack(ctx, root, &buf)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := Pack(ctx, src, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.TreeDigest != res.TreeDigest || cs.TreeDigest != res.TreeDigest {
		t.Fatalf("digests: copy %s, source %s, recorded %s", c.TreeDigest, cs.TreeDigest, res.TreeDigest)
	}
}

func TestCopyOverlapWithBase(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	// A project that holds Berth's data dir (like a repository with .berth/ inside) is copied
	// without the managed base; a source inside the base is refused.
	proj := t.TempDir()
	writeFiles(t, proj, map[string]string{"main.go": "package main"})
	m, err := NewManager(filepath.Join(proj, ".berth"), Options{})
	mustDo(t, err)
	first, err := m.RealizeCopy(ctx, proj)
	mustDo(t, err)
	second, err := m.RealizeCopy(ctx, proj)
	mustDo(t, err)
	root := filepath.Join(m.Base(), second.Cwd)
	if _, err := os.Stat(filepath.Join(root, ".berth", "workspaces", first.Ref)); !os.IsNotExist(err) {
		t.Fatalf("the copy contains the managed base: %v", err)
	}
	found := false
	for _, s := range second.Skipped {
		found = found || (s.Path == ".berth" && s.Reason == SkipBerth)
	}
	if !found || mustRead(t, filepath.Join(root, "main.go")) != "package main" {
		t.Fatalf("skipped %v", second.Skipped)
	}
	for _, src := range []string{"relative", m.Base(), filepath.Join(m.Base(), first.Ref)} {
		if _, err := m.RealizeCopy(ctx, src); !errors.Is(err, ErrUnsafePath) {
			t.Errorf("RealizeCopy(%q) = %v", src, err)
		}
	}
	if _, err := m.RealizeShared(ctx, proj); !errors.Is(err, ErrUnsafePath) {
		t.Errorf("sharing a directory that holds the base: %v", err)
	}
	if un, _ := m.Unmanaged(ctx); len(un) != 0 {
		t.Fatalf("left %v behind", un)
	}
}

// TestScanNeverFollowsSwappedDirectory swaps a scanned directory for a symlink to outside between
// scan and copy: the copy reports the file as changed instead of copying outside content.
func TestScanNeverFollowsSwappedDirectory(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	src, outside := t.TempDir(), t.TempDir()
	writeFiles(t, src, map[string]string{"d/f": "inside"})
	writeFiles(t, outside, map[string]string{"f": "OUTSIDE"})
	entries, _, err := scanTree(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	mustDo(t, os.Rename(filepath.Join(src, "d"), filepath.Join(src, "d.old")))
	mustDo(t, os.Symlink(outside, filepath.Join(src, "d")))
	r, err := os.OpenRoot(src)
	mustDo(t, err)
	defer r.Close()
	for _, e := range entries {
		if e.rel != "d/f" {
			continue
		}
		f, _, err := openScanned(r, e)
		if err == nil {
			f.Close()
			t.Fatal("opened a file through a swapped directory")
		}
	}
}
