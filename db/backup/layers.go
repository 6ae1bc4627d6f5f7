package backup

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// Image layers are directory trees (a root filesystem: symlinks, modes and owners matter), so a
// backup keeps each as a plain tar of the tree, sorted, that restore unpacks through os.Root.
// Device nodes, sockets and FIFOs are left out (oci.Flatten never writes them into a layer).

// packLayer writes the tree at dir to w as a tar, entries sorted by path.
func packLayer(ctx context.Context, dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		names = append(names, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		full := filepath.Join(dir, filepath.FromSlash(name))
		fi, err := os.Lstat(full)
		if err != nil {
			return err
		}
		link := ""
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(full); err != nil {
				return err
			}
		case fi.IsDir(), fi.Mode().IsRegular():
		default:
			continue
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = name
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(full)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			if err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// unpackLayer extracts a tar from packLayer into target, which must not exist yet; it is built in
// a staging directory next to it and renamed into place when complete. Every write goes through
// os.Root, so no entry (by name or through a symlink it placed) lands outside the staging dir.
func unpackLayer(ctx context.Context, r io.Reader, target string) error {
	if _, err := os.Lstat(target); err == nil {
		return fmt.Errorf("unpack layer: %s exists already", target)
	}
	parent := filepath.Dir(target)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	staging, err := os.MkdirTemp(parent, ".restore-")
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(staging)
		}
	}()
	if err := os.Chmod(staging, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(staging)
	if err != nil {
		return err
	}
	defer root.Close()
	type dirMeta struct {
		name string
		hdr  *tar.Header
	}
	var dirs []dirMeta
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("unpack layer: %w", err)
		}
		name := strings.TrimSuffix(hdr.Name, "/")
		if name == "" || path.IsAbs(name) || path.Clean(name) != name || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("unpack layer: unsafe entry name %q", hdr.Name)
		}
		mode := hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("unpack layer: %w", err)
			}
			dirs = append(dirs, dirMeta{name, hdr})
		case tar.TypeReg:
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return fmt.Errorf("unpack layer: %w", err)
			}
			_, err = io.Copy(f, tr)
			if err == nil {
				err = f.Sync()
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("unpack layer: %s: %w", name, err)
			}
			if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil && !errors.Is(err, syscall.EPERM) {
				return fmt.Errorf("unpack layer: %w", err)
			}
			if err := root.Chmod(name, mode); err != nil {
				return fmt.Errorf("unpack layer: %w", err)
			}
			_ = root.Chtimes(name, hdr.ModTime, hdr.ModTime)
		case tar.TypeSymlink:
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return fmt.Errorf("unpack layer: %w", err)
			}
			if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil && !errors.Is(err, syscall.EPERM) {
				return fmt.Errorf("unpack layer: %w", err)
			}
		default:
			return fmt.Errorf("unpack layer: entry %q of type %q is not a directory, file or symlink", hdr.Name, hdr.Typeflag)
		}
	}
	// Directories last, deepest first: their modes may forbid writing into them.
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		if err := root.Lchown(d.name, d.hdr.Uid, d.hdr.Gid); err != nil && !errors.Is(err, syscall.EPERM) {
			return fmt.Errorf("unpack layer: %w", err)
		}
		if err := root.Chmod(d.name, d.hdr.FileInfo().Mode()&(fs.ModePerm|fs.ModeSetgid|fs.ModeSticky)); err != nil {
			return fmt.Errorf("unpack layer: %w", err)
		}
		_ = root.Chtimes(d.name, d.hdr.ModTime, d.hdr.ModTime)
	}
	if err := syncDir(staging); err != nil {
		return err
	}
	if err := os.Rename(staging, target); err != nil {
		return err
	}
	ok = true
	return syncDir(parent)
}
