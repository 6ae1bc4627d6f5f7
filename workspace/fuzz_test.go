package workspace

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// fileErrors are the only errors the resolver may return for any input.
var fileErrors = []error{ErrBadPath, ErrEscape, ErrDenied, ErrNotFound, ErrNotRegular, ErrHardLink, ErrTooLarge}

func FuzzResolve(f *testing.F) {
	for _, s := range []string{
		"README.md", "docs/guide.md", "link-in/guide.md", "link-file", "../outside/secret.txt", "../../etc/passwd",
		"..%2f..%2fetc", "%252e%252e%252f", "/etc/passwd", "a/../../b", "x%00.png", "x\x00.png", "..\\..\\x",
		"．．／outside", "\u2024\u2024/x", "%c0%ae%c0%ae/x", strings.Repeat("a", 256), strings.Repeat("ab/", 1700),
		"link-etc/passwd", "link-out/secret.txt", "link-up/outside/secret.txt", "link-etc/", "link-out/", "link-abs-in/guide.md",
		".git/config", ".GIT/config", ".env", ".ssh/id_rsa", "sub/./.git/config", "link-env", "link-git/config",
		"hard.txt", "fifo", "null", "sparse", "loop", "docs/../README.md", "~/x", "C:/x", "http://x/y", "", ".", "./",
		"docs/", "link-in/../link-in/../README.md", "big.txt",
	} {
		f.Add(s)
	}
	fx := newFileFixture(f)
	f.Fuzz(func(t *testing.T, p string) {
		ctx := context.Background()
		check := func(op string, err error) {
			if err == nil {
				return
			}
			known := false
			for _, e := range fileErrors {
				known = known || errors.Is(err, e)
			}
			if !known {
				t.Fatalf("%s(%q): unexpected error %v", op, p, err)
			}
			if strings.Contains(err.Error(), fx.base) {
				t.Fatalf("%s(%q): error leaks a host path: %v", op, p, err)
			}
		}
		c, err := fx.files.Read(ctx, "", p)
		check("Read", err)
		if err == nil {
			if strings.Contains(c.Content, outsideSecret) || strings.Contains(c.Content, "DENIED") {
				t.Fatalf("Read(%q) served forbidden content from %q", p, c.Path)
			}
			checkRelPath(t, p, c.Path)
		}
		pg, err := fx.files.List(ctx, "", p, "", 0)
		check("List", err)
		if err == nil {
			for _, e := range pg.Items {
				checkRelPath(t, p, e.Path)
			}
		}
	})
}

// checkRelPath asserts a returned path is clean, relative, inside the root and deny-free.
func checkRelPath(t *testing.T, req, p string) {
	t.Helper()
	if p == "" {
		return // the root itself
	}
	if strings.HasPrefix(p, "/") || path.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../") {
		t.Fatalf("request %q returned path %q", req, p)
	}
	for _, c := range strings.Split(p, "/") {
		if DeniedName(c) {
			t.Fatalf("request %q returned denied path %q", req, p)
		}
	}
}

func FuzzImport(f *testing.F) {
	add := func(data []byte, m Manifest) {
		mj, _ := json.Marshal(m)
		f.Add(data, mj)
	}
	ok := []tarEntry{dirEntry("d"), fileEntry("d/f", "content"), fileEntry("g", "gee")}
	okTar, okMan := buildTar(f, ok...), manifestOf(ok...)
	add(okTar, okMan)
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(okTar)
	zw.Close()
	add(z.Bytes(), okMan)
	add(append(append([]byte(nil), okTar...), "trailing"...), okMan)
	add(buildTar(f, fileEntry("../evil", "x")), manifestOf(fileEntry("evil", "x")))
	add(buildTar(f, fileEntry("/etc/x", "x")), manifestOf(fileEntry("etc", "x")))
	sym := tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "a", Linkname: "/etc", ModTime: epoch, Format: tar.FormatPAX}}
	add(buildTar(f, sym, fileEntry("a/passwd", "x")), manifestOf(dirEntry("a"), fileEntry("a/passwd", "x")))
	hl := tarEntry{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "h", Linkname: "../x", ModTime: epoch, Format: tar.FormatPAX}}
	add(buildTar(f, hl), manifestOf(fileEntry("h", "")))
	add(buildTar(f, fileEntry("A", "1"), fileEntry("a", "1")), manifestOf(fileEntry("A", "1"), fileEntry("a", "1")))
	add(buildTar(f, fileEntry("cafe\u0301", "1"), fileEntry("caf\u00e9", "1")), manifestOf(fileEntry("cafe\u0301", "1"), fileEntry("caf\u00e9", "1")))
	add(buildTar(f, fileEntry("a", "1"), fileEntry("a/b", "2")), manifestOf(fileEntry("a", "1"), fileEntry("a/b", "2")))
	add(okTar[:len(okTar)-1024], okMan)
	f.Fuzz(func(t *testing.T, data, manifestJSON []byte) {
		var m Manifest
		if json.Unmarshal(manifestJSON, &m) != nil {
			return
		}
		parent := t.TempDir()
		target := filepath.Join(parent, "t")
		err := Import(context.Background(), bytes.NewReader(data), m, target, Limits{MaxEntries: 200, MaxBytes: 1 << 20})
		left, _ := os.ReadDir(parent)
		if err != nil {
			if !errors.Is(err, ErrCapsule) && !errors.Is(err, ErrQuota) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			if len(left) != 0 {
				t.Fatalf("failed import left %v", left)
			}
			return
		}
		if len(left) != 1 {
			t.Fatalf("import left %v", left)
		}
		// What was written is exactly the manifest: same digest, nothing skipped, no links.
		c, err := Pack(context.Background(), target, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Skipped) != 0 || c.TreeDigest != m.Digest() {
			t.Fatalf("imported tree differs from manifest (skipped %v)", c.Skipped)
		}
	})
}
