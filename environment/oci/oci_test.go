package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// entry is one tar entry of a test layer.
type entry struct {
	name, body, link string
	typ              byte
	mode             int64
}

func file(name, body string) entry {
	return entry{name: name, body: body, typ: tar.TypeReg, mode: 0o644}
}
func dir(name string) entry { return entry{name: name, typ: tar.TypeDir, mode: 0o755} }

// layerOf builds a layer from entries, in the order given.
func layerOf(t testing.TB, entries ...entry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Size: int64(len(e.body)), Linkname: e.link}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return layerFromBytes(t, buf.Bytes())
}

// layerFromBytes is a layer whose uncompressed tar is b.
func layerFromBytes(t testing.TB, b []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func imageOf(t testing.TB, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func flattenInto(t *testing.T, img v1.Image) (string, Result, error) {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	res, err := Flatten(context.Background(), img, dst, Limits{})
	return dst, res, err
}

func read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

func TestFlattenWhiteouts(t *testing.T) {
	t.Parallel()
	img := imageOf(t,
		layerOf(t, dir("a"), file("a/x", "x"), file("a/y", "y"), dir("d"), file("d/p", "p"), dir("d/sub"), file("d/sub/q", "q"),
			file("top", "1")),
		// The opaque marker comes after this layer's own entry in d: it must still stay (the order
		// bug some go-containerregistry versions have in mutate.Extract).
		layerOf(t, file("a/.wh.x", ""), file("d/new", "n"), file("d/.wh..wh..opq", ""), file("top", "2")),
	)
	dst, res, err := flattenInto(t, img)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dst, "a/x")); !errors.Is(err, os.ErrNotExist) {
		t.Error("a/x survived its whiteout")
	}
	if got := read(t, filepath.Join(dst, "a/y")); got != "y" {
		t.Errorf("a/y = %q: a whiteout removed its neighbour", got)
	}
	ents, _ := os.ReadDir(filepath.Join(dst, "d"))
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != "new" {
		t.Errorf("d holds %v after its opaque whiteout, want only this layer's new", names)
	}
	if got := read(t, filepath.Join(dst, "top")); got != "2" {
		t.Errorf("top = %q, want the upper layer's", got)
	}
	for _, marker := range []string{"a/.wh.x", "d/.wh..wh..opq"} {
		if _, err := os.Lstat(filepath.Join(dst, marker)); err == nil {
			t.Errorf("the marker %s was written into the tree", marker)
		}
	}
	want, _ := img.Digest()
	if res.Digest != want.String() || res.Bytes != int64(len("y")+len("n")+len("2")) {
		t.Errorf("result %+v, want digest %s and 3 bytes", res, want)
	}
}

func TestFlattenKeepsLinksAndDropsSetuid(t *testing.T) {
	t.Parallel()
	img := imageOf(t, layerOf(t, dir("usr"), dir("usr/bin"), entry{name: "usr/bin/tool", body: "#!/bin/sh\n", typ: tar.TypeReg, mode: 0o4755},
		entry{name: "bin", typ: tar.TypeSymlink, link: "usr/bin"}, entry{name: "usr/bin/alias", typ: tar.TypeLink, link: "usr/bin/tool"},
		file("bin/through-link", "ok")))
	dst, _, err := flattenInto(t, img)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dst, "usr/bin/tool"))
	if err != nil || fi.Mode()&os.ModeSetuid != 0 || fi.Mode().Perm() != 0o755 {
		t.Fatalf("tool: %v %v, want 0755 without setuid", fi.Mode(), err)
	}
	if target, err := os.Readlink(filepath.Join(dst, "bin")); err != nil || target != "usr/bin" {
		t.Fatalf("bin symlink: %q %v", target, err)
	}
	if got := read(t, filepath.Join(dst, "usr/bin/through-link")); got != "ok" {
		t.Fatalf("a file written through an in-image symlink: %q", got)
	}
	if got := read(t, filepath.Join(dst, "usr/bin/alias")); got != "#!/bin/sh\n" {
		t.Fatalf("hard link: %q", got)
	}
}

func TestFlattenRefusesEscapesAndDevices(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		entries []entry
	}{
		{"dot-dot", []entry{file("../escaped", "x")}},
		{"deep dot-dot", []entry{dir("a"), file("a/../../escaped", "x")}},
		{"through a symlink", []entry{{name: "etc", typ: tar.TypeSymlink, link: "/tmp/berth-oci-escape"}, file("etc/escaped", "x")}},
		{"through a relative symlink", []entry{{name: "up", typ: tar.TypeSymlink, link: "../.."}, file("up/escaped", "x")}},
		{"hard link out", []entry{{name: "h", typ: tar.TypeLink, link: "../../etc/passwd"}}},
		{"char device", []entry{{name: "null", typ: tar.TypeChar}}},
		{"block device", []entry{{name: "sda", typ: tar.TypeBlock}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dst, _, err := flattenInto(t, imageOf(t, layerOf(t, tc.entries...)))
			if !errors.Is(err, ErrUnsafe) {
				t.Fatalf("err = %v, want ErrUnsafe", err)
			}
			for _, p := range []string{filepath.Join(filepath.Dir(dst), "escaped"), filepath.Join(filepath.Dir(filepath.Dir(dst)), "escaped"),
				"/tmp/berth-oci-escape/escaped"} {
				if _, err := os.Lstat(p); err == nil {
					t.Fatalf("%s was written outside the root", p)
				}
			}
		})
	}
	// Negative control: the same shapes inside the root are fine.
	if _, _, err := flattenInto(t, imageOf(t, layerOf(t, dir("a"), file("a/../inside", "x"),
		entry{name: "rel", typ: tar.TypeSymlink, link: "a"}, file("rel/through", "y")))); err != nil {
		t.Fatalf("entries that stay inside: %v", err)
	}
}

// testImage is a two-layer image with a whiteout, the shape every source test reads back.
func testImage(t *testing.T) v1.Image {
	return imageOf(t, layerOf(t, dir("etc"), file("etc/os-release", "ID=berth-test\n"), file("gone", "x")),
		layerOf(t, file(".wh.gone", ""), file("hello", "world\n")))
}

// checkOpened flattens an opened source and checks it is testImage.
func checkOpened(t *testing.T, img Image, want v1.Image, kind string) {
	t.Helper()
	defer img.Close()
	if img.Kind != kind {
		t.Fatalf("kind %s, want %s", img.Kind, kind)
	}
	dst, res, err := flattenInto(t, img)
	if err != nil {
		t.Fatal(err)
	}
	wd, _ := want.Digest()
	if res.Digest != wd.String() {
		t.Fatalf("digest %s, want the manifest digest %s", res.Digest, wd)
	}
	if read(t, filepath.Join(dst, "hello")) != "world\n" || read(t, filepath.Join(dst, "etc/os-release")) != "ID=berth-test\n" {
		t.Fatal("the flattened tree lacks the image's files")
	}
	if _, err := os.Lstat(filepath.Join(dst, "gone")); err == nil {
		t.Fatal("a whited-out file is in the tree")
	}
}

func TestOpenFileSources(t *testing.T) {
	t.Parallel()
	img := testImage(t)
	work := t.TempDir()
	ctx := context.Background()

	layoutDir := filepath.Join(work, "layout")
	lp, err := layout.Write(layoutDir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(work, "image.tar")
	tag, _ := name.NewTag("berth.test/app:1")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	gz := filepath.Join(work, "image.tar.gz")
	gzipFile(t, archive, gz)
	layoutTar := filepath.Join(work, "layout.tar")
	tarDir(t, layoutDir, layoutTar)

	for _, tc := range []struct{ source, kind string }{
		{layoutDir, KindLayout}, {layoutTar, KindLayout}, {archive, KindArchive}, {gz, KindArchive},
	} {
		opened, err := Open(ctx, tc.source, work)
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(tc.source), err)
		}
		checkOpened(t, opened, img, tc.kind)
		if strings.Contains(opened.Source, "/") {
			t.Fatalf("the recorded source %q is a host path", opened.Source)
		}
	}
	notImage := filepath.Join(work, "notes.txt")
	if err := os.WriteFile(notImage, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, notImage, work); !errors.Is(err, ErrSource) {
		t.Fatalf("a text file: %v, want ErrSource", err)
	}
}

func gzipFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	if err := os.WriteFile(dst, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func tarDir(t *testing.T, dir, dst string) {
	t.Helper()
	if out, err := exec.Command("tar", "-C", dir, "-cf", dst, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, out)
	}
}

// TestPullFromLoopbackRegistry pushes to Debian's docker-registry on 127.0.0.1 and pulls by tag
// and by digest.
func TestPullFromLoopbackRegistry(t *testing.T) {
	t.Parallel()
	addr := StartTestRegistry(t)
	img := testImage(t)
	ref, err := name.ParseReference(addr + "/berth/test:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("push: %v", err)
	}
	d, _ := img.Digest()
	for _, source := range []string{addr + "/berth/test:v1", addr + "/berth/test@" + d.String()} {
		opened, err := Open(context.Background(), source, t.TempDir())
		if err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		checkOpened(t, opened, img, KindRegistry)
	}
	if _, err := Open(context.Background(), addr+"/berth/missing:v1", t.TempDir()); !errors.Is(err, ErrSource) {
		t.Fatalf("a missing tag: %v", err)
	}
}

// StartTestRegistry runs docker-registry (Debian's package) on a free loopback port with its
// storage in a temporary directory, and returns host:port.
func StartTestRegistry(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		t.Fatal("docker-registry is not installed: run scripts/test-deps.sh")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	conf := filepath.Join(dir, "config.yml")
	body := fmt.Sprintf("version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n", filepath.Join(dir, "data"), addr)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", conf)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatal("docker-registry did not listen within 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
