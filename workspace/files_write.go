package workspace

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// Writes go through the same resolver as reads (Files: input rules, the deny list on the
// requested and the real path, no symlink followed by the kernel, git directories denied), with
// these rules of their own: only a regular, single-link file is replaced or deleted; the leaf may
// not be a symlink, directory or special file; content is written to a temporary file in the
// same (verified, open) directory, synced and renamed over the target, so a reader sees the old
// or the new file and never half of one; a new file or directory takes its parent directory's
// owner (a run's workspace stays writable by the run user), a replaced file keeps its owner and
// permission bits (set-id bits dropped). Callers decide which roots are writable.

// MaxWriteBytes caps what one write or edit stores (and the size of a file an edit reads).
const MaxWriteBytes = 1 << 20

// ErrMatchCount means an edit's search text occurs a number of times other than expected; the
// error is a *MatchCountError (HTTP 409).
var ErrMatchCount = errors.New("search text match count differs")

// ErrChanged means a file changed between being read and being replaced by an edit (HTTP 409).
var ErrChanged = errors.New("file changed during edit")

// MatchCountError tells how often an edit's search text occurs and how often it was expected.
type MatchCountError struct {
	Matches, Expected int
}

func (e *MatchCountError) Error() string {
	return fmt.Sprintf("search text occurs %d times, expected %d", e.Matches, e.Expected)
}

// Unwrap makes errors.Is(err, ErrMatchCount) hold.
func (e *MatchCountError) Unwrap() error { return ErrMatchCount }

// Written is the outcome of a write, an edit or a delete.
type Written struct {
	Path         string `json:"path"`                   // real path relative to the root
	Size         int64  `json:"size"`                   // bytes now stored (0 after a delete)
	SHA256       string `json:"sha256,omitempty"`       // of the stored content
	Created      bool   `json:"created,omitempty"`      // the file did not exist before
	Replacements int    `json:"replacements,omitempty"` // an edit's replaced occurrences
	Deleted      bool   `json:"deleted,omitempty"`
}

// WriteOptions are the choices of one write.
type WriteOptions struct {
	// CreateDirs creates missing parent directories (each checked like any other component).
	CreateDirs bool
}

// target is a write's verified parent directory (open) and leaf name.
type target struct {
	dir  resolved
	leaf string
	rel  string
}

func (t target) close() { unix.Close(t.dir.fd) }

// openRoot opens a root's directory; a root that is a git directory is denied.
func (f *Files) openRoot(root string) (int, error) {
	for _, r := range f.roots {
		if root == "" || r.Name == root {
			fd, err := unix.Open(r.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return -1, fmt.Errorf("root %q: %w", root, ErrNotFound)
			}
			if isGitDir(fd) {
				unix.Close(fd)
				return -1, fmt.Errorf("root %q is a git directory: %w", root, ErrDenied)
			}
			return fd, nil
		}
	}
	return -1, fmt.Errorf("root %q: %w", root, ErrNotFound)
}

// resolveTarget checks p for a write and opens its parent directory, creating missing parents
// when create is set.
func (f *Files) resolveTarget(ctx context.Context, root, p string, create bool) (target, error) {
	if err := ctx.Err(); err != nil {
		return target{}, err
	}
	comps, slash, err := parseRequest(p, true)
	if err != nil {
		return target{}, err
	}
	if slash || len(comps) == 0 || comps[len(comps)-1] == ".." {
		return target{}, fmt.Errorf("a write names a file: %w", ErrBadPath)
	}
	for _, c := range comps {
		if DeniedName(c) {
			return target{}, fmt.Errorf("%q: %w", c, ErrDenied)
		}
	}
	parent, leaf := comps[:len(comps)-1], comps[len(comps)-1]
	if strings.HasPrefix(leaf, tempPrefix) {
		return target{}, fmt.Errorf("%q: %w", leaf, ErrDenied)
	}
	fd, err := f.openRoot(root)
	if err != nil {
		return target{}, err
	}
	dir, err := walk(ctx, fd, parent, wantDir)
	if err == nil {
		return target{dir: dir, leaf: leaf, rel: path.Join(dir.rel, leaf)}, nil
	}
	if !create || !errors.Is(err, ErrNotFound) || errors.Is(err, errRaced) {
		return target{}, err
	}
	// Create the missing parents one at a time, each below a prefix resolved again.
	made := -1
	for n := 1; n <= len(parent); {
		fd, err := f.openRoot(root)
		if err != nil {
			return target{}, err
		}
		dir, err := walk(ctx, fd, parent[:n], wantDir)
		switch {
		case err == nil && n == len(parent):
			return target{dir: dir, leaf: leaf, rel: path.Join(dir.rel, leaf)}, nil
		case err == nil:
			unix.Close(dir.fd)
			n++
			continue
		case !errors.Is(err, ErrNotFound) || errors.Is(err, errRaced) || made == n:
			return target{}, err // made == n: created, yet still missing (a dangling symlink)
		}
		if err := f.mkdirIn(ctx, root, parent[:n-1], parent[n-1]); err != nil {
			return target{}, err
		}
		made = n
	}
	return target{}, fmt.Errorf("a write names a file: %w", ErrBadPath)
}

// mkdirIn creates name in the directory parent (resolved again), owned like that directory.
func (f *Files) mkdirIn(ctx context.Context, root string, parent []string, name string) error {
	if name == ".." {
		return fmt.Errorf("%q: %w", name, ErrNotFound)
	}
	fd, err := f.openRoot(root)
	if err != nil {
		return err
	}
	dir, err := walk(ctx, fd, parent, wantDir)
	if err != nil {
		return err
	}
	defer unix.Close(dir.fd)
	if err := unix.Mkdirat(dir.fd, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("create directory %q: %w", path.Join(dir.rel, name), err)
	}
	sub, err := unix.Openat(dir.fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%q: %w", path.Join(dir.rel, name), errRaced)
	}
	defer unix.Close(sub)
	return ownLike(sub, &dir.st)
}

// ownLike gives fd the owner of st when Berth runs as root (otherwise it is Berth's already).
func ownLike(fd int, st *unix.Stat_t) error {
	if os.Geteuid() != 0 {
		return nil
	}
	if err := unix.Fchown(fd, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("set owner: %w", err)
	}
	return nil
}

// leafState is what exists at a target's leaf: nothing (exists false) or a regular single-link
// file; anything else is refused.
func (t target) leafState() (st unix.Stat_t, exists bool, err error) {
	if err := unix.Fstatat(t.dir.fd, t.leaf, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return st, false, nil
		}
		return st, false, fmt.Errorf("%q: %w", t.rel, ErrNotFound)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFLNK:
		return st, true, fmt.Errorf("%q is a symlink: %w", t.rel, ErrNotRegular)
	default:
		return st, true, fmt.Errorf("%q is a %s: %w", t.rel, fileKind(st.Mode), ErrNotRegular)
	}
	if st.Nlink > 1 {
		return st, true, fmt.Errorf("%q: %w", t.rel, ErrHardLink)
	}
	return st, true, nil
}

// tempPrefix names the temporary files of writes in progress (never a valid write target).
const tempPrefix = ".berth-write-"

// replace stores data at the target through a synced temporary file renamed over it. prev is
// the leaf as it was (exists false for a new file); the new file keeps its owner and mode.
func (t target) replace(data []byte, prev *unix.Stat_t, exists bool) error {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := tempPrefix + hex.EncodeToString(rnd[:])
	mode := uint32(0o644)
	if exists {
		mode = prev.Mode & 0o777
	}
	fd, err := unix.Openat(t.dir.fd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return fmt.Errorf("write %q: %w", t.rel, err)
	}
	file := os.NewFile(uintptr(fd), tmp)
	err = func() error {
		defer file.Close()
		if _, err := file.Write(data); err != nil {
			return err
		}
		owner := &t.dir.st
		if exists {
			owner = prev
		}
		if err := ownLike(fd, owner); err != nil {
			return err
		}
		if err := unix.Fchmod(fd, mode); err != nil {
			return err
		}
		return file.Sync()
	}()
	if err == nil {
		err = unix.Renameat(t.dir.fd, tmp, t.dir.fd, t.leaf)
	}
	if err != nil {
		_ = unix.Unlinkat(t.dir.fd, tmp, 0)
		return fmt.Errorf("write %q: %w", t.rel, err)
	}
	_ = unix.Fsync(t.dir.fd)
	return nil
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Write stores data at p (a new file, or a regular single-link file replaced whole).
func (f *Files) Write(ctx context.Context, root, p string, data []byte, opt WriteOptions) (Written, error) {
	if len(data) > MaxWriteBytes {
		return Written{}, fmt.Errorf("write: %d bytes, cap %d: %w", len(data), MaxWriteBytes, ErrTooLarge)
	}
	t, err := f.resolveTarget(ctx, root, p, opt.CreateDirs)
	if err != nil {
		return Written{}, fmt.Errorf("write: %w", err)
	}
	defer t.close()
	prev, exists, err := t.leafState()
	if err != nil {
		return Written{}, fmt.Errorf("write: %w", err)
	}
	if err := t.replace(data, &prev, exists); err != nil {
		return Written{}, err
	}
	return Written{Path: t.rel, Size: int64(len(data)), SHA256: digest(data), Created: !exists}, nil
}

// Edit replaces old with new in the file at p, expected times exactly (0 means 1): any other
// number of occurrences is a *MatchCountError and nothing changes. The file is read and
// rewritten whole (at most MaxWriteBytes before and after); a file changed meanwhile is
// ErrChanged.
func (f *Files) Edit(ctx context.Context, root, p, old, new string, expected int) (Written, error) {
	if old == "" {
		return Written{}, fmt.Errorf("edit: empty search text: %w", ErrBadPath)
	}
	if expected <= 0 {
		expected = 1
	}
	t, err := f.resolveTarget(ctx, root, p, false)
	if err != nil {
		return Written{}, fmt.Errorf("edit: %w", err)
	}
	defer t.close()
	prev, exists, err := t.leafState()
	if err != nil {
		return Written{}, fmt.Errorf("edit: %w", err)
	}
	if !exists {
		return Written{}, fmt.Errorf("edit %q: %w", t.rel, ErrNotFound)
	}
	if prev.Size > MaxWriteBytes {
		return Written{}, fmt.Errorf("edit %q: %w", t.rel, ErrTooLarge)
	}
	fd, err := unix.Openat(t.dir.fd, t.leaf, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Written{}, fmt.Errorf("edit %q: %w", t.rel, errRaced)
	}
	file := os.NewFile(uintptr(fd), t.leaf)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Ino != prev.Ino || st.Dev != prev.Dev || st.Mode&unix.S_IFMT != unix.S_IFREG {
		file.Close()
		return Written{}, fmt.Errorf("edit %q: %w", t.rel, errRaced)
	}
	b, err := io.ReadAll(io.LimitReader(file, MaxWriteBytes+1))
	file.Close()
	if err != nil {
		return Written{}, fmt.Errorf("edit %q: %w", t.rel, err)
	}
	text := string(b)
	if n := strings.Count(text, old); n != expected {
		return Written{}, &MatchCountError{Matches: n, Expected: expected}
	}
	out := []byte(strings.ReplaceAll(text, old, new))
	if len(out) > MaxWriteBytes {
		return Written{}, fmt.Errorf("edit %q: result over %d bytes: %w", t.rel, MaxWriteBytes, ErrTooLarge)
	}
	now, exists, err := t.leafState()
	if err != nil || !exists || now.Ino != prev.Ino || now.Size != prev.Size || now.Mtim != prev.Mtim {
		return Written{}, fmt.Errorf("edit %q: %w", t.rel, ErrChanged)
	}
	if err := t.replace(out, &prev, true); err != nil {
		return Written{}, err
	}
	return Written{Path: t.rel, Size: int64(len(out)), SHA256: digest(out), Replacements: expected}, nil
}

// Delete removes the regular single-link file at p (never a directory, symlink or special file).
func (f *Files) Delete(ctx context.Context, root, p string) (Written, error) {
	t, err := f.resolveTarget(ctx, root, p, false)
	if err != nil {
		return Written{}, fmt.Errorf("delete: %w", err)
	}
	defer t.close()
	_, exists, err := t.leafState()
	if err != nil {
		return Written{}, fmt.Errorf("delete: %w", err)
	}
	if !exists {
		return Written{}, fmt.Errorf("delete %q: %w", t.rel, ErrNotFound)
	}
	if err := unix.Unlinkat(t.dir.fd, t.leaf, 0); err != nil {
		return Written{}, fmt.Errorf("delete %q: %w", t.rel, err)
	}
	_ = unix.Fsync(t.dir.fd)
	return Written{Path: t.rel, Deleted: true}, nil
}
