package jail

import (
	"context"
	"errors"
	"fmt"
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

// Host is what this machine offers jails: where bubblewrap, prlimit and setpriv are, and the
// host identity jailed processes run as (nil: Berth's own, when Berth is not root).
type Host struct {
	Bwrap    string
	Prlimit  string
	Setpriv  string
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
	if h.Setpriv, err = lookTool("setpriv"); err != nil {
		return Host{}, fmt.Errorf("jail: setpriv is not installed (apt-get install util-linux): %w", ErrUnavailable)
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

// Build completes s with this host's tools and identity and builds its jail (see the package
// doc): bubblewrap's path, prlimit's and setpriv's, the run user to drop to when Berth is root,
// and, for the local profile, a mask over every directory on the way to a bind that the run
// user may not enter (its contents were out of the run user's reach anyway; the binds below it
// are re-exposed through directories the jail makes).
func (h Host) Build(s Spec) (Cmd, error) {
	s.Bwrap, s.Prlimit, s.Setpriv, s.RunAs = h.Bwrap, h.Prlimit, h.Setpriv, h.Identity
	if s.Profile == Local && h.Identity != nil {
		s.Masks = append(slices.Clone(s.Masks), h.closedAncestors(s)...)
	}
	return Build(s)
}

// closedAncestors are the directories, outside the jail's own tmpfs mounts, on the way to a
// bind of s that the run user cannot traverse on this host (the highest one of each chain).
func (h Host) closedAncestors(s Spec) []string {
	dsts := []string{s.Workspace}
	if s.Home != "" {
		dsts = append(dsts, s.Home)
	}
	for _, b := range append(slices.Clone(s.ReadOnly), s.ReadWrite...) {
		dsts = append(dsts, b.dst())
	}
	covered := func(d string) bool {
		if Within(d, "/tmp") {
			return true
		}
		for _, m := range s.Masks {
			if Within(d, m) {
				return true
			}
		}
		return false
	}
	var out []string
	for _, dst := range dsts {
		var chain []string
		for d := filepath.Dir(dst); d != "/"; d = filepath.Dir(d) {
			chain = append(chain, d)
		}
		slices.Reverse(chain)
		for _, d := range chain {
			if covered(d) || slices.Contains(out, d) {
				break
			}
			if !h.traversable(d) {
				out = append(out, d)
				break
			}
		}
	}
	return out
}

// traversable reports whether the run user may enter dir (search permission by owner, group or
// others). Errors count as not traversable, and so a mask: the safe side.
func (h Host) traversable(dir string) bool {
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
		return perm&0o100 != 0
	case int(st.Gid) == h.Identity.GID:
		return perm&0o010 != 0
	}
	return perm&0o001 != 0
}

// Command makes the exec.Cmd of a built jail: bwrap in a new session (its own process group),
// killed with Berth (Pdeathsig; bwrap's --die-with-parent does the same for the jail), with the
// jail's data files on fds 3…. bwrap runs as Berth itself (root when the command drops to the run
// user inside, see Build). The caller sets Stdin/Stdout/Stderr. The returned func closes Berth's
// ends of the data pipes once the command has started.
func (h Host) Command(c Cmd) (*exec.Cmd, func(), error) {
	cmd := &exec.Cmd{Path: c.Path, Args: c.Args, Env: c.Env, Dir: c.Dir}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
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

// HandOver makes the run user the owner of every file under root, so a jailed run can write its
// workspace and HOME. It is nothing to do when Berth is not root, and cheap when root already
// belongs to the run user. The walk is on descriptors (tree.go): it never follows a symlink, not
// even one a live process of an earlier run swaps in for a directory mid-walk; symlinks change on
// the link itself, and files with several hard links are left alone.
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

// Prepare readies the host for one jail of s when Berth is root: the trees the run writes (the
// workspace, HOME and the given private stores) are handed to the run user, never following a
// symlink. Only trees Berth made below its data dir (within) change hands: never a user's
// directory (a shared workspace is the user's own checkout), never anything above the data dir,
// and no directory's mode changes (bubblewrap runs as root and reaches every bind source).
func (h Host) Prepare(s Spec, within string, owned ...string) error {
	if h.Identity == nil {
		return nil
	}
	for _, p := range append([]string{s.Workspace, s.Home}, owned...) {
		if p == "" || within == "" || p == within || !Within(p, within) {
			continue
		}
		if err := h.HandOver(p); err != nil {
			return err
		}
	}
	return nil
}

// SandboxUser is the uid and gid a sandboxed process has inside its jail on this host: the run
// user itself when Berth is root, else SandboxUID and SandboxGID of the jail's user namespace.
func (h Host) SandboxUser() Identity {
	if h.Identity != nil {
		return *h.Identity
	}
	return Identity{UID: SandboxUID, GID: SandboxGID}
}
