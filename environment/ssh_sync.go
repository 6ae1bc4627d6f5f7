package environment

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// noFollow opens the named file itself, never a symlink's target.
const noFollow = syscall.O_NOFOLLOW

// Limits of what Sync applies from a remote host, which could otherwise fill this host's disk.
const (
	maxSyncEntries = 200_000
	maxSyncBytes   = 8 << 30
)

// syncScript ($1 root or "", $2 key) writes the remote workspace (without .git) as a tar to
// standard output, after checking that it still belongs to the lease key. Without a root it is
// the workspace whose lease marker names key.
const syncScript = `set -eu
root=$1 key=$2
if [ -z "$root" ]; then
	for f in "$base"/*.lease; do
		[ -f "$f" ] || continue
		if [ "$(cat "$f" 2>/dev/null)" = "$key" ]; then root=${f%.lease}; break; fi
	done
	if [ -z "$root" ]; then echo "no remote workspace belongs to this instance" >&2; exit 3; fi
fi
if [ ! -f "$root.lease" ] || [ "$(cat "$root.lease")" != "$key" ]; then
	echo "the remote workspace does not belong to this instance" >&2; exit 3
fi
cd "$root"
exec tar -c -f - --exclude=.git .
`

// Sync downloads the remote workspace (without .git) as a tar and applies it to HostPath: files
// and symlinks added or changed there are written here, what was removed there is removed here;
// HostPath's own .git (and any .git below) is never touched. An entry whose name is absolute or
// climbs with ".." fails the sync (what came before it was applied; a retry applies the whole tree
// again). Symlinks pointing outside the workspace, devices, FIFOs and sockets are not created,
// and whatever is at their path here is kept. An empty Root means the workspace this instance
// realized (the one whose remote lease marker names its key); a Root that another lease has
// realized since is refused.
func (d *sshDriver) Sync(ctx context.Context, req SyncRequest) error {
	key, err := d.keyOf(req.Instance)
	if err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	if req.Root != "" && (!path.IsAbs(req.Root) || strings.ContainsRune(req.Root, 0)) {
		return fmt.Errorf("sync: root must be an absolute remote path: %w", ErrInvalidRequest)
	}
	p := req.HostPath
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return fmt.Errorf("sync: host path must be absolute and clean: %w", ErrInvalidRequest)
	}
	if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
		return fmt.Errorf("sync: host path is not a directory: %w", ErrInvalidRequest)
	}
	pr, pw := io.Pipe()
	applied := make(chan error, 1)
	go func() {
		err := applyTree(ctx, pr, p)
		if err == nil {
			_, _ = io.Copy(io.Discard, pr) // tar pads its end with zero blocks
		}
		pr.CloseWithError(err)
		applied <- err
	}()
	_, err = d.run(ctx, req.Instance.Ref, d.script(syncScript), nil, pw, req.Root, key)
	pw.CloseWithError(err)
	if aerr := <-applied; aerr != nil {
		return fmt.Errorf("sync: %w", errors.Join(aerr, err))
	}
	if err != nil {
		return fmt.Errorf("sync: download: %w", err)
	}
	return nil
}

// syncName is a tar entry's name as a clean relative path ("" for the root itself), or an error
// for a name that is absolute, climbs out with "..", or holds NUL.
func syncName(name string) (string, error) {
	n := strings.TrimSuffix(name, "/")
	for strings.HasPrefix(n, "./") {
		n = n[2:]
	}
	if n == "." || n == "" {
		return "", nil
	}
	if strings.HasPrefix(n, "/") || strings.ContainsRune(n, 0) {
		return "", fmt.Errorf("entry %q: absolute or not a path: %w", name, ErrInvalidRequest)
	}
	for _, part := range strings.Split(n, "/") {
		if part == ".." {
			return "", fmt.Errorf("entry %q: climbs out of the workspace: %w", name, ErrInvalidRequest)
		}
	}
	c := path.Clean(n)
	if !fs.ValidPath(c) {
		return "", fmt.Errorf("entry %q: not a valid path: %w", name, ErrInvalidRequest)
	}
	return c, nil
}

// inGit reports whether a relative path is, or is below, a directory named .git.
func inGit(name string) bool {
	return slices.Contains(strings.Split(name, "/"), ".git")
}

// linkInside reports whether a symlink at name with target stays inside the tree.
func linkInside(name, target string) bool {
	if target == "" || strings.HasPrefix(target, "/") || strings.ContainsRune(target, 0) {
		return false
	}
	t := path.Join(path.Dir(name), target)
	return t != ".." && !strings.HasPrefix(t, "../")
}

// applier applies one downloaded tree to the workspace root.
type applier struct {
	root  *os.Root
	seen  map[string]bool // entries the remote tree has (and their parents)
	kept  map[string]bool // entries not applied whose local counterpart stays
	dirs  map[string]bool // directories known to be real directories here
	bytes int64
	n     int
	buf   []byte
}

// applyTree writes the tar stream r onto dir (see Sync), then removes what the stream did not
// hold: regular files, symlinks, and directories left empty.
func applyTree(ctx context.Context, r io.Reader, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	a := &applier{root: root, seen: map[string]bool{}, kept: map[string]bool{}, dirs: map[string]bool{"": true},
		buf: make([]byte, 256<<10)}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read the remote tree: %w", err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := a.entry(tr, hdr); err != nil {
			return err
		}
	}
	return a.removeRest(ctx)
}

func (a *applier) entry(tr *tar.Reader, hdr *tar.Header) error {
	name, err := syncName(hdr.Name)
	if err != nil {
		return err
	}
	if name == "" || inGit(name) {
		return nil
	}
	if a.n++; a.n > maxSyncEntries {
		return fmt.Errorf("the remote tree has more than %d entries", maxSyncEntries)
	}
	if err := a.parents(name); err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		a.seen[name] = true
		return a.mkdir(name)
	case tar.TypeReg: // the reader reports old-style TypeRegA entries as TypeReg
		a.seen[name] = true
		if a.bytes += hdr.Size; a.bytes > maxSyncBytes {
			return fmt.Errorf("the remote tree holds more than %d bytes", int64(maxSyncBytes))
		}
		return a.writeFile(name, tr, hdr.Size, hdr.Mode)
	case tar.TypeLink:
		target, err := syncName(hdr.Linkname)
		if err != nil || target == "" || !a.seen[target] || inGit(target) {
			return fmt.Errorf("entry %q: a hard link to something the tree did not hold: %w", hdr.Name, ErrInvalidRequest)
		}
		f, err := a.root.OpenFile(target, os.O_RDONLY|noFollow, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		a.seen[name] = true
		return a.writeFile(name, f, fi.Size(), int64(fi.Mode().Perm()))
	case tar.TypeSymlink:
		if !linkInside(name, hdr.Linkname) {
			a.kept[name] = true
			return nil
		}
		a.seen[name] = true
		return a.symlink(name, hdr.Linkname)
	default: // devices, FIFOs and whatever else are never made here
		a.kept[name] = true
		return nil
	}
}

// parents makes sure every parent of name is a real directory (a symlink or file in the way is
// replaced, as the remote tree has a directory there).
func (a *applier) parents(name string) error {
	dir := path.Dir(name)
	if dir == "." {
		return nil
	}
	var chain []string
	for d := dir; d != "." && !a.dirs[d]; d = path.Dir(d) {
		chain = append(chain, d)
	}
	for _, d := range slices.Backward(chain) {
		a.seen[d] = true
		if err := a.mkdir(d); err != nil {
			return err
		}
	}
	return nil
}

// mkdir makes name a directory, replacing anything else there.
func (a *applier) mkdir(name string) error {
	if a.dirs[name] {
		return nil
	}
	fi, err := a.root.Lstat(name)
	switch {
	case err == nil && fi.IsDir():
	case err == nil:
		if err := a.root.Remove(name); err != nil {
			return err
		}
		fallthrough
	default:
		if err := a.root.Mkdir(name, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	a.dirs[name] = true
	return nil
}

// writeFile writes size bytes of r to name unless name already holds exactly them with the
// same execute bit: into a temporary file next to it, renamed over it.
func (a *applier) writeFile(name string, r io.Reader, size, mode int64) error {
	perm := fs.FileMode(0o644)
	if mode&0o111 != 0 {
		perm = 0o755
	}
	tmp := path.Join(path.Dir(name), ".berth-sync-"+randomHex(8))
	f, err := a.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|noFollow, 0o600)
	if err != nil {
		return err
	}
	h := sha256.New()
	n, err := io.CopyBuffer(io.MultiWriter(f, h), io.LimitReader(r, size), a.buf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n != size {
		err = fmt.Errorf("entry %q ended early", name)
	}
	if err != nil {
		_ = a.root.Remove(tmp)
		return err
	}
	if fi, lerr := a.root.Lstat(name); lerr == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 == perm&0o111 &&
		sameFile(a.root, name, size, h.Sum(nil)) {
		return a.root.Remove(tmp) // unchanged: keep the file (and its times) as it is
	} else if lerr == nil && fi.IsDir() {
		if err := a.removeAll(name); err != nil {
			_ = a.root.Remove(tmp)
			return err
		}
	}
	if err := a.root.Chmod(tmp, perm); err != nil {
		_ = a.root.Remove(tmp)
		return err
	}
	if err := a.root.Rename(tmp, name); err != nil {
		_ = a.root.Remove(tmp)
		return err
	}
	return nil
}

// symlink makes name a symlink to target, unless it already is one.
func (a *applier) symlink(name, target string) error {
	fi, err := a.root.Lstat(name)
	if err == nil {
		if fi.Mode()&fs.ModeSymlink != 0 {
			if cur, err := a.root.Readlink(name); err == nil && cur == target {
				return nil
			}
		}
		if err := a.removeAll(name); err != nil {
			return err
		}
	}
	return a.root.Symlink(target, name)
}

// removeAll removes name and what is below it, except any .git inside (a directory holding one
// stays, with it).
func (a *applier) removeAll(name string) error {
	fi, err := a.root.Lstat(name)
	if err != nil {
		return nil
	}
	if !fi.IsDir() {
		return a.root.Remove(name)
	}
	var names []string
	err = fs.WalkDir(a.root.FS(), name, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.Name() == ".git" {
			if e.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		names = append(names, p)
		return nil
	})
	if err != nil {
		return err
	}
	for _, p := range slices.Backward(names) {
		if err := a.root.Remove(p); err != nil && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
			return err
		}
	}
	return nil
}

// removeRest removes the local entries the remote tree no longer has: regular files, symlinks
// and directories left empty. .git, kept entries and other file types stay.
func (a *applier) removeRest(ctx context.Context) error {
	var gone []string
	err := fs.WalkDir(a.root.FS(), ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p == "." {
			return nil
		}
		if e.Name() == ".git" || a.kept[p] {
			if e.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if a.seen[p] {
			return nil
		}
		if t := e.Type(); t.IsDir() || t.IsRegular() || t&fs.ModeSymlink != 0 {
			gone = append(gone, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, p := range slices.Backward(gone) {
		err := a.root.Remove(p)
		if err != nil && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}
