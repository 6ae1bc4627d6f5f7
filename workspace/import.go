package workspace

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Limits bounds what an import may create; zero fields take the defaults of DefaultLimits.
type Limits struct {
	// MaxEntries caps the number of entries (files and directories).
	MaxEntries int
	// MaxBytes caps the total size of file contents, and therefore any single file.
	MaxBytes int64
	// MaxHeaderBytes caps the bytes one entry's headers may take (PAX extended records included).
	MaxHeaderBytes int64
}

// DefaultLimits returns the limits used for zero fields: 200,000 entries, 8 GiB, 16 KiB of headers
// per entry.
func DefaultLimits() Limits {
	return Limits{MaxEntries: 200_000, MaxBytes: 8 << 30, MaxHeaderBytes: 16 << 10}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxEntries <= 0 {
		l.MaxEntries = d.MaxEntries
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = d.MaxBytes
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = d.MaxHeaderBytes
	}
	return l
}

// maxTrailing is how many zero bytes may follow the end-of-archive marker (GNU tar pads archives to
// 10 KiB records; compressors may add their own blocking).
const maxTrailing = 64 << 10

// Import materializes a capsule stream (plain tar, or gzip-compressed tar) at target, verifying every
// entry against the manifest: same order, path, type, size, mode and SHA-256. It rejects traversal,
// absolute and malformed names, links, devices, FIFOs, duplicates (also under case folding and
// Unicode normalization), files under files, manifest mismatches, oversized headers, sizes and counts
// over lim (a header claiming too many bytes is refused before its data is read), a missing
// end-of-archive marker and trailing data. The whole decompressed stream is bounded by what the
// manifest allows, so a gzip bomb stops at that bound.
//
// Entries are written into a staging directory next to target; only when all of them are written,
// verified and fsynced (files and directories) is the staging directory renamed to target. target
// must not exist or be an empty directory. On any failure target is untouched and staging removed.
func Import(ctx context.Context, r io.Reader, m Manifest, target string, lim Limits) error {
	return importAt(ctx, r, m, target, lim, nil)
}

// importAt is Import calling step, when set (fault tests), at each publish step: "staged" (every
// entry and directory written and fsynced, not yet renamed) and "renamed" (in place, the parent
// directory not yet fsynced).
func importAt(ctx context.Context, r io.Reader, m Manifest, target string, lim Limits, step func(string)) error {
	at := func(s string) {
		if step != nil {
			step(s)
		}
	}
	lim = lim.withDefaults()
	if err := m.validate(lim); err != nil {
		return fmt.Errorf("import: %w", err)
	}
	if err := checkImportTarget(target); err != nil {
		return fmt.Errorf("import: %w", err)
	}
	staging, err := os.MkdirTemp(filepath.Dir(target), StagingPattern(filepath.Base(target))) // SweepStaging removes a killed import's
	if err != nil {
		return fmt.Errorf("import: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = removeTree(staging)
		}
	}()
	if err := importInto(ctx, r, m, staging, lim); err != nil {
		return fmt.Errorf("import: %w", err)
	}
	at("staged")
	// rename(2) directly: os.Rename refuses to replace an (empty) directory.
	if err := unix.Rename(staging, target); err != nil {
		return fmt.Errorf("import: rename into place: %w", err)
	}
	ok = true
	at("renamed")
	if err := syncDir(filepath.Dir(target)); err != nil {
		return fmt.Errorf("import: %w", err)
	}
	return nil
}

// checkImportTarget accepts an absolute target that does not exist or is an empty real directory.
func checkImportTarget(target string) error {
	if !filepath.IsAbs(target) {
		return fmt.Errorf("target must be absolute: %w", ErrUnsafePath)
	}
	fi, err := os.Lstat(target)
	if errors.Is(err, fs.ErrNotExist) {
		pfi, err := os.Stat(filepath.Dir(target))
		if err != nil {
			return err
		}
		if !pfi.IsDir() {
			return fmt.Errorf("target parent is not a directory: %w", ErrUnsafePath)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("target exists and is not a directory: %w", ErrUnsafePath)
	}
	names, err := readDirNames(context.Background(), target)
	if err != nil {
		return err
	}
	if len(names) > 0 {
		return fmt.Errorf("target directory is not empty: %w", ErrUnsafePath)
	}
	return nil
}

// streamBound is the largest decompressed stream a manifest can justify: padded contents, a header
// allowance per entry, the end-of-archive marker and the trailing allowance.
func streamBound(m Manifest, lim Limits) int64 {
	var n int64
	for _, e := range m.Entries {
		n += (e.Size+511)/512*512 + lim.MaxHeaderBytes
	}
	return n + 1024 + maxTrailing
}

func importInto(ctx context.Context, r io.Reader, m Manifest, staging string, lim Limits) error {
	br := bufio.NewReaderSize(&ctxReader{ctx: ctx, r: r}, 64<<10)
	var src io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("gzip: %v: %w", err, ErrCapsule)
		}
		defer gz.Close()
		src = gz
	}
	cr := &countReader{r: &boundReader{r: src, left: streamBound(m, lim)}}
	tr := tar.NewReader(cr)

	root, err := os.OpenRoot(staging)
	if err != nil {
		return err
	}
	defer root.Close()

	var total int64
	buf := make([]byte, 256<<10)
	for i := 0; ; i++ {
		before := cr.n
		hdr, err := tr.Next()
		if err == io.EOF {
			if i < len(m.Entries) {
				return fmt.Errorf("archive ends before %.200q: %w", m.Entries[i].Path, ErrCapsule)
			}
			if cr.n-before < 1024 {
				return fmt.Errorf("archive lacks its end-of-archive marker: %w", ErrCapsule)
			}
			break
		}
		if err != nil {
			return tarErr(err)
		}
		if cr.n-before > lim.MaxHeaderBytes+511 { // +511: the previous entry's padding
			return fmt.Errorf("entry header of %d bytes over the %d cap: %w", cr.n-before, lim.MaxHeaderBytes, ErrCapsule)
		}
		if i >= lim.MaxEntries {
			return fmt.Errorf("more than %d entries: %w", lim.MaxEntries, ErrQuota)
		}
		name, err := checkHeader(hdr)
		if err != nil {
			return err
		}
		if hdr.Size > lim.MaxBytes-total {
			return fmt.Errorf("entry %.200q claims %d bytes, over the %d byte limit: %w", name, hdr.Size, lim.MaxBytes, ErrQuota)
		}
		if i >= len(m.Entries) {
			return fmt.Errorf("entry %.200q is not in the manifest: %w", name, ErrCapsule)
		}
		want := m.Entries[i]
		if err := matchHeader(hdr, name, want); err != nil {
			return err
		}
		if want.Type == TypeDir {
			if err := root.Mkdir(name, 0o700); err != nil {
				return fmt.Errorf("create %.200q: %w", name, err)
			}
			continue
		}
		total += hdr.Size
		if err := writeEntry(root, tr, want, buf); err != nil {
			return err
		}
	}
	if err := checkTrailing(cr); err != nil {
		return err
	}
	return finishDirs(root, m, staging)
}

// checkHeader enforces the capsule header shape and returns the entry path (without the trailing
// slash of a directory).
func checkHeader(hdr *tar.Header) (string, error) {
	if hdr.Format != tar.FormatUSTAR && hdr.Format != tar.FormatPAX {
		return "", fmt.Errorf("entry %.200q: tar format %v not allowed: %w", hdr.Name, hdr.Format, ErrCapsule)
	}
	for k := range hdr.PAXRecords {
		if k != "path" && k != "size" {
			return "", fmt.Errorf("entry %.200q: PAX record %q not allowed: %w", hdr.Name, k, ErrCapsule)
		}
	}
	name := hdr.Name
	switch hdr.Typeflag {
	case tar.TypeReg:
	case tar.TypeDir:
		name = strings.TrimSuffix(name, "/")
	case tar.TypeSymlink, tar.TypeLink:
		return "", fmt.Errorf("entry %.200q: links are not allowed: %w", hdr.Name, ErrCapsule)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return "", fmt.Errorf("entry %.200q: devices and FIFOs are not allowed: %w", hdr.Name, ErrCapsule)
	default:
		return "", fmt.Errorf("entry %.200q: type %q not allowed: %w", hdr.Name, hdr.Typeflag, ErrCapsule)
	}
	if hdr.Linkname != "" {
		return "", fmt.Errorf("entry %.200q: link name on a non-link: %w", hdr.Name, ErrCapsule)
	}
	if !capsuleNameOK(name) {
		return "", fmt.Errorf("entry %.200q: unsafe name: %w", hdr.Name, ErrCapsule)
	}
	if hdr.Size < 0 || (hdr.Typeflag == tar.TypeDir && hdr.Size != 0) {
		return "", fmt.Errorf("entry %.200q: bad size: %w", hdr.Name, ErrCapsule)
	}
	return name, nil
}

// matchHeader compares a header with the manifest entry expected at its position.
func matchHeader(hdr *tar.Header, name string, want ManifestEntry) error {
	typ := TypeFile
	if hdr.Typeflag == tar.TypeDir {
		typ = TypeDir
	}
	switch {
	case name != want.Path:
		return fmt.Errorf("entry %.200q where the manifest expects %.200q: %w", name, want.Path, ErrCapsule)
	case typ != want.Type:
		return fmt.Errorf("entry %.200q is a %s, manifest says %s: %w", name, typ, want.Type, ErrCapsule)
	case hdr.Size != want.Size:
		return fmt.Errorf("entry %.200q has %d bytes, manifest says %d: %w", name, hdr.Size, want.Size, ErrCapsule)
	case uint32(hdr.Mode) != want.Mode || hdr.Mode&^0o7777 != 0:
		return fmt.Errorf("entry %.200q has mode %o, manifest says %o: %w", name, hdr.Mode, want.Mode, ErrCapsule)
	}
	return nil
}

// writeEntry creates one file exclusively (never through an existing name), copies exactly its
// size, checks the hash, sets the manifest mode and fsyncs it.
func writeEntry(root *os.Root, tr *tar.Reader, want ManifestEntry, buf []byte) error {
	f, err := root.OpenFile(want.Path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create %.200q: %w", want.Path, err)
	}
	defer f.Close()
	h := sha256.New()
	fw := &recordingWriter{w: f}
	n, err := io.CopyBuffer(io.MultiWriter(fw, h), io.LimitReader(tr, want.Size), buf)
	if fw.err != nil { // this disk failed (ENOSPC, EIO…), not the capsule: retryable as it is
		return fmt.Errorf("write %.200q: %w", want.Path, fw.err)
	}
	if err != nil {
		return tarErr(err)
	}
	if n != want.Size {
		return fmt.Errorf("entry %.200q truncated: %w", want.Path, ErrCapsule)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want.SHA256 {
		return fmt.Errorf("entry %.200q: sha256 %s, manifest says %s: %w", want.Path, got, want.SHA256, ErrCapsule)
	}
	if err := f.Chmod(os.FileMode(want.Mode)); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return f.Close()
}

// recordingWriter remembers the error its writer returned, so a failed write to disk is told
// apart from a bad stream.
type recordingWriter struct {
	w   io.Writer
	err error
}

func (r *recordingWriter) Write(p []byte) (int, error) {
	n, err := r.w.Write(p)
	if err != nil && r.err == nil {
		r.err = err
	}
	return n, err
}

// checkTrailing accepts only zero bytes (record padding) after the end-of-archive marker.
func checkTrailing(r io.Reader) error {
	buf := make([]byte, 32<<10)
	var n int64
	for {
		k, err := r.Read(buf)
		for _, b := range buf[:k] {
			if b != 0 {
				return fmt.Errorf("data after the end of the archive: %w", ErrCapsule)
			}
		}
		n += int64(k)
		if n > maxTrailing {
			return fmt.Errorf("more than %d bytes of padding after the archive: %w", maxTrailing, ErrCapsule)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return tarErr(err)
		}
	}
}

// finishDirs gives every directory its final mode and fsyncs it, deepest first, then the staging
// directory itself.
func finishDirs(root *os.Root, m Manifest, staging string) error {
	for i := len(m.Entries) - 1; i >= 0; i-- {
		e := m.Entries[i]
		if e.Type != TypeDir {
			continue
		}
		d, err := root.Open(e.Path)
		if err != nil {
			return err
		}
		err = d.Chmod(0o755)
		if err == nil {
			err = d.Sync()
		}
		d.Close()
		if err != nil {
			return err
		}
	}
	if err := os.Chmod(staging, 0o755); err != nil {
		return err
	}
	return syncDir(staging)
}

// tarErr keeps quota and context errors as they are and marks everything else as a bad capsule.
func tarErr(err error) error {
	if errors.Is(err, ErrQuota) || errors.Is(err, ErrCapsule) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%v: %w", err, ErrCapsule)
}

// ctxReader fails reads once its context is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// boundReader fails with ErrCapsule once more than left bytes are requested past the bound.
type boundReader struct {
	r    io.Reader
	left int64
}

func (b *boundReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// Distinguish a clean end from more data beyond the bound.
		var one [1]byte
		n, err := b.r.Read(one[:])
		if n > 0 {
			return 0, fmt.Errorf("stream longer than its manifest allows: %w", ErrCapsule)
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
