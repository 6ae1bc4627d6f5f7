package jail

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
)

// RunUser is the unprivileged host user jailed processes run as when Berth runs as root.
const RunUser = "berth-run"

// Identity is a host uid/gid.
type Identity struct {
	UID, GID int
}

// Host is what this machine offers jails: where bubblewrap and prlimit are, and the host identity
// jailed processes run as (nil: Berth's own, when Berth is not root).
type Host struct {
	Bwrap    string
	Prlimit  string
	Identity *Identity
}

// Fix is the advice an ErrUnavailable carries for administrators.
const Fix = "install bubblewrap on every Berth node (Debian/Ubuntu: apt-get install bubblewrap)"

// Detect finds bubblewrap and prlimit and, when Berth runs as root, the berth-run user (created
// with useradd on first use: a system user without a home or a login shell). It answers
// ErrUnavailable with the fix when something is missing.
func Detect(ctx context.Context) (Host, error) {
	var h Host
	var err error
	if h.Bwrap, err = lookTool("bwrap"); err != nil {
		return Host{}, fmt.Errorf("jail: bubblewrap is not installed (%s): %w", Fix, ErrUnavailable)
	}
	if h.Prlimit, err = lookTool("prlimit"); err != nil {
		return Host{}, fmt.Errorf("jail: prlimit is not installed (apt-get install util-linux): %w", ErrUnavailable)
	}
	if os.Geteuid() != 0 {
		return h, nil
	}
	id, err := runUser(ctx)
	if err != nil {
		return Host{}, err
	}
	h.Identity = &id
	return h, nil
}

func lookTool(name string) (string, error) {
	for _, dir := range []string{"/usr/bin", "/bin", "/usr/local/bin", "/usr/sbin", "/sbin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return exec.LookPath(name)
}

// runUser looks the run user up, creating it when it does not exist.
func runUser(ctx context.Context) (Identity, error) {
	u, err := user.Lookup(RunUser)
	if err != nil {
		var unknown user.UnknownUserError
		if !errors.As(err, &unknown) {
			return Identity{}, fmt.Errorf("jail: look up %s: %v: %w", RunUser, err, ErrUnavailable)
		}
		out, err := exec.CommandContext(ctx, "useradd", "--system", "--user-group", "--no-create-home",
			"--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", RunUser).CombinedOutput()
		if err != nil {
			// A concurrent Berth process may have created it first.
			if u, err2 := user.Lookup(RunUser); err2 == nil {
				return identityOf(u)
			}
			return Identity{}, fmt.Errorf("jail: create the %s user: %v: %s: %w", RunUser, err, out, ErrUnavailable)
		}
		if u, err = user.Lookup(RunUser); err != nil {
			return Identity{}, fmt.Errorf("jail: look up %s: %v: %w", RunUser, err, ErrUnavailable)
		}
	}
	return identityOf(u)
}

func identityOf(u *user.User) (Identity, error) {
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil || uid == 0 {
		return Identity{}, fmt.Errorf("jail: %s has unusable ids %s/%s: %w", RunUser, u.Uid, u.Gid, ErrUnavailable)
	}
	return Identity{UID: uid, GID: gid}, nil
}

// Command makes the exec.Cmd of a built jail: bwrap in a new session (its own process group),
// killed with Berth (Pdeathsig; bwrap's --die-with-parent does the same for the jail), started as
// h.Identity when set, with the jail's data files on fds 3…. The caller sets Stdin/Stdout/Stderr.
// The returned func closes Berth's ends of the data pipes once the command has started.
func (h Host) Command(c Cmd) (*exec.Cmd, func(), error) {
	cmd := &exec.Cmd{Path: c.Path, Args: c.Args, Env: c.Env, Dir: c.Dir}
	attr := &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if h.Identity != nil {
		attr.Credential = &syscall.Credential{Uid: uint32(h.Identity.UID), Gid: uint32(h.Identity.GID), Groups: []uint32{}}
	}
	cmd.SysProcAttr = attr
	var readers []*os.File
	closeAll := func() {
		for _, r := range readers {
			r.Close()
		}
	}
	for _, d := range c.Data {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("jail data pipe: %w", err)
		}
		// The files are small (passwd, group): they fit the pipe buffer, so the write never blocks.
		_, werr := w.Write(d)
		w.Close()
		if werr != nil {
			r.Close()
			closeAll()
			return nil, nil, fmt.Errorf("jail data pipe: %w", werr)
		}
		readers = append(readers, r)
	}
	cmd.ExtraFiles = readers
	return cmd, closeAll, nil
}

// HandOver makes the run user the owner of every file under root (not following symlinks), so a
// jailed run can write its workspace and HOME. It is nothing to do when Berth is not root, and
// cheap when root already belongs to the run user. Symlinks and hard-linked files are changed on
// the link itself only (Lchown), never through it.
func (h Host) HandOver(root string) error {
	if h.Identity == nil || !absClean(root) || root == "/" {
		return nil
	}
	return chownTree(root, h.Identity.UID, h.Identity.GID)
}

// HandBack gives the tree back to Berth's own uid (root) once no run holds it.
func (h Host) HandBack(root string) error {
	if h.Identity == nil || !absClean(root) || root == "/" {
		return nil
	}
	return chownTree(root, os.Geteuid(), os.Getegid())
}

func chownTree(root string, uid, gid int) error {
	fi, err := os.Lstat(root)
	if err != nil {
		return fmt.Errorf("hand over: %w", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) == uid && int(st.Gid) == gid {
		return nil // already there: the root changes hands last, so the whole tree did before it
	}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		return os.Lchown(p, uid, gid)
	})
	if err == nil {
		err = os.Lchown(root, uid, gid)
	}
	if err != nil {
		return fmt.Errorf("hand over: %w", err)
	}
	return nil
}

// GrantTraverse lets the run user's group pass through dir (mode 0710, group = the run user's
// group) without listing it, so bubblewrap, started as the run user, can reach the workspaces and
// git stores below a private data dir. Nothing to do when Berth is not root.
func (h Host) GrantTraverse(dir string) error {
	if h.Identity == nil {
		return nil
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("grant traverse: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("grant traverse: no ownership information")
	}
	if int(st.Gid) != h.Identity.GID && fi.Mode().Perm()&0o001 == 0 {
		if err := os.Chown(dir, int(st.Uid), h.Identity.GID); err != nil {
			return fmt.Errorf("grant traverse: %w", err)
		}
	}
	if fi.Mode().Perm()&0o011 == 0 {
		if err := os.Chmod(dir, fi.Mode().Perm()|0o010); err != nil {
			return fmt.Errorf("grant traverse: %w", err)
		}
	}
	return nil
}

// Reachable reports whether the run user can traverse every directory from / down to p (the bind
// sources bubblewrap opens as that user), so a refusal can name the fix before a run fails.
func (h Host) Reachable(p string) bool {
	if h.Identity == nil {
		return true
	}
	for dir := filepath.Dir(p); ; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err != nil {
			return false
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return false
		}
		perm := fi.Mode().Perm()
		switch {
		case int(st.Uid) == h.Identity.UID:
			if perm&0o100 == 0 {
				return false
			}
		case int(st.Gid) == h.Identity.GID:
			if perm&0o010 == 0 {
				return false
			}
		default:
			if perm&0o001 == 0 {
				return false
			}
		}
		if dir == "/" {
			return true
		}
	}
}

// Prepare readies the host for one jail of s when Berth is root: the trees the run writes (the
// workspace, HOME and the given private stores) are handed to the run user, and the directories
// inside within (Berth's data dir) that lead to a bind source are made traversable for it. It
// fails with ErrUnavailable, naming the fix, when the run user still cannot reach a source.
func (h Host) Prepare(s Spec, within string, owned ...string) error {
	if h.Identity == nil {
		return nil
	}
	if err := s.check(); err != nil {
		return err
	}
	// Only trees Berth made below its data dir change hands: never a user's directory (a shared
	// workspace is the user's own checkout), never anything above the data dir.
	for _, p := range append([]string{s.Workspace, s.Home}, owned...) {
		if p == "" || within == "" || p == within || !Within(p, within) {
			continue
		}
		if err := h.HandOver(p); err != nil {
			return err
		}
	}
	srcs := []string{s.Workspace}
	if s.Home != "" {
		srcs = append(srcs, s.Home)
	}
	if s.Image != "" {
		srcs = append(srcs, s.Image)
	}
	for _, b := range append(slices.Clone(s.ReadOnly), s.ReadWrite...) {
		srcs = append(srcs, b.Src)
	}
	for _, src := range srcs {
		if within != "" {
			for dir := filepath.Dir(src); Within(dir, within); dir = filepath.Dir(dir) {
				if err := h.GrantTraverse(dir); err != nil {
					return err
				}
				if dir == within {
					break
				}
			}
		}
		if !h.Reachable(src) {
			return fmt.Errorf("jail: the %s user cannot reach a directory the run needs (the data dir or the source repository sits below a directory other users may not enter, such as /root; move it, or let others traverse its parents with chmod o+x): %w", RunUser, ErrUnavailable)
		}
	}
	return nil
}
