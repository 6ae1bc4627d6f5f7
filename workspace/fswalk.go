package workspace

import (
	"errors"

	"golang.org/x/sys/unix"
)

// The walker's low-level helpers (files.go): git-directory detection on open fds, symlink reads
// and file kinds, all on raw fds so nothing follows a symlink behind the walker's back.

// isGitDir reports whether the open directory fd is a git directory by git's own test
// (is_git_directory in git's setup.c): a HEAD file, an objects/ and a refs/ directory. That holds for
// a bare repository whatever its core.bare says (git init --bare, clone --bare or --mirror) and for a
// .git directory copied under another name, and not for a work tree, whose git directory is its .git
// entry (a work tree that itself holds HEAD, objects/ and refs/ is hidden too: the safe side).
// Errors count as "no": a directory Berth cannot search shows no entries and cannot be entered anyway.
func isGitDir(fd int) bool {
	var st unix.Stat_t
	if unix.Fstatat(fd, "HEAD", &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return false
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFREG && t != unix.S_IFLNK { // old gits made HEAD a symlink
		return false
	}
	for _, d := range [...]string{"objects", "refs"} {
		if unix.Fstatat(fd, d, &st, 0) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return false
		}
	}
	return true
}

// isGitDirAt is isGitDir for the directory name in dirfd; it does not follow a symlink at name.
func isGitDirAt(dirfd int, name string) bool {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	return isGitDir(fd)
}

// hasMore reports whether queue still names a component other than "" or ".".
func hasMore(queue []string) bool {
	for _, c := range queue {
		if c != "" && c != "." {
			return true
		}
	}
	return false
}

func readlinkat(dirfd int, name string) (string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", err
	}
	if n >= len(buf) || n == 0 {
		return "", errors.New("symlink target empty or too long")
	}
	return string(buf[:n]), nil
}

func fileKind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFCHR, unix.S_IFBLK:
		return "device"
	case unix.S_IFSOCK:
		return "socket"
	}
	return "special file"
}
