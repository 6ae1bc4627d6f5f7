package workspace

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPackDeterministic(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	files := map[string]string{"b.txt": "bee", "a/x.txt": "ex", "a-b/y": "why", "é.txt": "accent", "empty": ""}
	one, two := t.TempDir(), t.TempDir()
	writeFiles(t, one, files)
	// The second tree is written in another order, with other times, owners and equivalent modes.
	for _, name := range []string{"empty", "é.txt", "a-b/y", "a/x.txt", "b.txt"} {
		writeFiles(t, two, map[string]string{name: files[name]})
	}
	mustDo(t, os.WriteFile(filepath.Join(one, "tool"), []byte("#!/bin/sh\n"), 0o700))
	mustDo(t, os.WriteFile(filepath.Join(two, "tool"), []byte("#!/bin/sh\n"), 0o755))
	mustDo(t, os.Chmod(filepath.Join(two, "b.txt"), 0o600))
	mustDo(t, os.Chmod(filepath.Join(two, "a"), 0o700))
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	for _, p := range []string{"b.txt", "a/x.txt", "a", "tool"} {
		mustDo(t, os.Chtimes(filepath.Join(two, p), old, old))
		mustDo(t, os.Lchown(filepath.Join(two, p), 1234, 5678))
	}
	var b1, b2 bytes.Buffer
	c1, err := Pack(ctx, one, &b1)
	mustDo(t, err)
	c2, err := Pack(ctx, two, &b2)
	mustDo(t, err)
	if !bytes.Equal(b1.Bytes(), b2.Bytes()) {
		t.Fatal("same tree, different tar bytes")
	}
	if c1.TreeDigest != c2.TreeDigest || !strings.HasPrefix(c1.TreeDigest, "sha256:") {
		t.Fatalf("digests %s %s", c1.TreeDigest, c2.TreeDigest)
	}
	var order []string
	tr := tar.NewReader(bytes.NewReader(b1.Bytes()))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		mustDo(t, err)
		order = append(order, h.Name)
		if !h.ModTime.Equal(epoch) || h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: header not normalized: %+v", h.Name, h)
		}
		if want := int64(0o644); h.Typeflag == tar.TypeDir || h.Name == "tool" {
			if h.Mode != 0o755 {
				t.Errorf("%s mode %o", h.Name, h.Mode)
			}
		} else if h.Mode != want {
			t.Errorf("%s mode %o", h.Name, h.Mode)
		}
	}
	want := []string{"a/", "a-b/", "a-b/y", "a/x.txt", "b.txt", "empty", "tool", "é.txt"}
	if strings.Join(order, ",") != strings.Join(want, ",") {
		t.Fatalf("order %v, want %v", order, want)
	}
	// Content changes change the digest.
	writeFiles(t, two, map[string]string{"b.txt": "bee!"})
	c3, err := Pack(ctx, two, io.Discard)
	mustDo(t, err)
	if c3.TreeDigest == c1.TreeDigest {
		t.Fatal("digest ignores content")
	}
}

func TestImportRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	src := t.TempDir()
	writeFiles(t, src, map[string]string{"a/b/c.txt": "c", "top.txt": "top", "a/empty": ""})
	mustDo(t, os.WriteFile(filepath.Join(src, "a/run"), []byte("x"), 0o750))
	var buf bytes.Buffer
	c, err := Pack(ctx, src, &buf)
	mustDo(t, err)
	for _, gz := range []bool{false, true} {
		stream := buf.Bytes()
		if gz {
			var z bytes.Buffer
			w := gzip.NewWriter(&z)
			w.Write(stream)
			w.Close()
			stream = z.Bytes()
		}
		// An existing empty directory is an acceptable target (it is replaced atomically).
		dst := filepath.Join(t.TempDir(), "dst")
		mustDo(t, os.Mkdir(dst, 0o700))
		if err := Import(ctx, bytes.NewReader(stream), c.Manifest, dst, Limits{}); err != nil {
			t.Fatalf("import (gzip=%v): %v", gz, err)
		}
		again, err := Pack(ctx, dst, io.Discard)
		mustDo(t, err)
		if again.TreeDigest != c.TreeDigest {
			t.Fatal("imported tree differs")
		}
		fi, err := os.Stat(filepath.Join(dst, "a/run"))
		mustDo(t, err)
		if fi.Mode().Perm() != 0o755 {
			t.Fatalf("mode %v", fi.Mode())
		}
		left, _ := os.ReadDir(filepath.Dir(dst))
		if len(left) != 1 {
			t.Fatalf("staging left behind: %v", left)
		}
	}
}

// tarEntry is one raw entry for hand-built archives.
type tarEntry struct {
	hdr  tar.Header
	body string
}

func fileEntry(name, body string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Size: int64(len(body)), Mode: 0o644, ModTime: epoch, Format: tar.FormatPAX}, body: body}
}

func dirEntry(name string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}}
}

func buildTar(t testing.TB, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("write header %q: %v", h.Name, err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	mustDo(t, tw.Close())
	return buf.Bytes()
}

// manifestOf describes entries as an honest manifest would (used where the archive is the liar).
func manifestOf(entries ...tarEntry) Manifest {
	var m Manifest
	for _, e := range entries {
		name := strings.TrimSuffix(e.hdr.Name, "/")
		if e.hdr.Typeflag == tar.TypeDir {
			m.Entries = append(m.Entries, ManifestEntry{Path: name, Type: TypeDir, Mode: 0o755})
			continue
		}
		sum := sha256.Sum256([]byte(e.body))
		m.Entries = append(m.Entries, ManifestEntry{Path: name, Type: TypeFile, Size: int64(len(e.body)), Mode: 0o644, SHA256: hex.EncodeToString(sum[:])})
	}
	return m
}

func TestImportRejects(t *testing.T) {
	t.Parallel()
	ok := []tarEntry{dirEntry("d"), fileEntry("d/f", "content"), fileEntry("g", "gee")}
	okTar := buildTar(t, ok...)
	okMan := manifestOf(ok...)

	withHdr := func(e tarEntry, edit func(*tar.Header)) tarEntry { edit(&e.hdr); return e }
	sym := func(name, target string) tarEntry {
		return tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: epoch, Format: tar.FormatPAX}}
	}
	special := func(name string, typ byte) tarEntry {
		return tarEntry{hdr: tar.Header{Typeflag: typ, Name: name, Mode: 0o644, Devmajor: 1, Devminor: 3, ModTime: epoch, Format: tar.FormatPAX}}
	}
	flipped := append([]byte(nil), okTar...)
	flipped[bytes.Index(flipped, []byte("content"))] ^= 0x01
	bigClaim := func() []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		mustDo(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "big", Size: 10 << 30, Mode: 0o644, ModTime: epoch, Format: tar.FormatPAX}))
		return buf.Bytes() // no data follows: the importer must refuse before reading any
	}()
	nfcA, nfdA := "caf\u00e9", "cafe\u0301"

	cases := []struct {
		name string
		tar  []byte
		man  Manifest
		lim  Limits
		want error
	}{
		{"zip-slip name", buildTar(t, fileEntry("../evil", "x")), manifestOf(fileEntry("evil", "x")), Limits{}, ErrCapsule},
		{"zip-slip in manifest", buildTar(t, fileEntry("../evil", "x")), manifestOf(fileEntry("../evil", "x")), Limits{}, ErrCapsule},
		{"nested zip-slip", buildTar(t, dirEntry("d"), fileEntry("d/../../evil", "x")), manifestOf(dirEntry("d"), fileEntry("d/evil", "x")), Limits{}, ErrCapsule},
		{"absolute name", buildTar(t, fileEntry("/etc/cron.d/x", "x")), manifestOf(fileEntry("etc", "x")), Limits{}, ErrCapsule},
		{"backslash name", buildTar(t, fileEntry("..\\..\\x", "x")), manifestOf(fileEntry("..\\..\\x", "x")), Limits{}, ErrCapsule},
		{"symlink then file", buildTar(t, sym("a", "/etc"), fileEntry("a/passwd", "x")), manifestOf(dirEntry("a"), fileEntry("a/passwd", "x")), Limits{}, ErrCapsule},
		{"symlink to parent", buildTar(t, sym("a", "../..")), manifestOf(dirEntry("a")), Limits{}, ErrCapsule},
		{"hard link", buildTar(t, fileEntry("x", "x"), withHdr(special("y", tar.TypeLink), func(h *tar.Header) { h.Linkname = "../x" })), manifestOf(fileEntry("x", "x"), fileEntry("y", "")), Limits{}, ErrCapsule},
		{"char device", buildTar(t, special("null", tar.TypeChar)), manifestOf(fileEntry("null", "")), Limits{}, ErrCapsule},
		{"block device", buildTar(t, special("sda", tar.TypeBlock)), manifestOf(fileEntry("sda", "")), Limits{}, ErrCapsule},
		{"fifo", buildTar(t, special("p", tar.TypeFifo)), manifestOf(fileEntry("p", "")), Limits{}, ErrCapsule},
		{"header claims 10 GB", bigClaim, manifestOf(fileEntry("big", "x")), Limits{}, ErrQuota},
		{"manifest claims 10 GB", okTar, Manifest{Entries: []ManifestEntry{{Path: "big", Type: TypeFile, Size: 10 << 30, Mode: 0o644, SHA256: strings.Repeat("0", 64)}}}, Limits{}, ErrQuota},
		{"duplicate in archive", buildTar(t, fileEntry("a", "1"), fileEntry("a", "1")), manifestOf(fileEntry("a", "1")), Limits{}, ErrCapsule},
		{"duplicate in manifest", buildTar(t, fileEntry("a", "1"), fileEntry("a", "1")), manifestOf(fileEntry("a", "1"), fileEntry("a", "1")), Limits{}, ErrCapsule},
		{"case collision", buildTar(t, fileEntry("A", "1"), fileEntry("a", "2")), manifestOf(fileEntry("A", "1"), fileEntry("a", "2")), Limits{}, ErrCapsule},
		{"NFC collision", buildTar(t, fileEntry(nfdA, "1"), fileEntry(nfcA, "2")), manifestOf(fileEntry(nfdA, "1"), fileEntry(nfcA, "2")), Limits{}, ErrCapsule},
		{"flipped byte", flipped, okMan, Limits{}, ErrCapsule},
		{"entry missing from archive", buildTar(t, ok[:2]...), okMan, Limits{}, ErrCapsule},
		{"entry missing from manifest", okTar, manifestOf(ok[:2]...), Limits{}, ErrCapsule},
		{"size mismatch", buildTar(t, fileEntry("g", "geee")), manifestOf(fileEntry("g", "gee")), Limits{}, ErrCapsule},
		{"type mismatch", buildTar(t, dirEntry("g")), manifestOf(fileEntry("g", "")), Limits{}, ErrCapsule},
		{"setuid in archive", buildTar(t, withHdr(fileEntry("s", "x"), func(h *tar.Header) { h.Mode = 0o4755 })), func() Manifest {
			m := manifestOf(fileEntry("s", "x"))
			m.Entries[0].Mode = 0o755
			return m
		}(), Limits{}, ErrCapsule},
		{"setuid in manifest", buildTar(t, withHdr(fileEntry("s", "x"), func(h *tar.Header) { h.Mode = 0o4755 })), func() Manifest {
			m := manifestOf(fileEntry("s", "x"))
			m.Entries[0].Mode = 0o4755
			return m
		}(), Limits{}, ErrCapsule},
		{"world-writable mode", buildTar(t, withHdr(fileEntry("w", "x"), func(h *tar.Header) { h.Mode = 0o777 })), manifestOf(fileEntry("w", "x")), Limits{}, ErrCapsule},
		{"file under a file", buildTar(t, fileEntry("a", "1"), fileEntry("a/b", "2")), manifestOf(fileEntry("a", "1"), fileEntry("a/b", "2")), Limits{}, ErrCapsule},
		{"parent not listed", buildTar(t, fileEntry("x/y", "1")), manifestOf(fileEntry("x/y", "1")), Limits{}, ErrCapsule},
		{"trailing garbage", append(append([]byte(nil), okTar...), "garbage"...), okMan, Limits{}, ErrCapsule},
		{"trailing archive", append(append([]byte(nil), okTar...), okTar...), okMan, Limits{}, ErrCapsule},
		{"no end marker", okTar[:len(okTar)-1024], okMan, Limits{}, ErrCapsule},
		{"truncated data", okTar[:bytes.Index(okTar, []byte("content"))+3], okMan, Limits{}, ErrCapsule},
		{"too many entries", okTar, okMan, Limits{MaxEntries: 2}, ErrQuota},
		{"too many bytes", okTar, okMan, Limits{MaxBytes: 9}, ErrQuota},
		{"oversized PAX header", buildTar(t, withHdr(fileEntry("p", "x"), func(h *tar.Header) { h.PAXRecords = map[string]string{"comment": strings.Repeat("z", 100<<10)} })), manifestOf(fileEntry("p", "x")), Limits{}, ErrCapsule},
		{"unexpected PAX record", buildTar(t, withHdr(fileEntry("p", "x"), func(h *tar.Header) { h.PAXRecords = map[string]string{"comment": "hi"} })), manifestOf(fileEntry("p", "x")), Limits{}, ErrCapsule},
		{"GNU format", buildTar(t, withHdr(fileEntry(strings.Repeat("n", 120), "x"), func(h *tar.Header) { h.Format = tar.FormatGNU })), manifestOf(fileEntry(strings.Repeat("n", 120), "x")), Limits{}, ErrCapsule},
		{"global header", buildTar(t, tarEntry{hdr: tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "g", PAXRecords: map[string]string{"path": "x"}, Format: tar.FormatPAX}}), manifestOf(fileEntry("x", "")), Limits{}, ErrCapsule},
		{"not a tar", []byte(strings.Repeat("not a tar ", 200)), okMan, Limits{}, ErrCapsule},
		{"empty stream", nil, okMan, Limits{}, ErrCapsule},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			parent := t.TempDir()
			target := filepath.Join(parent, "target")
			err := Import(testCtx(t), bytes.NewReader(tc.tar), tc.man, target, tc.lim)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Import = %v, want %v", err, tc.want)
			}
			assertUntouched(t, parent)
		})
	}
}

// assertUntouched checks that a failed import left nothing in parent: no target, no staging.
func assertUntouched(t testing.TB, parent string) {
	t.Helper()
	left, err := os.ReadDir(parent)
	mustDo(t, err)
	if len(left) != 0 {
		t.Fatalf("failed import left %v", left)
	}
}

func TestImportGzipBomb(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	entries := []tarEntry{fileEntry("f", "small")}
	var z bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&z, gzip.BestCompression)
	zw.Write(buildTar(t, entries...))
	zeros := make([]byte, 1<<20)
	for range 256 { // 256 MiB of zeros after the archive: about 250 KiB compressed
		zw.Write(zeros)
	}
	zw.Close()
	compressed := z.Len()
	cr := &countReader{r: bytes.NewReader(z.Bytes())}
	parent := t.TempDir()
	err := Import(ctx, cr, manifestOf(entries...), filepath.Join(parent, "t"), Limits{})
	if !errors.Is(err, ErrCapsule) && !errors.Is(err, ErrQuota) {
		t.Fatalf("gzip bomb: %v", err)
	}
	if cr.n >= int64(compressed) {
		t.Fatalf("read all %d compressed bytes; the decompressed bound did not stop it", compressed)
	}
	assertUntouched(t, parent)

	// A bomb inside an entry: the header's claim is checked against the limit before any data.
	var z2 bytes.Buffer
	zw2 := gzip.NewWriter(&z2)
	tw := tar.NewWriter(zw2)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "f", Size: 64 << 20, Mode: 0o644, ModTime: epoch, Format: tar.FormatPAX})
	tw.Write(make([]byte, 64<<20))
	tw.Close()
	zw2.Close()
	m := Manifest{Entries: []ManifestEntry{{Path: "f", Type: TypeFile, Size: 5, Mode: 0o644, SHA256: strings.Repeat("a", 64)}}}
	err = Import(ctx, bytes.NewReader(z2.Bytes()), m, filepath.Join(parent, "t"), Limits{MaxBytes: 1 << 20})
	if !errors.Is(err, ErrQuota) {
		t.Fatalf("in-entry bomb: %v", err)
	}
	assertUntouched(t, parent)
}

func TestImportTargetRules(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	entries := []tarEntry{fileEntry("f", "x")}
	data, man := buildTar(t, entries...), manifestOf(entries...)
	parent := t.TempDir()
	full := filepath.Join(parent, "full")
	writeFiles(t, full, map[string]string{"keep": "keep"})
	if err := Import(ctx, bytes.NewReader(data), man, full, Limits{}); !errors.Is(err, ErrUnsafePath) {
		t.Fatalf("non-empty target: %v", err)
	}
	if mustRead(t, filepath.Join(full, "keep")) != "keep" {
		t.Fatal("target touched")
	}
	if err := Import(ctx, bytes.NewReader(data), man, "relative", Limits{}); !errors.Is(err, ErrUnsafePath) {
		t.Fatalf("relative target: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := Import(cctx, bytes.NewReader(data), man, filepath.Join(parent, "c"), Limits{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled import: %v", err)
	}
	// Record padding after the end marker (as GNU tar writes) is accepted.
	padded := append(append([]byte(nil), data...), make([]byte, 10240-len(data)%10240)...)
	if err := Import(ctx, bytes.NewReader(padded), man, filepath.Join(parent, "ok"), Limits{}); err != nil {
		t.Fatalf("padded archive: %v", err)
	}
}

func TestRealizeCapsule(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	src := t.TempDir()
	writeFiles(t, src, map[string]string{"a.txt": "a", "d/b.txt": "b"})
	var buf bytes.Buffer
	c, err := Pack(ctx, src, &buf)
	mustDo(t, err)
	res, err := m.RealizeCapsule(ctx, &buf, c.Manifest, Limits{})
	mustDo(t, err)
	if res.TreeDigest != c.TreeDigest || res.Strategy != StrategyCopy {
		t.Fatalf("result %+v", res)
	}
	if mustRead(t, filepath.Join(m.Base(), res.Cwd, "d/b.txt")) != "b" {
		t.Fatal("content")
	}
	fin, err := m.FinalizeCopy(ctx, res.Ref, io.Discard)
	mustDo(t, err)
	if len(fin.Changes.Added)+len(fin.Changes.Modified)+len(fin.Changes.Removed) != 0 {
		t.Fatalf("unchanged capsule workspace reports %+v", fin.Changes)
	}
	mustDo(t, m.Destroy(ctx, res.Ref))
}

func TestManifestDigestUnambiguous(t *testing.T) {
	t.Parallel()
	a := Manifest{Entries: []ManifestEntry{{Path: "a", Type: TypeDir, Mode: 0o755}, {Path: "a/b", Type: TypeFile, Mode: 0o644, Size: 1, SHA256: strings.Repeat("1", 64)}}}
	b := Manifest{Entries: []ManifestEntry{{Path: "a", Type: TypeDir, Mode: 0o755}, {Path: "a/b", Type: TypeFile, Mode: 0o755, Size: 1, SHA256: strings.Repeat("1", 64)}}}
	if a.Digest() == b.Digest() {
		t.Fatal("mode not in digest")
	}
	if d1, d2 := a.Digest(), a.Digest(); d1 != d2 {
		t.Fatal("digest not stable")
	}
}

func TestImportHeaderCap(t *testing.T) {
	t.Parallel()
	// A legal 3 KiB path (15 components of 200 bytes) whose PAX header takes about 4 KiB.
	var entries []tarEntry
	long := ""
	for i := range 15 {
		if i > 0 {
			long += "/"
		}
		long += strings.Repeat(string(rune('a'+i)), 200)
		if i < 14 {
			entries = append(entries, dirEntry(long))
		}
	}
	entries = append(entries, fileEntry(long, "x"))
	data, man := buildTar(t, entries...), manifestOf(entries...)
	parent := t.TempDir()
	err := Import(testCtx(t), bytes.NewReader(data), man, filepath.Join(parent, "t"), Limits{MaxHeaderBytes: 2048})
	if !errors.Is(err, ErrCapsule) || !strings.Contains(err.Error(), "header") {
		t.Fatalf("header over cap: %v", err)
	}
	assertUntouched(t, parent)
	if err := Import(testCtx(t), bytes.NewReader(data), man, filepath.Join(parent, "t"), Limits{}); err != nil {
		t.Fatalf("same header under the default cap: %v", err)
	}
}
