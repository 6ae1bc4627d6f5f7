package workspace

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"sort"
	"sync"
)

// Defaults of the copy quota (Options.CopyMaxBytes, CopyMaxFiles).
const (
	DefaultCopyMaxBytes int64 = 2 << 30
	DefaultCopyMaxFiles       = 200_000
)

// copyQuota bounds what a copy realization may copy.
type copyQuota struct {
	maxBytes int64
	maxFiles int
}

func newCopyQuota(maxBytes int64, maxFiles int) copyQuota {
	if maxBytes <= 0 {
		maxBytes = DefaultCopyMaxBytes
	}
	if maxFiles <= 0 {
		maxFiles = DefaultCopyMaxFiles
	}
	return copyQuota{maxBytes: maxBytes, maxFiles: maxFiles}
}

// check refuses scanned entries over the quota with ErrSourceTooLarge, saying which limit.
func (q copyQuota) check(entries []scanEntry) error {
	var files int
	var bytes int64
	for _, e := range entries {
		if !e.dir {
			files++
			bytes += e.size
		}
	}
	switch {
	case files > q.maxFiles:
		return fmt.Errorf("%d files, over the limit of %d (BERTH_COPY_MAX_FILES): %w", files, q.maxFiles, ErrSourceTooLarge)
	case bytes > q.maxBytes:
		return fmt.Errorf("%d bytes, over the limit of %d (BERTH_COPY_MAX_BYTES): %w", bytes, q.maxBytes, ErrSourceTooLarge)
	}
	return nil
}

// copyWorkers is how many files are copied at once: copying is bound by per-file syscalls and
// disk latency more than by the CPU, so a few more workers than cores keep the disk busy.
func copyWorkers() int { return min(max(4, 2*runtime.GOMAXPROCS(0)), 16) }

// copyTree copies the scanned regular files and directories of src into the empty directory dst
// and returns the manifest of what it wrote, with skipped extended by files that changed while
// being copied. Directories are made first (in path order, so parents come first); files are
// then copied by several workers, each in the kernel (copy_file_range, which reflinks where the
// filesystem can) and hashed from the copy, so the manifest describes exactly what was written.
func copyTree(ctx context.Context, src, dst string, entries []scanEntry, skipped []Skipped) (Manifest, []Skipped, error) {
	srcRoot, err := os.OpenRoot(src)
	if err != nil {
		return Manifest{}, nil, err
	}
	defer srcRoot.Close()
	dstRoot, err := os.OpenRoot(dst)
	if err != nil {
		return Manifest{}, nil, err
	}
	defer dstRoot.Close()

	// Files are handed out a directory at a time: creating entries in one directory from several
	// threads contends on that directory's lock and costs more than it gains.
	var dirs []scanEntry
	var batches [][]int
	lastParent := "\x00"
	for i, e := range entries {
		if !e.dir {
			if parent := path.Dir(e.rel); parent != lastParent || len(batches) == 0 {
				batches = append(batches, nil)
				lastParent = parent
			}
			batches[len(batches)-1] = append(batches[len(batches)-1], i)
			continue
		}
		if err := dstRoot.Mkdir(e.rel, 0o700); err != nil {
			return Manifest{}, nil, err
		}
		dirs = append(dirs, e)
	}

	results := make([]ManifestEntry, len(entries))
	changed := make([]bool, len(entries))
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan []int)
	var wg sync.WaitGroup
	for range min(copyWorkers(), max(len(batches), 1)) {
		wg.Go(func() {
			buf := make([]byte, 256<<10)
			for batch := range next {
				for _, i := range batch {
					if ctx.Err() != nil {
						break
					}
					me, err := copyFile(srcRoot, dstRoot, entries[i], buf)
					switch {
					case errors.Is(err, errChanged) || errors.Is(err, os.ErrNotExist):
						changed[i] = true
					case err != nil:
						cancel(fmt.Errorf("copy %q: %w", entries[i].rel, err))
					default:
						results[i] = me
					}
				}
			}
		})
	}
feed:
	for _, b := range batches {
		select {
		case next <- b:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return Manifest{}, nil, err
	}

	man := Manifest{Entries: make([]ManifestEntry, 0, len(entries))}
	for i, e := range entries {
		switch {
		case e.dir:
			man.Entries = append(man.Entries, ManifestEntry{Path: e.rel, Type: TypeDir, Mode: 0o755})
		case changed[i]:
			skipped = append(skipped, Skipped{Path: e.rel, Reason: SkipChanged})
		default:
			man.Entries = append(man.Entries, results[i])
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := dstRoot.Chmod(dirs[i].rel, os.FileMode(dirs[i].perm)); err != nil {
			return Manifest{}, nil, err
		}
	}
	sort.Slice(skipped, func(i, j int) bool { return skipped[i].Path < skipped[j].Path })
	return man, skipped, nil
}

// copyFile copies one scanned file: at most its scanned size plus one byte, so a file that grew
// since the scan is caught (errChanged) and the quota holds.
func copyFile(srcRoot, dstRoot *os.Root, e scanEntry, buf []byte) (ManifestEntry, error) {
	in, _, err := openScanned(srcRoot, e)
	if err != nil {
		return ManifestEntry{}, err
	}
	defer in.Close()
	out, err := dstRoot.OpenFile(e.rel, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return ManifestEntry{}, err
	}
	defer out.Close()
	// *os.File to *os.File (through a LimitedReader, which the fast path accepts): copy_file_range.
	n, err := io.Copy(out, &io.LimitedReader{R: in, N: e.size + 1})
	if err != nil {
		return ManifestEntry{}, err
	}
	if n != e.size {
		return ManifestEntry{}, errChanged
	}
	if _, err := out.Seek(0, io.SeekStart); err != nil {
		return ManifestEntry{}, err
	}
	h := sha256.New()
	if _, err := io.CopyBuffer(h, onlyReader{out}, buf); err != nil {
		return ManifestEntry{}, err
	}
	if err := out.Chmod(os.FileMode(e.perm)); err != nil {
		return ManifestEntry{}, err
	}
	if err := out.Close(); err != nil {
		return ManifestEntry{}, err
	}
	return ManifestEntry{Path: e.rel, Type: TypeFile, Size: n, Mode: normMode(e.perm, false), SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// onlyReader hides an *os.File's WriterTo so io.CopyBuffer uses the buffer.
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }
