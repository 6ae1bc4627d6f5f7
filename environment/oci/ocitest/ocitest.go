// Package ocitest gives tests real OCI parts: Debian's docker-registry on a loopback port, and a
// small realistic image (this host's /bin/sh, a few core tools and node with the libraries they
// load, in a merged-/usr layout) built as layers in the test.
package ocitest

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// StartRegistry runs docker-registry on a free 127.0.0.1 port, storage in a temporary
// directory, and returns host:port.
func StartRegistry(t testing.TB) string {
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
	body := fmt.Sprintf("version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n",
		filepath.Join(dir, "data"), addr)
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

// HostTools are the host programs NodeImage carries (besides /bin/sh).
var HostTools = []string{"cat", "ls", "rm", "mkdir", "echo", "sleep", "stty", "node"}

// NodeImage is a two-layer image: a base with /bin/sh, HostTools and their libraries (symlinks
// /bin → usr/bin, /lib → usr/lib, /lib64 → usr/lib64 as Debian's merged /usr has them), and a
// top layer that adds /etc/os-release and whites out a file of the base.
func NodeImage(t testing.TB) v1.Image {
	t.Helper()
	files := map[string]string{} // image path → host file
	add := func(bin string) {
		real, err := filepath.EvalSymlinks(bin)
		if err != nil {
			t.Fatal(err)
		}
		files[usrPath(bin)] = real
		for _, l := range libsOf(t, real, map[string]bool{}) {
			files[usrPath(l)] = l
		}
	}
	add("/bin/sh")
	for _, tool := range HostTools {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatalf("%s is not on this host: %v", tool, err)
		}
		add(p)
		if tool == "node" {
			files["usr/bin/node"] = files[usrPath(p)]
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range []string{"bin", "lib", "lib64"} {
		must(t, tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeSymlink, Linkname: "usr/" + n, Mode: 0o777}))
	}
	for _, d := range []string{"tmp", "etc", "root", "dev", "proc", "sys"} {
		must(t, tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755}))
	}
	must(t, tw.WriteHeader(&tar.Header{Name: "etc/obsolete", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3}))
	_, _ = tw.Write([]byte("old"))
	for _, n := range names {
		for d := filepath.Dir(n); d != "." && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	dirList := make([]string, 0, len(dirs))
	for d := range dirs {
		dirList = append(dirList, d)
	}
	sort.Strings(dirList)
	for _, d := range dirList {
		must(t, tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755}))
	}
	for _, n := range names {
		b, err := os.ReadFile(files[n])
		if err != nil {
			t.Fatal(err)
		}
		must(t, tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(b))}))
		_, _ = tw.Write(b)
	}
	must(t, tw.Close())
	top := tarOf(t, map[string]string{"etc/os-release": "ID=berth-test\nNAME=\"Berth test image\"\n", "etc/.wh.obsolete": ""})
	img, err := mutate.AppendLayers(empty.Image, layer(t, buf.Bytes()), layer(t, top))
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// usrPath is a host path as it sits in the merged-/usr image ("/lib/x" → "usr/lib/x").
func usrPath(p string) string {
	p = strings.TrimPrefix(p, "/")
	for _, top := range []string{"bin/", "lib/", "lib64/", "sbin/"} {
		if strings.HasPrefix(p, top) {
			return "usr/" + p
		}
	}
	return p
}

func libsOf(t testing.TB, bin string, seen map[string]bool) []string {
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, _ := io.ReadAll(p.Open())
			out = append(out, strings.TrimRight(string(b), "\x00"))
		}
	}
	libs, _ := f.ImportedLibraries()
	for _, l := range libs {
		for _, d := range []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib", "/lib"} {
			if _, err := os.Stat(filepath.Join(d, l)); err == nil {
				out = append(out, filepath.Join(d, l))
				break
			}
		}
	}
	var all []string
	for _, l := range out {
		real, err := filepath.EvalSymlinks(l)
		if err != nil || seen[l] {
			continue
		}
		seen[l] = true
		all = append(all, l)
		if real != l {
			all = append(all, real)
		}
		all = append(all, libsOf(t, real, seen)...)
	}
	return all
}

func tarOf(t testing.TB, files map[string]string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		must(t, tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(files[n]))}))
		_, _ = tw.Write([]byte(files[n]))
	}
	must(t, tw.Close())
	return buf.Bytes()
}

func layer(t testing.TB, b []byte) v1.Layer {
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func must(t testing.TB, err error) {
	if err != nil {
		t.Helper()
		t.Fatal(err)
	}
}
