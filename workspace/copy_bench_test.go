package workspace

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkCopyVsCp times RealizeCopy and `cp -a` over the same tree in alternating order, one of
// each per iteration with the page cache flushed of dirty pages between them, and reports the
// median of each and ratio = cp-a / berth (above 1: Berth is faster). Interleaving keeps a busy
// machine's noise on both sides alike, which separate sub-benchmarks do not.
func BenchmarkCopyVsCp(b *testing.B) {
	src := b.TempDir()
	_, total := benchTree(b, src)
	ctx := context.Background()
	m, err := NewManager(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	dst := filepath.Join(b.TempDir(), "copy")
	berth := func() time.Duration {
		start := time.Now()
		res, err := m.RealizeCopy(ctx, src)
		d := time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Destroy(ctx, res.Ref); err != nil {
			b.Fatal(err)
		}
		return d
	}
	cp := func() time.Duration {
		start := time.Now()
		runSh(b, "cp -a "+src+" "+dst)
		d := time.Since(start)
		if err := os.RemoveAll(dst); err != nil {
			b.Fatal(err)
		}
		return d
	}
	var ours, theirs []time.Duration
	i := 0
	b.SetBytes(total)
	for b.Loop() {
		if i%2 == 0 {
			ours = append(ours, berth())
			unix.Sync()
			theirs = append(theirs, cp())
		} else {
			theirs = append(theirs, cp())
			unix.Sync()
			ours = append(ours, berth())
		}
		unix.Sync()
		i++
	}
	median := func(ds []time.Duration) time.Duration { slices.Sort(ds); return ds[len(ds)/2] }
	mo, mt := median(ours), median(theirs)
	b.ReportMetric(float64(mo.Milliseconds()), "berth-ms")
	b.ReportMetric(float64(mt.Milliseconds()), "cp-a-ms")
	b.ReportMetric(float64(mt)/float64(mo), "ratio")
}
