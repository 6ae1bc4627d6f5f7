// Package jail builds the bubblewrap command every process Berth starts for a task or an image
// runs in. One builder, four profiles (docs/security.md, "What a run can see"):
//
//   - Local: the host root read-only, Berth's data dir, the server user's home and the configured
//     masks hidden behind empty tmpfs, the workspace read-write at its real path, the git paths a run
//     needs to commit on its task branch, a private HOME and a private /tmp.
//   - Sandbox: an explicit minimal root (never the host /): /usr and a few /etc files read-only,
//     the image layer read-only at /opt/image, the workspace at /workspace, every capability
//     dropped, rlimits from the config.
//   - Setup: the sandbox profile with the image layer writable.
//   - Git: the explicit minimal root of the sandbox (fewer /etc files: no certificates or name
//     resolution) with the workspace and the git paths at their real paths and no network: where
//     Berth's own git commands that interpret what a run wrote (`git add`, `git status`, a rescue
//     snapshot) run, as the run user (package workspace).
//
// Every profile has its own pid namespace (when its first process exits, the kernel kills
// everything left in it, daemonized or not), dies with Berth (--die-with-parent) and runs in a new
// session (no TIOCSTI into Berth's terminal). Its network is the one bubblewrap starts in
// (Spec.Network: a workspace's own namespace, see package netns) or none but its own loopback.
//
// Who builds the mounts: when Berth runs as root, bubblewrap runs as root too (so it can open a
// data dir or a repository below directories others may not enter, such as /root) and the
// command drops to the run user inside the jail with setpriv, before anything of the run starts:
// no capabilities, no new privileges, no supplementary groups. When Berth is not root,
// bubblewrap runs as Berth in a user namespace of its own. Build is a pure function of its Spec,
// so what a jail promises is table-tested without running anything; jail_test.go then checks the
// promises on real bubblewrap.
package jail

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
)

// Profile names what a jailed process sees.
type Profile string

// The profiles of docs/security.md.
const (
	Local   Profile = "local"
	Sandbox Profile = "sandbox"
	Setup   Profile = "setup"
	Git     Profile = "git"
)

// ErrInvalid means a Spec cannot be turned into a jail (a relative path, a missing workspace, a
// mask that would hide the workspace itself…). Nothing was started.
var ErrInvalid = errors.New("invalid jail spec")

// ErrUnavailable means this host cannot build jails: bubblewrap (or util-linux's prlimit or
// setpriv) is missing, or the run user cannot be created. Runs on a contained environment are
// blocked as environment_unavailable with the fix in the error.
var ErrUnavailable = errors.New("jail unavailable")

// SandboxUID and SandboxGID are the ids a sandboxed process has inside its jail when Berth is not
// root (a user namespace maps them to Berth's uid). When Berth is root there is no such mapping:
// a sandboxed process is the run user itself (Spec.RunAs), inside as outside.
const (
	SandboxUID = 1000
	SandboxGID = 1000
)

// ImageDir is where the sandbox image layer appears; ImagePath is put first on PATH.
const (
	ImageDir       = "/opt/image"
	ImagePath      = "/opt/image/bin"
	SandboxWorkdir = "/workspace"
	sandboxHome    = "/tmp"
	sandboxPATH    = ImagePath + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	defaultPATH    = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// Bind is one host path made visible in the jail at Dst (Dst = Src when empty).
type Bind struct {
	Src string
	Dst string
}

func (b Bind) dst() string {
	if b.Dst == "" {
		return b.Src
	}
	return b.Dst
}

// GitAccess is what a local jail binds and sets so a run can commit on its task branch and
// nowhere else (package workspace, RunGit): the source's git dir read-only, the run's private
// admin dir, ref directory and object store read-write, and the variables that point git there.
type GitAccess struct {
	Store     string // the private store's host directory (handed to the run user)
	ReadOnly  []Bind
	ReadWrite []Bind
	Env       map[string]string
}

// Limits are the resource limits of a sandboxed command, applied as rlimits by util-linux's
// prlimit inside the jail (zero = no limit).
type Limits struct {
	MemoryMB int // RLIMIT_DATA: heap and private writable mappings
	PidsMax  int // RLIMIT_NPROC of the run user
}

// Identity is a host uid/gid.
type Identity struct {
	UID, GID int
}

// Spec is one command to run in a jail.
type Spec struct {
	Profile Profile
	// Bwrap is the absolute path of bubblewrap; Prlimit that of util-linux's prlimit (sandbox
	// limits only); Setpriv that of util-linux's setpriv (RunAs only).
	Bwrap   string
	Prlimit string
	Setpriv string
	// RunAs, when set, means bubblewrap starts as root and the command drops to this identity
	// inside the jail (setpriv: uid, gid, no supplementary groups, no capabilities, no new
	// privileges). Nil: bubblewrap runs unprivileged in a user namespace of its own.
	RunAs *Identity
	// Workspace is the absolute host path of the workspace root; it is the only read-write tree
	// besides Home, ReadWrite and /tmp. In the local and git profiles it appears at its real path,
	// in the sandbox profiles at /workspace.
	Workspace string
	// WorkspaceReadOnly binds the workspace read-only (a git status that must change nothing).
	WorkspaceReadOnly bool
	// Dir is the working directory, relative to the workspace root ("" = the root).
	Dir string
	// Home is the host directory bound read-write as HOME (local profile; kept per workspace
	// outside its tree, so tool caches survive between runs but never enter a commit).
	Home string
	// Masks are host paths hidden behind an empty tmpfs before the binds (local profile): the data
	// dir, the server user's home, the environment's configured mask paths, and directories on
	// the way to a bind that the run user may not enter (Host.Build adds those). A mask above the
	// workspace hides everything around it; the workspace bind re-exposes just the workspace.
	// Masks under /tmp are dropped: the jail's private /tmp already hides them.
	Masks []string
	// ReadOnly and ReadWrite are further binds, made after the masks (local and git profiles: the
	// git common dir read-only, the run's private git store read-write).
	ReadOnly  []Bind
	ReadWrite []Bind
	// Image is the host directory of the sandbox image layer, mounted at /opt/image (read-only in
	// the sandbox profile, read-write in setup).
	Image string
	// Network keeps the network namespace bubblewrap starts in (the workspace's own, package
	// netns); without it the jail has only its own loopback.
	Network bool
	// Env is the command's whole environment (PATH and HOME are set by the profile when absent).
	Env map[string]string
	// Command runs as /bin/sh -c Command.
	Command string
	// Limits apply in the sandbox profiles.
	Limits Limits
	// Passwd and Group are the /etc/passwd and /etc/group of the sandbox (generated, with the
	// sandbox user); Build fills defaults when empty.
	Passwd, Group []byte
	// Terminal means the command's stdio is a pty Berth made for this jail alone (a setup
	// session's shell): the jail then keeps bubblewrap's session (no --new-session), so the pty is
	// the shell's controlling terminal and a resize (TIOCSWINSZ on Berth's master) reaches the
	// shell's foreground job as SIGWINCH. TIOCSTI needs no guard there: the only reader of that
	// pty's input is the jail itself, so a pushed character can reach nothing outside it.
	// Commands of runs are never given a terminal and always get --new-session.
	Terminal bool
}

// Cmd is a jail ready to start: run Path with Args and Env, with Data[i] readable on file
// descriptor 3+i (bubblewrap copies them into the jail's /etc).
type Cmd struct {
	Path string
	Args []string
	Env  []string
	Data [][]byte
	// Dir is where bwrap itself starts (outside the jail): "/", so no host cwd leaks in.
	Dir string
	// RunAs is Spec.RunAs: bwrap itself then starts as root (Host.Command).
	RunAs *Identity
}

// Build turns a Spec into the bwrap command. It only computes: it reads no file and starts
// nothing, so every promise of a profile is visible in its argv.
func Build(s Spec) (Cmd, error) {
	if err := s.check(); err != nil {
		return Cmd{}, fmt.Errorf("build jail: %w", err)
	}
	a := argv{}
	a.add("--die-with-parent")
	if !s.Terminal {
		a.add("--new-session") // no TIOCSTI into a terminal Berth shares with anything outside
	}
	if s.RunAs == nil {
		a.add("--unshare-user")
	}
	a.add("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try")
	if !s.Network || s.Profile == Git {
		a.add("--unshare-net")
	}
	env := maps.Clone(s.Env)
	if env == nil {
		env = map[string]string{}
	}
	var data [][]byte
	var dir string
	switch s.Profile {
	case Local:
		masks := s.masks()
		a.add("--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc")
		// /tmp first: a mask or a bind below it is made in the private /tmp, not hidden by it.
		a.add("--perms", "1777", "--tmpfs", "/tmp")
		mk := dirMaker{roots: append([]string{"/tmp"}, masks...), made: map[string]bool{}}
		for _, m := range masks {
			mk.parents(&a, m) // a mask inside another one
			a.add("--tmpfs", m)
		}
		for _, b := range s.ReadOnly {
			mk.parents(&a, b.dst())
			a.add("--ro-bind", b.Src, b.dst())
		}
		mk.parents(&a, s.Workspace)
		a.add(bindFlag(s.WorkspaceReadOnly), s.Workspace, s.Workspace)
		for _, b := range s.ReadWrite {
			mk.parents(&a, b.dst())
			a.add("--bind", b.Src, b.dst())
		}
		if s.Home != "" {
			mk.parents(&a, s.Home)
			a.add("--bind", s.Home, s.Home)
			env["HOME"] = s.Home
		} else if env["HOME"] == "" {
			env["HOME"] = "/tmp"
		}
		// The masks go read-only once the binds inside them have their mount points, so a run
		// cannot even leave scratch files where Berth's data dir appears to be.
		for _, m := range masks {
			a.add("--remount-ro", m)
		}
		dir = filepath.Join(s.Workspace, s.Dir)
	case Sandbox, Setup, Git:
		if s.RunAs == nil {
			// As root, bubblewrap needs its capabilities until setpriv: it drops them all there.
			a.add("--uid", strconv.Itoa(SandboxUID), "--gid", strconv.Itoa(SandboxGID), "--cap-drop", "ALL")
		}
		a.add("--hostname", "berth-sandbox")
		a.add("--ro-bind", "/usr", "/usr")
		for _, l := range []string{"bin", "lib", "lib64", "sbin"} {
			a.add("--symlink", "usr/"+l, "/"+l)
		}
		etc := sandboxEtc
		if s.Profile == Git {
			etc = gitEtc
		}
		// /etc first, 0755, and its generated files 0644: made by bubblewrap as root, they would be
		// 0700 and 0600, and the run user could read none of what is bound there.
		a.add("--perms", "0755", "--dir", "/etc")
		for _, f := range etc {
			a.add("--ro-bind-try", f, f)
		}
		uid, gid := SandboxUID, SandboxGID
		if s.RunAs != nil {
			uid, gid = s.RunAs.UID, s.RunAs.GID
		}
		passwd, group := s.Passwd, s.Group
		if len(passwd) == 0 {
			passwd = []byte(fmt.Sprintf("root:x:0:0:root:/root:/usr/sbin/nologin\nberth:x:%d:%d:Berth sandbox:%s:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", uid, gid, sandboxHome))
		}
		if len(group) == 0 {
			group = []byte(fmt.Sprintf("root:x:0:\nberth:x:%d:\nnogroup:x:65534:\n", gid))
		}
		data = [][]byte{passwd, group}
		a.add("--perms", "0644", "--ro-bind-data", "3", "/etc/passwd", "--perms", "0644", "--ro-bind-data", "4", "/etc/group")
		a.add("--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp")
		if env["HOME"] == "" {
			env["HOME"] = sandboxHome
		}
		if s.Profile == Git {
			mk := dirMaker{roots: []string{"/"}, made: map[string]bool{"/tmp": true, "/usr": true, "/etc": true}}
			for _, b := range s.ReadOnly {
				mk.parents(&a, b.dst())
				a.add("--ro-bind", b.Src, b.dst())
			}
			mk.parents(&a, s.Workspace)
			a.add(bindFlag(s.WorkspaceReadOnly), s.Workspace, s.Workspace)
			for _, b := range s.ReadWrite {
				mk.parents(&a, b.dst())
				a.add("--bind", b.Src, b.dst())
			}
			if env["PATH"] == "" {
				env["PATH"] = defaultPATH
			}
			dir = filepath.Join(s.Workspace, s.Dir)
			break
		}
		mk := dirMaker{roots: []string{"/"}, made: map[string]bool{"/tmp": true, "/usr": true, "/etc": true}}
		for _, b := range s.ReadOnly {
			mk.parents(&a, b.dst())
			a.add("--ro-bind", b.Src, b.dst())
		}
		a.add("--perms", "0755", "--dir", "/opt")
		a.add(bindFlag(s.WorkspaceReadOnly), s.Workspace, SandboxWorkdir)
		if s.Profile == Setup {
			a.add("--bind", s.Image, ImageDir)
		} else {
			a.add("--ro-bind", s.Image, ImageDir)
		}
		env["PATH"] = sandboxPATH
		dir = filepath.Join(SandboxWorkdir, s.Dir)
	}
	if env["PATH"] == "" {
		env["PATH"] = defaultPATH
	}
	a.add("--chdir", dir)
	if s.RunAs != nil {
		// bubblewrap runs as root and hands root's capabilities to its child; setpriv is that
		// child, and it drops them all (permitted, effective, inheritable, ambient and the
		// bounding set) with the change to the run user, before the command starts.
		a.add("--")
		a.add(s.Setpriv, "--reuid="+strconv.Itoa(s.RunAs.UID), "--regid="+strconv.Itoa(s.RunAs.GID),
			"--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs")
	}
	a.add("--")
	if s.Profile != Local && s.Profile != Git && (s.Limits.MemoryMB > 0 || s.Limits.PidsMax > 0) {
		a.add(s.Prlimit, "--core=0")
		if s.Limits.MemoryMB > 0 {
			a.add("--data=" + strconv.FormatInt(int64(s.Limits.MemoryMB)<<20, 10))
		}
		if s.Limits.PidsMax > 0 {
			a.add("--nproc=" + strconv.Itoa(s.Limits.PidsMax))
		}
		a.add("--")
	}
	a.add("/bin/sh", "-c", s.Command)

	envList := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		envList = append(envList, k+"="+env[k])
	}
	return Cmd{Path: s.Bwrap, Args: append([]string{"bwrap"}, a...), Env: envList, Data: data, Dir: "/", RunAs: s.RunAs}, nil
}

func bindFlag(readOnly bool) string {
	if readOnly {
		return "--ro-bind"
	}
	return "--bind"
}

// masks are the local profile's masks: sorted (a mask inside another is made in the outer
// tmpfs, and remounted there), without duplicates, without those the private /tmp hides anyway.
func (s Spec) masks() []string {
	var out []string
	for _, m := range s.Masks {
		if !Within(m, "/tmp") {
			out = append(out, m)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// dirMaker creates, with mode 0755, the directories on the way to a mount point that lie inside
// a tmpfs of the jail (a mask, the private /tmp, the sandbox's own root). bubblewrap would make
// them itself, but when it runs as root it makes them 0700, which the run user cannot enter.
type dirMaker struct {
	roots []string // tmpfs mount points
	made  map[string]bool
}

func (m dirMaker) parents(a *argv, dst string) {
	var chain []string
	for d := filepath.Dir(dst); d != "/" && d != "."; d = filepath.Dir(d) {
		chain = append(chain, d)
	}
	slices.Reverse(chain)
	for _, d := range chain {
		if m.made[d] || !m.inside(d) {
			continue
		}
		m.made[d] = true
		a.add("--perms", "0755", "--dir", d)
	}
}

// inside reports whether d lies strictly below one of the tmpfs roots.
func (m dirMaker) inside(d string) bool {
	for _, r := range m.roots {
		if d != r && Within(d, r) {
			return true
		}
	}
	return false
}

// sandboxEtc are the host /etc files a sandbox may read: certificates, name resolution, and the
// alternatives links Debian's commands are installed through. Nothing with a secret.
var sandboxEtc = []string{
	"/etc/ssl", "/etc/ca-certificates", "/etc/ca-certificates.conf", "/etc/resolv.conf", "/etc/hosts",
	"/etc/nsswitch.conf", "/etc/host.conf", "/etc/localtime", "/etc/alternatives", "/etc/ld.so.cache",
	"/etc/ld.so.conf", "/etc/ld.so.conf.d",
}

// gitEtc are the host /etc files Berth's git jails read: the local time zone (commit dates), the
// loader's cache and the alternatives links. A git jail has no network, so no certificates or name
// resolution; every mount less is a shorter start (it is on the way to every run's checkout).
var gitEtc = []string{"/etc/localtime", "/etc/alternatives", "/etc/ld.so.cache"}

type argv []string

func (a *argv) add(s ...string) { *a = append(*a, s...) }
