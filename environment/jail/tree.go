package jail

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// A workspace tree belongs to whoever ran in it last, and a process of the run (a runtime
// service outlives its run) may still be changing it while Berth walks it as root. So the trees
// Berth changes hands of or makes removable are walked on file descriptors: every directory is
// opened relative to its parent's descriptor with O_NOFOLLOW, and every entry is changed
// relative to its directory's descriptor without following a symlink. A directory swapped for
// a symlink mid-walk is not entered, and a path never resolves through one.

// TreeFunc is called for every entry below the walked root (never for the root itself), with the
// descriptor of its directory, its name and its lstat; for a directory, after its contents.
type TreeFunc func(dirfd int, name string, st *unix.Stat_t) error

// WalkTree walks the directory root without following symlinks, calling fn for every entry
// below it, children before their directory. A root that is itself a symlink is refused.
func WalkTree(root string, fn TreeFunc) error {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("walk %s: %w", filepath.Base(root), err)
	}
	defer unix.Close(fd)
	return walkFD(fd, fn)
}

func walkFD(fd int, fn TreeFunc) error {
	names, err := readNames(fd)
	if err != nil {
		return err
	}
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // removed meanwhile
			}
			return err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			switch {
			case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
				continue // replaced meanwhile: not entered, not changed
			case err != nil:
				return err
			}
			err = walkFD(sub, fn)
			unix.Close(sub)
			if err != nil {
				return err
			}
		}
		if err := fn(fd, name, &st); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
	}
	return nil
}

// readNames lists a directory's entries on its descriptor (which it leaves open).
func readNames(fd int) ([]string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "dir")
	defer f.Close()
	if _, err := unix.Seek(dup, 0, 0); err != nil {
		return nil, err
	}
	return f.Readdirnames(-1)
}

// chownTree gives every entry under root, and root last, to uid:gid. Symlinks are changed on the
// link itself. A file with several hard links is left alone: changing its owner would change it
// wherever else it is linked.
func chownTree(root string, uid, gid int) error {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("hand over: %w", err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("hand over: %w", err)
	}
	if int(st.Uid) == uid && int(st.Gid) == gid {
		return nil // already there: the root changes hands last, so the whole tree did before it
	}
	err = walkFD(fd, func(dirfd int, name string, st *unix.Stat_t) error {
		if int(st.Uid) == uid && int(st.Gid) == gid {
			return nil
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Nlink > 1 {
			return nil
		}
		return unix.Fchownat(dirfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
	})
	if err == nil {
		err = unix.Fchown(fd, uid, gid)
	}
	if err != nil {
		return fmt.Errorf("hand over: %w", err)
	}
	return nil
}

// MakeRemovable gives root and every directory under it owner rwx, so a tree a run left
// read-only (or unreadable) can be deleted by Berth when it is not root. A directory is made
// enterable before it is listed; nothing outside root is touched.
func MakeRemovable(root string) error {
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return makeRemovable(fd)
}

// makeRemovable changes the directory of the O_PATH descriptor fd, then its subdirectories.
func makeRemovable(fd int) error {
	// chmod through the descriptor's magic link: the inode fd holds, never a path that could
	// have become a symlink.
	if err := unix.Chmod(fmt.Sprintf("/proc/self/fd/%d", fd), 0o700); err != nil {
		return err
	}
	dir, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	names, err := readNames(dir)
	if err != nil {
		return err
	}
	for _, name := range names {
		sub, err := unix.Openat(dir, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // not a directory, a symlink, or gone
		}
		err = makeRemovable(sub)
		unix.Close(sub)
		if err != nil {
			return err
		}
	}
	return nil
}
