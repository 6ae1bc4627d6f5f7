package workspace

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"testing"
	"time"
)

// referenceTreeHash is the plain Go tree hash the receipt digest is measured against: walk the
// tree, sha256 each regular file, sort by path, hash the list. One goroutine, no checks.
func referenceTreeHash(root string) (string, error) {
	type entry struct{ path, sum string }
	var files []entry
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == ".git" {
			return filepath.SkipDir
		}
		if !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return err
		}
		files = append(files, entry{p[len(root):], hex.EncodeToString(h.Sum(nil))})
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Slice(files, func(i, j int) bool { return files[i].path < files[j].path })
	h := sha256.New()
	for _, e := range files {
		fmt.Fprintf(h, "%s\x00%s\n", e.path, e.sum)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// BenchmarkReceiptTreeDigest is the finalize cost of a receipt: the tree digest of a 20,000-file
// workspace (BERTH_BENCH_FILES; files of 1-8 KiB in 200 directories) by TreeDigest (a copy
// workspace's digest) and by WorktreeDigest (a git worktree's: git ls-files, then the files),
// each against the reference Go tree hash, interleaved, warm cache. ratio = reference time /
// digest time (goal >= 0.7; above 1 is faster than the reference).
func BenchmarkReceiptTreeDigest(b *testing.B) {
	n := 20000
	if v, err := strconv.Atoi(os.Getenv("BERTH_BENCH_FILES")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	dir := b.TempDir()
	buf := make([]byte, 8<<10)
	for i := range buf {
		buf[i] = byte(i*31 + i>>7)
	}
	for i := 0; i < n; i++ {
		sub := filepath.Join(dir, fmt.Sprintf("d%03d", i%200))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			b.Fatal(err)
		}
		buf[0], buf[1] = byte(i), byte(i>>8)
		if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%05d.txt", i)), buf[:1024+(i%8)*1024], 0o644); err != nil {
			b.Fatal(err)
		}
	}
	gitT(b, dir, "init", "-q", "-b", "main")
	gitT(b, dir, "add", "-A")
	gitT(b, dir, "commit", "-qm", "tree")
	m := newTestManager(b)
	measure := func(f func() error) time.Duration {
		start := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	ref := func() error { _, err := referenceTreeHash(dir); return err }
	tree := func() error { _, err := TreeDigest(ctx, dir); return err }
	res, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: dir, TaskKey: "BENCH-1"})
	if err != nil {
		b.Fatal(err)
	}
	wt := func() error { _, err := m.WorktreeDigest(ctx, res.Ref); return err }
	measure(ref) // warm the page cache
	measure(tree)
	measure(wt)
	var refs, trees, wts []time.Duration
	b.ResetTimer()
	for i := 0; i < max(b.N, 3); i++ {
		refs = append(refs, measure(ref))
		trees = append(trees, measure(tree))
		wts = append(wts, measure(wt))
	}
	b.StopTimer()
	med := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	r, t, w := med(refs), med(trees), med(wts)
	b.ReportMetric(float64(n), "files")
	b.ReportMetric(r, "reference-ms")
	b.ReportMetric(t, "tree-digest-ms")
	b.ReportMetric(w, "worktree-digest-ms")
	b.ReportMetric(r/t, "ratio")
	b.ReportMetric(r/w, "ratio-worktree")
}
