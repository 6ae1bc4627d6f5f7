package environment

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestSyncName(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]string{
		"./": "", ".": "", "./a": "a", "a/b/": "a/b", "././a//b": "a/b", "a/./b": "a/b",
	} {
		if got, err := syncName(name); err != nil || got != want {
			t.Errorf("syncName(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	for _, name := range []string{"/etc/passwd", "../x", "a/../../x", "./../x", "a/..", "a\x00b"} {
		if _, err := syncName(name); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("syncName(%q) = %v, want ErrInvalidRequest", name, err)
		}
	}
	for _, c := range []struct {
		name, target string
		inside       bool
	}{
		{"a", "b", true}, {"d/a", "../b", true}, {"d/e/a", "../../b", true},
		{"a", "../b", false}, {"d/a", "../../b", false}, {"a", "/etc/passwd", false}, {"a", "", false},
	} {
		if got := linkInside(c.name, c.target); got != c.inside {
			t.Errorf("linkInside(%q, %q) = %v", c.name, c.target, got)
		}
	}
}

// TestApplyTreeRefuses: a stream from a hostile remote writes nothing outside the workspace and
// no device, and an unsafe name fails the sync.
func TestApplyTreeRefuses(t *testing.T) {
	t.Parallel()
	build := func(hdrs ...*tar.Header) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, h := range hdrs {
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			if h.Size > 0 {
				if _, err := tw.Write(bytes.Repeat([]byte("x"), int(h.Size))); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	file := func(name string) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: 1, Mode: 0o644}
	}
	for name, stream := range map[string][]byte{
		"climbing name":      build(file("../escaped")),
		"absolute name":      build(file("/tmp/escaped")),
		"dangling hard link": build(&tar.Header{Typeflag: tar.TypeLink, Name: "h", Linkname: "../../etc/passwd"}),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			parent := t.TempDir()
			ws := filepath.Join(parent, "ws")
			if err := os.Mkdir(ws, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := applyTree(t.Context(), bytes.NewReader(stream), ws); !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("applyTree = %v, want ErrInvalidRequest", err)
			}
			if entries, _ := os.ReadDir(parent); len(entries) != 1 {
				t.Fatalf("something was written next to the workspace: %v", entries)
			}
		})
	}

	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "dev"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	stream := build(file("./a"),
		&tar.Header{Typeflag: tar.TypeSymlink, Name: "./out", Linkname: "/etc/passwd"},
		&tar.Header{Typeflag: tar.TypeSymlink, Name: "./up", Linkname: "../x"},
		&tar.Header{Typeflag: tar.TypeChar, Name: "./dev", Devmajor: 1, Devminor: 3},
		&tar.Header{Typeflag: tar.TypeDir, Name: "./.git/"}, file("./.git/config"),
		&tar.Header{Typeflag: tar.TypeLink, Name: "./hard", Linkname: "./a"})
	if err := applyTree(t.Context(), bytes.NewReader(stream), ws); err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{"out", "up", ".git"} {
		if _, err := os.Lstat(filepath.Join(ws, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s was made: %v", gone, err)
		}
	}
	if got := readFile(t, filepath.Join(ws, "dev")); got != "kept" {
		t.Errorf("the file at the device's path = %q, want it kept", got)
	}
	if got := readFile(t, filepath.Join(ws, "hard")); got != "x" {
		t.Errorf("hard link copy = %q", got)
	}
}
