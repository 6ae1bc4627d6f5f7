package oci

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// ErrUnsafe means an image holds what Berth does not unpack: an entry whose name climbs out of
// the root (or reaches it through a symlink), or a device node. Nothing of it is kept.
var ErrUnsafe = errors.New("unsafe image entry")

// Whiteout markers (OCI image spec, "Representing Changes").
const (
	whiteoutPrefix = ".wh."
	opaqueWhiteout = ".wh..wh..opq"
)

// Limits bound a flattened image.
type Limits struct {
	MaxBytes   int64 // file contents; default 8 GiB
	MaxEntries int   // default 1,000,000
}

// Result says what a flatten wrote.
type Result struct {
	Digest  string   // the image's manifest digest ("sha256:…")
	Bytes   int64    // file contents written (whiteouts applied: what the tree holds at the end)
	Entries int      // entries written over all layers
	Skipped []string // entries left out (FIFOs, sockets), by name
}

// Flatten unpacks img's layers, lowest first, into dst (an empty directory) as one tree: a
// whiteout ".wh.NAME" removes NAME from the layers below; an opaque whiteout removes everything
// the layers below put in its directory (what its own layer puts there stays, in any order).
// Directories, regular files, symlinks and hard links within the tree are kept; modes keep their
// permission bits without setuid and setgid; owners are not (every file is Berth's user's).
// Writes go through an os.Root, so an entry that climbs out with "..", is absolute after
// cleaning, or would be written through a symlink pointing outside fails the whole flatten with
// ErrUnsafe, and so does a device node. FIFOs and sockets are skipped and listed.
func Flatten(ctx context.Context, img v1.Image, dst string, lim Limits) (Result, error) {
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = 8 << 30
	}
	if lim.MaxEntries <= 0 {
		lim.MaxEntries = 1_000_000
	}
	d, err := img.Digest()
	if err != nil {
		return Result{}, fmt.Errorf("flatten: digest: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return Result{}, fmt.Errorf("flatten: layers: %w", err)
	}
	root, err := os.OpenRoot(dst)
	if err != nil {
		return Result{}, fmt.Errorf("flatten: %w", err)
	}
	defer root.Close()
	f := &flattener{root: root, lim: lim, res: Result{Digest: d.String()}, sizes: map[string]int64{}, dirs: map[string]bool{}}
	for i, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return Result{}, fmt.Errorf("flatten: layer %d: %w", i+1, err)
		}
		err = f.layer(ctx, rc)
		rc.Close()
		if err != nil {
			return Result{}, fmt.Errorf("flatten: layer %d: %w", i+1, err)
		}
	}
	for _, n := range f.sizes {
		f.res.Bytes += n
	}
	return f.res, nil
}

// flattener applies layers onto one root.
type flattener struct {
	root  *os.Root
	lim   Limits
	res   Result
	sizes map[string]int64 // regular files in the tree and their sizes
	total int64            // bytes written over all layers (bounded by MaxBytes)
	// this layer's own entries, which an opaque whiteout in the same layer keeps
	mine map[string]bool
	// dirs are directories known to exist (as directories) since the last removal: their
	// entries skip the walk that checks the parents.
	dirs map[string]bool
}

// layer applies one layer's tar stream.
func (f *flattener) layer(ctx context.Context, r io.Reader) error {
	f.mine = map[string]bool{}
	var opaque []string
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if f.res.Entries++; f.res.Entries > f.lim.MaxEntries {
			return fmt.Errorf("more than %d entries", f.lim.MaxEntries)
		}
		name, err := cleanName(h.Name)
		if err != nil {
			return err
		}
		if name == "" {
			continue
		}
		dir, base := path.Split(name)
		dir = strings.TrimSuffix(dir, "/")
		switch {
		case base == opaqueWhiteout:
			opaque = append(opaque, dir) // applied after the layer: its own entries stay
			continue
		case strings.HasPrefix(base, whiteoutPrefix):
			target := path.Join(dir, strings.TrimPrefix(base, whiteoutPrefix))
			if f.mine[target] {
				continue // a whiteout hides the layers below, never its own layer's entry
			}
			if err := f.remove(target); err != nil {
				return err
			}
			continue
		}
		if err := f.entry(tr, h, name); err != nil {
			return err
		}
	}
	for _, dir := range opaque {
		if err := f.clearBelow(dir); err != nil {
			return err
		}
	}
	return nil
}

// entry writes one entry (replacing what lower layers had there, except a directory onto a
// directory, which merges).
func (f *flattener) entry(tr *tar.Reader, h *tar.Header, name string) error {
	if err := f.parents(name); err != nil {
		return err
	}
	f.mine[name] = true
	mode := fs.FileMode(h.Mode) & 0o1777 // setuid and setgid dropped, sticky kept
	switch h.Typeflag {
	case tar.TypeDir:
		if fi, err := f.root.Lstat(name); err == nil && fi.IsDir() {
			return unsafeErr(name, f.root.Chmod(name, mode|0o700))
		}
		if err := f.remove(name); err != nil {
			return err
		}
		return unsafeErr(name, f.root.Mkdir(name, mode|0o700))
	case tar.TypeReg:
		if f.total += h.Size; f.total > f.lim.MaxBytes {
			return fmt.Errorf("more than %d bytes of files", f.lim.MaxBytes)
		}
		if err := f.remove(name); err != nil {
			return err
		}
		out, err := f.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, mode&0o777|0o600)
		if err != nil {
			return unsafeErr(name, err)
		}
		n, err := io.Copy(out, tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		f.sizes[name] = n
		if mode == mode&0o755|0o600 { // OpenFile made it with exactly these bits (the umask only drops 0o022)
			return nil
		}
		return unsafeErr(name, f.root.Chmod(name, mode))
	case tar.TypeSymlink:
		if strings.ContainsRune(h.Linkname, 0) {
			return fmt.Errorf("%s: a symlink target with NUL: %w", name, ErrUnsafe)
		}
		if err := f.remove(name); err != nil {
			return err
		}
		return unsafeErr(name, f.root.Symlink(h.Linkname, name))
	case tar.TypeLink:
		target, err := cleanName(h.Linkname)
		if err != nil || target == "" {
			return fmt.Errorf("%s: a hard link out of the image: %w", name, ErrUnsafe)
		}
		if err := f.remove(name); err != nil {
			return err
		}
		if err := f.root.Link(target, name); err != nil {
			return unsafeErr(name, err)
		}
		f.sizes[name] = f.sizes[target]
		return nil
	case tar.TypeChar, tar.TypeBlock:
		return fmt.Errorf("%s: a device node: %w", name, ErrUnsafe)
	default: // FIFOs, sockets, anything else
		f.res.Skipped = append(f.res.Skipped, name)
		return nil
	}
}

// parents makes sure name's parent directories exist (as directories, or symlinks that resolve
// inside the root, as an image's /lib → usr/lib does).
func (f *flattener) parents(name string) error {
	dir := path.Dir(name)
	if dir == "." || f.dirs[dir] {
		return nil
	}
	if fi, err := f.root.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s: its parent is not a directory: %w", name, ErrUnsafe)
		}
		f.dirs[dir] = true
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return unsafeErr(name, err)
	}
	if err := f.parents(dir); err != nil {
		return err
	}
	err := f.root.Mkdir(dir, 0o755)
	if err == nil || errors.Is(err, fs.ErrExist) {
		f.dirs[dir] = true
		return nil
	}
	return unsafeErr(name, err)
}

// remove deletes name (and what is below it) if it exists, without following a symlink.
func (f *flattener) remove(name string) error {
	fi, err := f.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	clear(f.dirs) // what was known to be a directory may be gone or replaced now
	if err != nil {
		return unsafeErr(name, err)
	}
	if fi.IsDir() {
		if err := f.clearBelow(name); err != nil {
			return err
		}
		f.forget(name)
		return unsafeErr(name, f.root.RemoveAll(name))
	}
	delete(f.sizes, name)
	return unsafeErr(name, f.root.Remove(name))
}

// clearBelow removes every entry in dir that this layer did not write (an opaque whiteout).
func (f *flattener) clearBelow(dir string) error {
	d := dir
	if d == "" {
		d = "."
	}
	fi, err := f.root.Lstat(d)
	if errors.Is(err, fs.ErrNotExist) || err == nil && !fi.IsDir() {
		return nil
	}
	if err != nil {
		return unsafeErr(dir, err)
	}
	entries, err := fs.ReadDir(f.root.FS(), d)
	if err != nil {
		return unsafeErr(dir, err)
	}
	for _, e := range entries {
		child := path.Join(dir, e.Name())
		if f.mine[child] {
			if e.IsDir() {
				if err := f.clearBelow(child); err != nil {
					return err
				}
			}
			continue
		}
		if e.IsDir() {
			if err := f.clearBelow(child); err != nil {
				return err
			}
			if f.keepsMine(child) {
				continue
			}
		}
		f.forget(child)
		clear(f.dirs)
		if err := f.root.RemoveAll(child); err != nil {
			return unsafeErr(child, err)
		}
	}
	return nil
}

// keepsMine reports whether this layer wrote anything below dir.
func (f *flattener) keepsMine(dir string) bool {
	for n := range f.mine {
		if strings.HasPrefix(n, dir+"/") {
			return true
		}
	}
	return false
}

// forget drops the sizes recorded at or below name.
func (f *flattener) forget(name string) {
	for n := range f.sizes {
		if n == name || strings.HasPrefix(n, name+"/") {
			delete(f.sizes, n)
		}
	}
}

// cleanName makes an entry name a clean relative path ("" for the root), or refuses one that
// climbs out of it.
func cleanName(n string) (string, error) {
	if strings.ContainsRune(n, 0) {
		return "", fmt.Errorf("%q: a name with NUL: %w", n, ErrUnsafe)
	}
	c := path.Clean(strings.TrimLeft(n, "/"))
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("%q climbs out of the image root: %w", n, ErrUnsafe)
	}
	if c == "." {
		return "", nil
	}
	return c, nil
}

// unsafeErr marks an os.Root refusal (a path through a symlink out of the root) as ErrUnsafe.
func unsafeErr(name string, err error) error {
	if err == nil {
		return nil
	}
	var pe *os.PathError
	if errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "escapes") {
		return fmt.Errorf("%s: reaches outside the image root through a symlink: %w", name, ErrUnsafe)
	}
	return fmt.Errorf("%s: %w", name, err)
}

// mkdirAll makes dir and its parents below root.
func mkdirAll(root *os.Root, dir string) error {
	if dir == "." || dir == "" {
		return nil
	}
	if err := mkdirAll(root, path.Dir(dir)); err != nil {
		return err
	}
	if err := root.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
}
