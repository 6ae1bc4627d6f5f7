package workspace

import (
	"context"
	"fmt"
	"os"
	"path"
	"sort"
	"syscall"

	"golang.org/x/sys/unix"
)

// Skipped is one path a copy or pack left out, with the rule that excluded it.
type Skipped struct {
	Path   string `json:"path"`   // relative to the scanned root
	Reason string `json:"reason"` // one of the Skip* reasons
}

// The reasons a scan skips an entry. Only regular files with a single link and directories are
// ever copied or packed.
const (
	SkipGit       = "git metadata"
	SkipSymlink   = "symlink"
	SkipDevice    = "device"
	SkipFIFO      = "fifo"
	SkipSocket    = "socket"
	SkipHardLink  = "hard link"
	SkipName      = "unportable name"
	SkipCollision = "name collides by case or normalization"
	SkipChanged   = "changed during copy"
	SkipBerth     = "berth data directory"
	SkipOther     = "unsupported file type"
)

// scanEntry is one regular file or directory found by scanTree, identified by device and inode so
// that a later open can prove it reached the same object.
type scanEntry struct {
	rel  string
	dir  bool
	perm uint32 // permission bits only (setuid, setgid and sticky dropped)
	size int64
	dev  uint64
	ino  uint64
}

// scanTree lists the regular files and directories under root, sorted by path, without ever
// following a symlink: each directory is opened with O_NOFOLLOW from its parent's descriptor, and
// each entry is classified with fstatat(AT_SYMLINK_NOFOLLOW). Everything else is reported as
// skipped, and so are the directories named in exclude (Berth's own data, when a project holds it).
func scanTree(ctx context.Context, root string, exclude ...identity) ([]scanEntry, []Skipped, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open source: %w", err)
	}
	s := &scanner{ctx: ctx, exclude: exclude}
	err = s.walk(fd, "")
	unix.Close(fd)
	if err != nil {
		return nil, nil, err
	}
	sort.Slice(s.entries, func(i, j int) bool { return s.entries[i].rel < s.entries[j].rel })
	sort.Slice(s.skipped, func(i, j int) bool { return s.skipped[i].Path < s.skipped[j].Path })
	return s.entries, s.skipped, nil
}

type scanner struct {
	ctx     context.Context
	exclude []identity // compared by device and inode only
	entries []scanEntry
	skipped []Skipped
}

func (s *scanner) excluded(dev, ino uint64) bool {
	for _, id := range s.exclude {
		if id.dev == dev && id.ino == ino {
			return true
		}
	}
	return false
}

func (s *scanner) skip(rel, reason string) { s.skipped = append(s.skipped, Skipped{rel, reason}) }

func (s *scanner) walk(dirfd int, dirRel string) error {
	if err := s.ctx.Err(); err != nil {
		return err
	}
	dup, err := unix.Dup(dirfd)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(dup), dirRel)
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("read directory %q: %w", dirRel, err)
	}
	sort.Strings(names)
	seen := make(map[string]bool, len(names))
	for _, name := range names {
		rel := path.Join(dirRel, name)
		if name == ".git" {
			s.skip(rel, SkipGit)
			continue
		}
		if !componentNameOK(name) || len(rel) > maxPathBytes {
			s.skip(rel, SkipName)
			continue
		}
		if k := foldKey(name); seen[k] {
			s.skip(rel, SkipCollision)
			continue
		} else {
			seen[k] = true
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if err == unix.ENOENT {
				continue // vanished while scanning
			}
			return fmt.Errorf("stat %q: %w", rel, err)
		}
		e := scanEntry{rel: rel, perm: st.Mode & 0o777, size: st.Size, dev: uint64(st.Dev), ino: st.Ino}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			if st.Nlink > 1 {
				s.skip(rel, SkipHardLink)
				continue
			}
			s.entries = append(s.entries, e)
		case unix.S_IFDIR:
			if s.excluded(e.dev, e.ino) {
				s.skip(rel, SkipBerth)
				continue
			}
			sub, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				s.skip(rel, SkipChanged)
				continue
			}
			var sst unix.Stat_t
			if err := unix.Fstat(sub, &sst); err != nil || uint64(sst.Dev) != e.dev || sst.Ino != e.ino {
				unix.Close(sub)
				s.skip(rel, SkipChanged)
				continue
			}
			e.dir = true
			s.entries = append(s.entries, e)
			err = s.walk(sub, rel)
			unix.Close(sub)
			if err != nil {
				return err
			}
		case unix.S_IFLNK:
			s.skip(rel, SkipSymlink)
		case unix.S_IFCHR, unix.S_IFBLK:
			s.skip(rel, SkipDevice)
		case unix.S_IFIFO:
			s.skip(rel, SkipFIFO)
		case unix.S_IFSOCK:
			s.skip(rel, SkipSocket)
		default:
			s.skip(rel, SkipOther)
		}
	}
	return nil
}

// openScanned opens a scanned regular file through an os.Root (so no path can leave the tree) and
// proves with fstat that it is the same single-link regular file the scan saw.
func openScanned(r *os.Root, e scanEntry) (*os.File, int64, error) {
	f, err := r.OpenFile(e.rel, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	if !fi.Mode().IsRegular() || st.Nlink != 1 || uint64(st.Dev) != e.dev || st.Ino != e.ino {
		f.Close()
		return nil, 0, errChanged
	}
	return f, st.Size, nil
}

var errChanged = fmt.Errorf("file changed while being read")

// normMode maps permission bits to the capsule's two file modes: 0755 if any execute bit is set,
// else 0644. Directories are always 0755.
func normMode(perm uint32, dir bool) uint32 {
	if dir || perm&0o111 != 0 {
		return 0o755
	}
	return 0o644
}
