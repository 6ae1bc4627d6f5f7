package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
)

// untar extracts a tar stream into the directory dir through an os.Root, so no entry lands
// outside it: directories and regular files always, symlinks when links is set (their targets
// are the container's business; nothing here follows them), nothing else. strip drops a leading
// path component (podman cp names entries after the copied directory). Modes keep only the
// execute bits' meaning: 0755 or 0644.
func untar(r io.Reader, dir string, strip string, links bool) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(path.Clean("/"+hdr.Name), "/")
		if strip != "" {
			if name == strip {
				continue
			}
			rest, ok := strings.CutPrefix(name, strip+"/")
			if !ok {
				return fmt.Errorf("entry %q is outside %s", hdr.Name, strip)
			}
			name = rest
		}
		if name == "" || name == "." {
			continue
		}
		if !fs.ValidPath(name) {
			return fmt.Errorf("entry %q: not a relative path", hdr.Name)
		}
		if err := mkdirs(root, path.Dir(name)); err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(name, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		case tar.TypeReg:
			mode := os.FileMode(0o644)
			if hdr.Mode&0o111 != 0 {
				mode = 0o755
			}
			_ = root.Remove(name)
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if links {
				_ = root.Remove(name)
				if err := root.Symlink(hdr.Linkname, name); err != nil {
					return err
				}
			}
		}
	}
}

// mkdirs makes dir and its parents below root.
func mkdirs(root *os.Root, dir string) error {
	if dir == "." || dir == "" {
		return nil
	}
	if fi, err := root.Lstat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	}
	if err := mkdirs(root, path.Dir(dir)); err != nil {
		return err
	}
	if err := root.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
}
