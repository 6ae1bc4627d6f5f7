package workspace

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// Capsule is the result of packing a tree: its manifest, tree digest, the tar stream's length and the
// entries the scan left out.
type Capsule struct {
	Manifest   Manifest  // what the stream holds, in stream order
	TreeDigest string    // Manifest.Digest()
	TarBytes   int64     // length of the tar stream written
	Skipped    []Skipped // entries left out, with their reason
}

// epoch is the only timestamp a capsule carries.
var epoch = time.Unix(0, 0).UTC()

// Pack writes the tree at dir to w as a deterministic uncompressed tar (PAX format, entries sorted by
// path, times zeroed to the Unix epoch, uid/gid 0 and empty owner names, modes normalized to
// 0644/0755 for files and 0755 for directories, setuid/setgid/sticky dropped) and returns its
// manifest and tree digest. The same tree always yields the same bytes. Symlinks, devices, FIFOs,
// sockets, hard-linked files, .git and unportable names are skipped and reported, never followed.
func Pack(ctx context.Context, dir string, w io.Writer) (Capsule, error) {
	entries, skipped, err := scanTree(ctx, dir)
	if err != nil {
		return Capsule{}, fmt.Errorf("pack: %w", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return Capsule{}, fmt.Errorf("pack: %w", err)
	}
	defer root.Close()
	cw := &countWriter{w: w}
	tw := tar.NewWriter(cw)
	man := Manifest{Entries: make([]ManifestEntry, 0, len(entries))}
	buf := make([]byte, 256<<10)
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return Capsule{}, fmt.Errorf("pack: %w", err)
		}
		if e.dir {
			hdr := capsuleHeader(e.rel+"/", tar.TypeDir, 0, 0o755)
			if err := tw.WriteHeader(hdr); err != nil {
				return Capsule{}, fmt.Errorf("pack %q: %w", e.rel, err)
			}
			man.Entries = append(man.Entries, ManifestEntry{Path: e.rel, Type: TypeDir, Mode: 0o755})
			continue
		}
		me, err := packFile(root, tw, e, buf)
		if errors.Is(err, errChanged) || errors.Is(err, os.ErrNotExist) {
			skipped = append(skipped, Skipped{Path: e.rel, Reason: SkipChanged})
			continue
		}
		if err != nil {
			return Capsule{}, fmt.Errorf("pack %q: %w", e.rel, err)
		}
		man.Entries = append(man.Entries, me)
	}
	if err := tw.Close(); err != nil {
		return Capsule{}, fmt.Errorf("pack: %w", err)
	}
	return Capsule{Manifest: man, TreeDigest: man.Digest(), TarBytes: cw.n, Skipped: skipped}, nil
}

func packFile(root *os.Root, tw *tar.Writer, e scanEntry, buf []byte) (ManifestEntry, error) {
	f, size, err := openScanned(root, e)
	if err != nil {
		return ManifestEntry{}, err
	}
	defer f.Close()
	mode := normMode(e.perm, false)
	if err := tw.WriteHeader(capsuleHeader(e.rel, tar.TypeReg, size, mode)); err != nil {
		return ManifestEntry{}, err
	}
	h := sha256.New()
	n, err := io.CopyBuffer(io.MultiWriter(tw, h), io.LimitReader(f, size), buf)
	if err != nil {
		return ManifestEntry{}, err
	}
	if n != size {
		// The file shrank after its header was written; the stream cannot be repaired.
		return ManifestEntry{}, fmt.Errorf("file shrank while packing (%d of %d bytes)", n, size)
	}
	return ManifestEntry{Path: e.rel, Type: TypeFile, Size: size, Mode: mode, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// capsuleHeader is the one header shape a capsule uses.
func capsuleHeader(name string, typ byte, size int64, mode uint32) *tar.Header {
	return &tar.Header{
		Typeflag: typ,
		Name:     name,
		Size:     size,
		Mode:     int64(mode),
		ModTime:  epoch,
		Format:   tar.FormatPAX,
	}
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
