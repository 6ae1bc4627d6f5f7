package backup

import (
	"context"
	"crypto/rand"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"berth/environment/datadir"
)

// BenchmarkBackup1000Runs: an instance with 1,000 finished runs (4 KB of log each), 200 artifacts
// of 256 KiB (50 MiB) and an image layer of 500 files (20 MiB). "full" backs up into a new
// directory each time; "incremental" backs up again into the same directory after one more
// artifact, and reports what it copied (the dump and that artifact only).
func BenchmarkBackup1000Runs(b *testing.B) {
	w := newWorld(b, 1000)
	buf := make([]byte, 256<<10)
	for i := 0; i < 200; i++ {
		_, _ = rand.Read(buf)
		w.artifact(b, string(buf))
	}
	layer := w.layerDirFn(w.envID, 7)
	file := make([]byte, 40<<10)
	for i := 0; i < 500; i++ {
		_, _ = rand.Read(file)
		mustWrite(b, filepath.Join(layer, "usr", "lib", fmt.Sprintf("d%02d", i%20), fmt.Sprintf("f%03d", i)), string(file), 0o644)
	}
	keyOut := filepath.Join(b.TempDir(), "berth.key")
	run := func(dir string) Manifest {
		res, err := Backup(context.Background(), Options{Dir: dir, ConnString: w.conn, Data: datadir.At(w.data), Key: w.key,
			KeyOut: keyOut})
		if err != nil {
			b.Fatal(err)
		}
		return res.Manifest
	}
	b.Run("full", func(b *testing.B) {
		var m Manifest
		start := time.Now()
		for i := 0; i < b.N; i++ {
			m = run(filepath.Join(b.TempDir(), fmt.Sprint("backup", i)))
		}
		b.ReportMetric(time.Since(start).Seconds()/float64(b.N), "s/backup")
		b.ReportMetric(float64(m.Stats.CopiedBytes)/(1<<20), "copied-MiB")
		b.ReportMetric(float64(m.Stats.CopiedBlobs), "copied-blobs")
		b.ReportMetric(float64(m.Database.Size)/(1<<20), "dump-MiB")
	})
	b.Run("incremental", func(b *testing.B) {
		dir := filepath.Join(b.TempDir(), "backup")
		run(dir)
		var m Manifest
		var elapsed time.Duration
		for i := 0; i < b.N; i++ {
			w.artifact(b, fmt.Sprintf("artifact added before backup %d at %s", i, time.Now()))
			start := time.Now()
			m = run(dir)
			elapsed += time.Since(start)
		}
		b.ReportMetric(elapsed.Seconds()/float64(b.N), "s/backup")
		b.ReportMetric(float64(m.Stats.CopiedBytes)/(1<<20), "copied-MiB")
		b.ReportMetric(float64(m.Stats.CopiedBlobs), "copied-blobs")
		b.ReportMetric(float64(m.Stats.ReusedBlobs), "reused-blobs")
	})
}
