// Package jail builds the bubblewrap command every process Berth starts for a task or an image runs
// in. One builder, three profiles (docs/security.md, "What a run can see"):
//
//   - Local: the host root read-only, Berth's data dir, the server user's home and the configured
//     masks hidden behind empty tmpfs, the workspace read-write at its real path, the git paths a run
//     needs to commit on its task branch, a private HOME and a private /tmp; host network.
//   - Sandbox: an explicit minimal root (never the host /): /usr and a few /etc files read-only,
//     the image layer read-only at /opt/image, the workspace at /workspace, network off unless
//     configured, uid/gid 1000 inside with every capability dropped, rlimits from the config.
//   - Setup: the sandbox profile with the image layer writable.
//
// Every profile has its own pid namespace (when its first process exits, the kernel kills
// everything left in it, daemonized or not), dies with Berth (--die-with-parent) and runs in a new
// session (no TIOCSTI into Berth's terminal). Build is a pure function of its Spec, so what a jail
// promises is table-tested without running anything; jail_test.go then checks the promises on real
// bubblewrap.
package jail

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Profile names what a jailed process sees.
type Profile string

// The profiles of docs/security.md.
const (
	Local   Profile = "local"
	Sandbox Profile = "sandbox"
	Setup   Profile = "setup"
)

// ErrInvalid means a Spec cannot be turned into a jail (a relative path, a missing workspace, a
// mask that would hide the workspace itself…). Nothing was started.
var ErrInvalid = errors.New("invalid jail spec")

// ErrUnavailable means this host cannot build jails: bubblewrap (or util-linux's prlimit) is
// missing, or the run user cannot be created. Runs on a contained environment are blocked as
// environment_unavailable with the fix in the error.
var ErrUnavailable = errors.New("jail unavailable")

// SandboxUID and SandboxGID are the ids a sandboxed process has inside its jail.
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

// Spec is one command to run in a jail.
type Spec struct {
	Profile Profile
	// Bwrap is the absolute path of bubblewrap; Prlimit that of util-linux's prlimit (sandbox
	// limits only).
	Bwrap   string
	Prlimit string
	// Workspace is the absolute host path of the workspace root; it is the only read-write tree
	// besides Home, ReadWrite and /tmp. In the local profile it appears at its real path, in the
	// sandbox profiles at /workspace.
	Workspace string
	// Dir is the working directory, relative to the workspace root ("" = the root).
	Dir string
	// Home is the host directory bound read-write as HOME (local profile; kept per workspace
	// outside its tree, so tool caches survive between runs but never enter a commit).
	Home string
	// Masks are host paths hidden behind an empty tmpfs before the binds (local profile): the data
	// dir, the server user's home, the environment's configured mask paths. A mask above the
	// workspace hides everything around it; the workspace bind re-exposes just the workspace.
	Masks []string
	// ReadOnly and ReadWrite are further binds, made after the masks (local profile: the git
	// common dir read-only, the run's private git store read-write).
	ReadOnly  []Bind
	ReadWrite []Bind
	// Image is the host directory of the sandbox image layer, mounted at /opt/image (read-only in
	// the sandbox profile, read-write in setup).
	Image string
	// Network shares the host network; without it the jail has only its own loopback.
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
}

// Build turns a Spec into the bwrap command. It only computes: it reads no file and starts
// nothing, so every promise of a profile is visible in its argv.
func Build(s Spec) (Cmd, error) {
	if err := s.check(); err != nil {
		return Cmd{}, fmt.Errorf("build jail: %w", err)
	}
	a := argv{}
	a.add("--die-with-parent", "--new-session", "--unshare-user", "--unshare-pid", "--unshare-ipc",
		"--unshare-uts", "--unshare-cgroup-try")
	network := s.Network || s.Profile == Local
	if !network {
		a.add("--unshare-net")
	}
	env := maps.Clone(s.Env)
	if env == nil {
		env = map[string]string{}
	}
	var data [][]byte
	var dir string
	// Parents first: a mask inside another is made in the outer tmpfs, and remounted there.
	s.Masks = slices.Clone(s.Masks)
	slices.Sort(s.Masks)
	s.Masks = slices.Compact(s.Masks)
	switch s.Profile {
	case Local:
		a.add("--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc")
		for _, m := range s.Masks {
			a.add("--tmpfs", m)
		}
		a.add("--perms", "1777", "--tmpfs", "/tmp")
		for _, b := range s.ReadOnly {
			a.add("--ro-bind", b.Src, b.dst())
		}
		a.add("--bind", s.Workspace, s.Workspace)
		for _, b := range s.ReadWrite {
			a.add("--bind", b.Src, b.dst())
		}
		if s.Home != "" {
			a.add("--bind", s.Home, s.Home)
			env["HOME"] = s.Home
		} else if env["HOME"] == "" {
			env["HOME"] = "/tmp"
		}
		// The masks go read-only once the binds inside them have their mount points, so a run
		// cannot even leave scratch files where Berth's data dir appears to be.
		for _, m := range s.Masks {
			a.add("--remount-ro", m)
		}
		dir = filepath.Join(s.Workspace, s.Dir)
	case Sandbox, Setup:
		a.add("--uid", strconv.Itoa(SandboxUID), "--gid", strconv.Itoa(SandboxGID), "--cap-drop", "ALL",
			"--hostname", "berth-sandbox")
		a.add("--ro-bind", "/usr", "/usr")
		for _, l := range []string{"bin", "lib", "lib64", "sbin"} {
			a.add("--symlink", "usr/"+l, "/"+l)
		}
		for _, f := range sandboxEtc {
			a.add("--ro-bind-try", f, f)
		}
		passwd, group := s.Passwd, s.Group
		if len(passwd) == 0 {
			passwd = []byte(fmt.Sprintf("root:x:0:0:root:/root:/usr/sbin/nologin\nberth:x:%d:%d:Berth sandbox:%s:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", SandboxUID, SandboxGID, sandboxHome))
		}
		if len(group) == 0 {
			group = []byte(fmt.Sprintf("root:x:0:\nberth:x:%d:\nnogroup:x:65534:\n", SandboxGID))
		}
		data = [][]byte{passwd, group}
		a.add("--ro-bind-data", "3", "/etc/passwd", "--ro-bind-data", "4", "/etc/group")
		a.add("--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp")
		a.add("--bind", s.Workspace, SandboxWorkdir)
		if s.Profile == Setup {
			a.add("--bind", s.Image, ImageDir)
		} else {
			a.add("--ro-bind", s.Image, ImageDir)
		}
		env["PATH"] = sandboxPATH
		if env["HOME"] == "" {
			env["HOME"] = sandboxHome
		}
		dir = filepath.Join(SandboxWorkdir, s.Dir)
	}
	if env["PATH"] == "" {
		env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	a.add("--chdir", dir, "--")
	if s.Profile != Local && (s.Limits.MemoryMB > 0 || s.Limits.PidsMax > 0) {
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
	return Cmd{Path: s.Bwrap, Args: append([]string{"bwrap"}, a...), Env: envList, Data: data, Dir: "/"}, nil
}

// sandboxEtc are the host /etc files a sandbox may read: certificates, name resolution, and the
// alternatives links Debian's commands are installed through. Nothing with a secret.
var sandboxEtc = []string{
	"/etc/ssl", "/etc/ca-certificates", "/etc/ca-certificates.conf", "/etc/resolv.conf", "/etc/hosts",
	"/etc/nsswitch.conf", "/etc/host.conf", "/etc/localtime", "/etc/alternatives", "/etc/ld.so.cache",
	"/etc/ld.so.conf", "/etc/ld.so.conf.d",
}

type argv []string

func (a *argv) add(s ...string) { *a = append(*a, s...) }

func (s Spec) check() error {
	switch s.Profile {
	case Local, Sandbox, Setup:
	default:
		return fmt.Errorf("unknown profile %q: %w", s.Profile, ErrInvalid)
	}
	if !absClean(s.Bwrap) {
		return fmt.Errorf("bwrap must be an absolute path: %w", ErrInvalid)
	}
	if !absClean(s.Workspace) || s.Workspace == "/" {
		return fmt.Errorf("workspace must be an absolute, clean path below /: %w", ErrInvalid)
	}
	if s.Dir != "" && (filepath.IsAbs(s.Dir) || !filepath.IsLocal(s.Dir)) {
		return fmt.Errorf("dir must be relative to the workspace and stay inside it: %w", ErrInvalid)
	}
	if strings.TrimSpace(s.Command) == "" || strings.ContainsRune(s.Command, 0) {
		return fmt.Errorf("command must be non-empty without NUL: %w", ErrInvalid)
	}
	for k, v := range s.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fmt.Errorf("env %q: names need no '=' or NUL, values no NUL: %w", k, ErrInvalid)
		}
	}
	switch s.Profile {
	case Local:
		if s.Home != "" && !absClean(s.Home) {
			return fmt.Errorf("home must be an absolute, clean path: %w", ErrInvalid)
		}
		for _, m := range s.Masks {
			if !absClean(m) || m == "/" {
				return fmt.Errorf("mask %q must be an absolute, clean path below /: %w", m, ErrInvalid)
			}
			if m == s.Workspace {
				return fmt.Errorf("a mask may not be the workspace itself: %w", ErrInvalid)
			}
		}
		for _, b := range append(slices.Clone(s.ReadOnly), s.ReadWrite...) {
			if !absClean(b.Src) || !absClean(b.dst()) {
				return fmt.Errorf("bind paths must be absolute and clean: %w", ErrInvalid)
			}
		}
	case Sandbox, Setup:
		if !absClean(s.Image) {
			return fmt.Errorf("image layer must be an absolute, clean path: %w", ErrInvalid)
		}
		if (s.Limits.MemoryMB > 0 || s.Limits.PidsMax > 0) && !absClean(s.Prlimit) {
			return fmt.Errorf("limits need prlimit's absolute path: %w", ErrInvalid)
		}
		if s.Limits.MemoryMB < 0 || s.Limits.PidsMax < 0 {
			return fmt.Errorf("limits must not be negative: %w", ErrInvalid)
		}
	}
	return nil
}

func absClean(p string) bool { return p != "" && filepath.IsAbs(p) && filepath.Clean(p) == p }

// Within reports whether p is dir or below it.
func Within(p, dir string) bool {
	if p == dir {
		return true
	}
	if dir == "/" {
		return strings.HasPrefix(p, "/")
	}
	return strings.HasPrefix(p, dir+"/")
}
