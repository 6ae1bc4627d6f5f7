package workspace

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeRoot is a root with a file, a .git directory, a bare-repository-like directory, a symlink
// out, a hard-linked file and a FIFO.
func writeRoot(t *testing.T) (*Files, string) {
	t.Helper()
	base := t.TempDir()
	dir := filepath.Join(base, "root")
	for p, body := range map[string]string{"a.txt": "one two two\n", ".git/HEAD": "ref: x\n", "sub/b.txt": "b\n",
		"repo/HEAD": "ref: x\n", "repo/config": "", "outside.txt": ""} {
		if p == "outside.txt" {
			p = "../outside.txt"
		}
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"repo/objects", "repo/refs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../outside.txt", filepath.Join(dir, "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/tmp", filepath.Join(dir, "tmpdir")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, "sub/b.txt"), filepath.Join(dir, "hard.txt")); err != nil {
		t.Fatal(err)
	}
	f, err := NewFiles(FileLimits{}, FileRoot{Name: "w", Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return f, dir
}

// TestFilesWriteRefusals: a write never leaves the root, never touches .git or a git directory,
// never replaces a symlink, hard link or directory, and changes nothing when refused.
func TestFilesWriteRefusals(t *testing.T) {
	t.Parallel()
	f, dir := writeRoot(t)
	ctx := context.Background()
	for _, c := range []struct {
		path string
		dirs bool
		want error
	}{
		{"", false, ErrBadPath},
		{"/etc/passwd", false, ErrBadPath},
		{"dir/", false, ErrBadPath},
		{"..", false, ErrBadPath},
		{"../outside.txt", false, ErrEscape},
		{"sub/../../outside.txt", false, ErrEscape},
		{"tmpdir/x.txt", false, ErrEscape},
		{"out", false, ErrNotRegular},
		{".git/config", false, ErrDenied},
		{"x/.git/config", true, ErrDenied},
		{"repo/config", false, ErrDenied},
		{".env", false, ErrDenied},
		{"hard.txt", false, ErrHardLink},
		{"sub", false, ErrNotRegular},
		{"missing/x.txt", false, ErrNotFound},
		{".berth-write-1234", false, ErrDenied},
	} {
		before, _ := os.ReadFile(filepath.Join(filepath.Dir(dir), "outside.txt"))
		_, err := f.Write(ctx, "w", c.path, []byte("pwned"), WriteOptions{CreateDirs: c.dirs})
		if !errors.Is(err, c.want) {
			t.Errorf("Write(%q) = %v, want %v", c.path, err, c.want)
		}
		if after, _ := os.ReadFile(filepath.Join(filepath.Dir(dir), "outside.txt")); string(after) != string(before) {
			t.Fatalf("Write(%q) changed a file outside the root", c.path)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "x")); err == nil {
		t.Fatal("a refused write left a directory behind")
	}
	if _, err := f.Write(ctx, "w", "big", make([]byte, MaxWriteBytes+1), WriteOptions{}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversize write = %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, ".git/HEAD")); string(b) != "ref: x\n" {
		t.Fatal(".git changed")
	}
}

// TestFilesWriteEditDelete: create with parents, replace keeping the mode, edit with an exact
// match count, delete; ranges of a read.
func TestFilesWriteEditDelete(t *testing.T) {
	t.Parallel()
	f, dir := writeRoot(t)
	ctx := context.Background()
	w, err := f.Write(ctx, "w", "new/deep/c.txt", []byte("hello\n"), WriteOptions{CreateDirs: true})
	if err != nil || !w.Created || w.Size != 6 || w.Path != "new/deep/c.txt" || len(w.SHA256) != 64 {
		t.Fatalf("Write = %+v %v", w, err)
	}
	if err := os.Chmod(filepath.Join(dir, "a.txt"), 0o600); err != nil {
		t.Fatal(err)
	}
	if w, err := f.Write(ctx, "w", "a.txt", []byte("one two two\nthree\n"), WriteOptions{}); err != nil || w.Created {
		t.Fatalf("replace = %+v %v", w, err)
	}
	if st, _ := os.Stat(filepath.Join(dir, "a.txt")); st.Mode().Perm() != 0o600 {
		t.Fatalf("replaced file mode = %v", st.Mode())
	}
	var mc *MatchCountError
	if _, err := f.Edit(ctx, "w", "a.txt", "two", "2", 1); !errors.As(err, &mc) || mc.Matches != 2 {
		t.Fatalf("ambiguous edit = %v", err)
	}
	if _, err := f.Edit(ctx, "w", "a.txt", "four", "4", 1); !errors.As(err, &mc) || mc.Matches != 0 {
		t.Fatalf("no-match edit = %v", err)
	}
	if w, err := f.Edit(ctx, "w", "a.txt", "two", "2", 2); err != nil || w.Replacements != 2 {
		t.Fatalf("edit = %+v %v", w, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "a.txt")); string(b) != "one 2 2\nthree\n" {
		t.Fatalf("edited = %q", b)
	}
	if _, err := f.Edit(ctx, "w", "out", "x", "y", 1); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("edit through a symlink = %v", err)
	}
	rc, err := f.ReadRange(ctx, "w", "a.txt", Range{StartLine: 2, EndLine: 2})
	if err != nil || rc.Content.Content != "three\n" || rc.Offset != 8 || rc.EndLine != 2 || rc.Truncated {
		t.Fatalf("line range = %+v %v", rc, err)
	}
	rc, err = f.ReadRange(ctx, "w", "a.txt", Range{Offset: 4, Length: 3})
	if err != nil || rc.Content.Content != "2 2" || !rc.Truncated {
		t.Fatalf("byte range = %+v %v", rc, err)
	}
	if _, err := f.ReadRange(ctx, "w", "a.txt", Range{StartLine: 3, EndLine: 2}); !errors.Is(err, ErrBadPath) {
		t.Fatalf("reversed range = %v", err)
	}
	if _, err := f.Delete(ctx, "w", "tmpdir"); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("delete of a symlink = %v", err)
	}
	if _, err := f.Delete(ctx, "w", "sub"); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("delete of a directory = %v", err)
	}
	if w, err := f.Delete(ctx, "w", "new/deep/c.txt"); err != nil || !w.Deleted {
		t.Fatalf("delete = %+v %v", w, err)
	}
	if _, err := f.Delete(ctx, "w", "new/deep/c.txt"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete = %v", err)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "new/deep"))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tempPrefix) {
			t.Fatalf("a temporary file was left: %s", e.Name())
		}
	}
}
