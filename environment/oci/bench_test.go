package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// craneVersion is the crane the import is compared with (go-containerregistry's own CLI, the
// same library version Berth uses).
const craneVersion = "v0.22.1"

// crane installs crane once into BERTH_BENCH_CRANE (default /var/tmp/berth-crane) and returns it.
func crane(b *testing.B) string {
	dir := os.Getenv("BERTH_BENCH_CRANE")
	if dir == "" {
		dir = "/var/tmp/berth-crane"
	}
	bin := filepath.Join(dir, "crane")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command("go", "install", "github.com/google/go-containerregistry/cmd/crane@"+craneVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go install crane: %v %s", err, out)
	}
	return bin
}

// hostLayer is a layer of this host's files under /usr (regular files, up to max bytes).
func hostLayer(b *testing.B, max int64) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	var n int64
	_ = filepath.WalkDir("/usr", func(p string, e fs.DirEntry, err error) error {
		if err != nil || n >= max {
			return fs.SkipDir
		}
		if !e.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		if err := tw.WriteHeader(&tar.Header{Name: p[1:], Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data))}); err != nil {
			return err
		}
		_, _ = tw.Write(data)
		n += int64(len(data))
		return nil
	})
	_ = tw.Close()
	return buf.Bytes()
}

// BenchmarkImportVsCraneExport imports a ~200 MB docker save tarball (this host's /usr files and
// a small second layer, gzip-compressed as docker save writes them) as Berth does (open, then
// flatten into a directory tree), and runs `crane export` of the same tarball, alternating: once
// writing its flattened filesystem as one tar file (ratio), once piped into tar -x to reach the
// same end state as Berth, a directory tree (ratio-untar). Medians; above 1 means Berth is faster.
// BERTH_BENCH_OCI_MB changes the size.
func BenchmarkImportVsCraneExport(b *testing.B) {
	mb := int64(200)
	if v, err := strconv.ParseInt(os.Getenv("BERTH_BENCH_OCI_MB"), 10, 64); err == nil && v > 0 {
		mb = v
	}
	cr := crane(b)
	work, err := os.MkdirTemp("/var/tmp", "berth-oci-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(work)
	layerBytes := hostLayer(b, mb<<20)
	img := imageOf(b, layerFromBytes(b, layerBytes), layerFromBytes(b, hostLayerTop(b)))
	archive := filepath.Join(work, "image.tar")
	tag, _ := name.NewTag("berth.bench/usr:1")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		b.Fatal(err)
	}
	fi, _ := os.Stat(archive)
	berth := make([]time.Duration, 0, b.N)
	craneT := make([]time.Duration, 0, b.N)
	craneX := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dst := filepath.Join(work, "tree-"+strconv.Itoa(i))
		if err := os.Mkdir(dst, 0o755); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		opened, err := Open(context.Background(), archive, work)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Flatten(context.Background(), opened, dst, Limits{}); err != nil {
			b.Fatal(err)
		}
		opened.Close()
		berth = append(berth, time.Since(t0))
		out := filepath.Join(work, "export-"+strconv.Itoa(i)+".tar")
		in, err := os.Open(archive)
		if err != nil {
			b.Fatal(err)
		}
		t0 = time.Now()
		// "-" reads the tarball from stdin: crane never resolves a name (and never reaches a registry).
		cmd := exec.Command(cr, "export", "-", out)
		cmd.Stdin = in
		if o, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("crane export: %v %s", err, o)
		}
		in.Close()
		craneT = append(craneT, time.Since(t0))
		// The same end state as Berth's (a directory tree): crane export piped into tar -x.
		xdir := filepath.Join(work, "x-"+strconv.Itoa(i))
		if err := os.Mkdir(xdir, 0o755); err != nil {
			b.Fatal(err)
		}
		if in, err = os.Open(archive); err != nil {
			b.Fatal(err)
		}
		t0 = time.Now()
		sh := exec.Command("/bin/sh", "-c", `"$0" export - - | tar -x -C "$1"`, cr, xdir)
		sh.Stdin = in
		if o, err := sh.CombinedOutput(); err != nil {
			b.Fatalf("crane export | tar -x: %v %s", err, o)
		}
		in.Close()
		craneX = append(craneX, time.Since(t0))
		os.RemoveAll(xdir)
		b.StopTimer()
		os.RemoveAll(dst)
		os.Remove(out)
		b.StartTimer()
	}
	b.StopTimer()
	med := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	bm, cm, xm := med(berth), med(craneT), med(craneX)
	b.ReportMetric(float64(xm.Milliseconds()), "crane-export-untar-ms")
	b.ReportMetric(float64(xm)/float64(bm), "ratio-untar")
	b.ReportMetric(float64(len(layerBytes))/(1<<20), "image-MiB")
	b.ReportMetric(float64(fi.Size())/(1<<20), "tarball-MiB")
	b.ReportMetric(float64(bm.Milliseconds()), "berth-ms")
	b.ReportMetric(float64(cm.Milliseconds()), "crane-export-ms")
	b.ReportMetric(float64(cm)/float64(bm), "ratio")
}

func hostLayerTop(b *testing.B) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: "etc/os-release", Typeflag: tar.TypeReg, Mode: 0o644, Size: 8})
	_, _ = tw.Write([]byte("ID=bench"))
	_ = tw.Close()
	return buf.Bytes()
}
