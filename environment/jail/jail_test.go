package jail

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func localSpec() Spec {
	return Spec{Profile: Local, Bwrap: "/usr/bin/bwrap", Workspace: "/data/workspaces/ws-a", Home: "/data/homes/ws-a",
		Masks: []string{"/root", "/data"}, ReadOnly: []Bind{{Src: "/src/.git"}},
		ReadWrite: []Bind{{Src: "/data/run-git/ws-a/admin", Dst: "/src/.git/worktrees/ws-a"}},
		Env:       map[string]string{"BERTH_RUN_ID": "r1"}, Command: "make test"}
}

func sandboxSpec() Spec {
	return Spec{Profile: Sandbox, Bwrap: "/usr/bin/bwrap", Prlimit: "/usr/bin/prlimit", Workspace: "/data/workspaces/ws-b",
		Image: "/data/images/e1/1", Command: "true", Limits: Limits{MemoryMB: 256, PidsMax: 64}}
}

// index is where the sequence seq starts in args, or -1.
func index(args []string, seq ...string) int {
	for i := 0; i+len(seq) <= len(args); i++ {
		if slices.Equal(args[i:i+len(seq)], seq) {
			return i
		}
	}
	return -1
}

func TestBuildLocal(t *testing.T) {
	if c, _ := Build(func() Spec { s := localSpec(); s.Network = true; return s }()); index(c.Args, "--unshare-net") >= 0 {
		t.Error("a local jail with Network keeps the network it starts in")
	}
	c, err := Build(localSpec())
	if err != nil {
		t.Fatal(err)
	}
	a := c.Args
	for _, seq := range [][]string{
		{"--die-with-parent"}, {"--new-session"}, {"--unshare-pid"}, {"--unshare-user"},
		{"--ro-bind", "/", "/"}, {"--tmpfs", "/data"}, {"--tmpfs", "/root"}, {"--perms", "1777", "--tmpfs", "/tmp"},
		{"--ro-bind", "/src/.git", "/src/.git"}, {"--bind", "/data/workspaces/ws-a", "/data/workspaces/ws-a"},
		{"--bind", "/data/run-git/ws-a/admin", "/src/.git/worktrees/ws-a"}, {"--bind", "/data/homes/ws-a", "/data/homes/ws-a"},
		{"--remount-ro", "/data"}, {"--chdir", "/data/workspaces/ws-a"}, {"/bin/sh", "-c", "make test"},
	} {
		if index(a, seq...) < 0 {
			t.Errorf("argv lacks %q: %q", seq, a)
		}
	}
	// Order carries the promises: / first, then the masks, then the binds that re-expose parts.
	order := []int{index(a, "--ro-bind", "/", "/"), index(a, "--tmpfs", "/data"), index(a, "--bind", "/data/workspaces/ws-a"),
		index(a, "--remount-ro", "/data"), index(a, "--")}
	if !slices.IsSorted(order) || slices.Contains(order, -1) {
		t.Errorf("argv order %v: %q", order, a)
	}
	if index(a, "--unshare-net") < 0 {
		t.Error("a local jail without Network has only its own loopback")
	}
	if !slices.Contains(c.Env, "HOME=/data/homes/ws-a") || !slices.Contains(c.Env, "BERTH_RUN_ID=r1") {
		t.Errorf("env %q", c.Env)
	}
	for _, arg := range a {
		if strings.Contains(arg, "BERTH_RUN_ID") {
			t.Errorf("a variable reached bwrap's argv (visible in ps): %q", arg)
		}
	}
}

func TestBuildSandbox(t *testing.T) {
	for _, p := range []Profile{Sandbox, Setup} {
		s := sandboxSpec()
		s.Profile = p
		c, err := Build(s)
		if err != nil {
			t.Fatal(err)
		}
		a := c.Args
		if index(a, "--ro-bind", "/", "/") >= 0 {
			t.Errorf("%s binds the host root: %q", p, a)
		}
		image := []string{"--ro-bind", "/data/images/e1/1", ImageDir}
		if p == Setup {
			image[0] = "--bind"
		}
		for _, seq := range [][]string{
			{"--unshare-net"}, {"--uid", "1000", "--gid", "1000"}, {"--cap-drop", "ALL"}, {"--ro-bind", "/usr", "/usr"},
			{"--bind", "/data/workspaces/ws-b", "/workspace"}, image, {"--chdir", "/workspace"},
			{"--perms", "0644", "--ro-bind-data", "3", "/etc/passwd"}, {"/usr/bin/prlimit", "--core=0", "--data=268435456", "--nproc=64", "--"},
			{"--perms", "0755", "--dir", "/etc"}, // readable by the run user (bubblewrap as root makes it 0700)
		} {
			if index(a, seq...) < 0 {
				t.Errorf("%s argv lacks %q: %q", p, seq, a)
			}
		}
		if len(c.Data) != 2 || !strings.Contains(string(c.Data[0]), "berth:x:1000:1000") {
			t.Errorf("%s data files %q", p, c.Data)
		}
		if !slices.Contains(c.Env, "PATH="+sandboxPATH) || !strings.HasPrefix(sandboxPATH, ImagePath+":") {
			t.Errorf("%s env %q", p, c.Env)
		}
	}
	s := sandboxSpec()
	s.Network = true
	if c, _ := Build(s); index(c.Args, "--unshare-net") >= 0 {
		t.Error("network: true still unshares the network")
	}
}

// TestBuildRunAs checks the shape of a jail when Berth is root: bubblewrap keeps no user
// namespace and builds the mounts itself, and the command drops to the run user through setpriv
// (no groups, no capabilities, no new privileges) before anything of the run starts.
func TestBuildRunAs(t *testing.T) {
	for _, s := range []Spec{localSpec(), sandboxSpec(), gitSpec()} {
		s.RunAs, s.Setpriv = &Identity{UID: 999, GID: 995}, "/usr/bin/setpriv"
		c, err := Build(s)
		if err != nil {
			t.Fatal(err)
		}
		a := c.Args
		if index(a, "--unshare-user") >= 0 || index(a, "--uid") >= 0 {
			t.Errorf("%s: a user namespace would map root: %q", s.Profile, a)
		}
		drop := index(a, "/usr/bin/setpriv", "--reuid=999", "--regid=995", "--clear-groups", "--inh-caps=-all",
			"--bounding-set=-all", "--no-new-privs", "--")
		if drop < 0 || drop > index(a, "/bin/sh") || c.RunAs == nil {
			t.Errorf("%s: no drop to the run user before the command: %q", s.Profile, a)
		}
		if s.Profile == Sandbox && !strings.Contains(string(c.Data[0]), "berth:x:999:995") {
			t.Errorf("sandbox passwd names another uid: %q", c.Data[0])
		}
	}
	s := localSpec()
	s.RunAs = &Identity{UID: 999, GID: 995}
	if _, err := Build(s); !errors.Is(err, ErrInvalid) {
		t.Errorf("a run identity without setpriv: %v", err)
	}
}

// TestBuildTmpAndMasks checks the mounts that make a jail work wherever the data dir is: the
// private /tmp comes before the masks (a data dir under /tmp is hidden by it, and its masks are
// dropped rather than remounted inside it), and directories on the way to a mount point inside
// a tmpfs are made 0755, so the run user can reach its workspace through them.
func TestBuildTmpAndMasks(t *testing.T) {
	s := localSpec()
	s.Workspace, s.Home = "/tmp/d/data/workspaces/ws-a", "/tmp/d/data/homes/ws-a"
	s.Masks = []string{"/tmp/d/data", "/root", "/root/.local/share/berth"}
	s.ReadWrite = nil
	c, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	a := c.Args
	if i := index(a, "--tmpfs", "/tmp/d/data"); i >= 0 {
		t.Errorf("a mask under /tmp is mounted inside the private /tmp: %q", a)
	}
	if index(a, "--remount-ro", "/tmp/d/data") >= 0 {
		t.Errorf("a mask under /tmp is remounted: %q", a)
	}
	order := []int{index(a, "--tmpfs", "/tmp"), index(a, "--tmpfs", "/root"), index(a, "--perms", "0755", "--dir", "/root/.local"),
		index(a, "--perms", "0755", "--dir", "/root/.local/share"), index(a, "--tmpfs", "/root/.local/share/berth"),
		index(a, "--perms", "0755", "--dir", "/tmp/d"), index(a, "--perms", "0755", "--dir", "/tmp/d/data/workspaces"),
		index(a, "--bind", "/tmp/d/data/workspaces/ws-a", "/tmp/d/data/workspaces/ws-a")}
	if !slices.IsSorted(order) || slices.Contains(order, -1) {
		t.Errorf("argv order %v: %q", order, a)
	}
}

func gitSpec() Spec {
	return Spec{Profile: Git, Bwrap: "/usr/bin/bwrap", Workspace: "/data/workspaces/ws-c", ReadOnly: []Bind{{Src: "/src/.git"}},
		ReadWrite: []Bind{{Src: "/data/run-git/ws-c/repo/objects"}}, Command: "git add -A", Network: true}
}

// TestBuildGit checks the git profile: an explicit root like the sandbox's, the workspace and
// the git paths at their real paths, never a network (whatever Network says).
func TestBuildGit(t *testing.T) {
	c, err := Build(gitSpec())
	if err != nil {
		t.Fatal(err)
	}
	a := c.Args
	if index(a, "--ro-bind", "/", "/") >= 0 || index(a, "--unshare-net") < 0 || index(a, "--uid", "1000") < 0 {
		t.Errorf("git argv: %q", a)
	}
	for _, seq := range [][]string{{"--ro-bind", "/usr", "/usr"}, {"--perms", "0755", "--dir", "/src"},
		{"--ro-bind", "/src/.git", "/src/.git"}, {"--bind", "/data/workspaces/ws-c", "/data/workspaces/ws-c"},
		{"--perms", "0755", "--dir", "/data/run-git/ws-c/repo"}, {"--chdir", "/data/workspaces/ws-c"}} {
		if index(a, seq...) < 0 {
			t.Errorf("git argv lacks %q: %q", seq, a)
		}
	}
	if i := index(a, "--perms", "0755", "--dir", "/etc"); i < 0 || i > index(a, "--ro-bind-try", "/etc/localtime", "/etc/localtime") {
		t.Errorf("git argv does not make /etc 0755 before binding into it: %q", a)
	}
	// Only what git reads of /etc: no certificates or name resolution in a jail without a network.
	for _, f := range []string{"/etc/localtime", "/etc/ld.so.cache"} {
		if index(a, "--ro-bind-try", f, f) < 0 {
			t.Errorf("git argv lacks %s: %q", f, a)
		}
	}
	for _, f := range []string{"/etc/ssl", "/etc/ca-certificates", "/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf"} {
		if index(a, "--ro-bind-try", f, f) >= 0 {
			t.Errorf("git argv binds %s: %q", f, a)
		}
	}
	s := gitSpec()
	s.WorkspaceReadOnly = true
	if c, _ := Build(s); index(c.Args, "--ro-bind", "/data/workspaces/ws-c", "/data/workspaces/ws-c") < 0 {
		t.Errorf("read-only workspace: %q", c.Args)
	}
	for _, dst := range []string{"/usr/bin", "/etc/ssl", "/proc/1", "/dev", "/dev/pts", "/dev/shm"} {
		s = gitSpec()
		s.ReadWrite = []Bind{{Src: "/x", Dst: dst}}
		if _, err := Build(s); !errors.Is(err, ErrInvalid) {
			t.Errorf("a bind over %s: %v", dst, err)
		}
	}
	// A data dir on the tmpfs at /dev/shm: its git paths are binds below the jail's own /dev/shm.
	s = gitSpec()
	s.Workspace, s.ReadWrite = "/dev/shm/berth/workspaces/ws-c", []Bind{{Src: "/dev/shm/berth/run-git/ws-c/repo/objects"}}
	if _, err := Build(s); err != nil {
		t.Errorf("a data dir under /dev/shm: %v", err)
	}
}

func TestBuildRefuses(t *testing.T) {
	cases := map[string]func(*Spec){
		"unknown profile":    func(s *Spec) { s.Profile = "host" },
		"relative bwrap":     func(s *Spec) { s.Bwrap = "bwrap" },
		"root workspace":     func(s *Spec) { s.Workspace = "/" },
		"relative workspace": func(s *Spec) { s.Workspace = "ws" },
		"unclean workspace":  func(s *Spec) { s.Workspace = "/data/../etc" },
		"escaping dir":       func(s *Spec) { s.Dir = "../other" },
		"empty command":      func(s *Spec) { s.Command = " " },
		"NUL in command":     func(s *Spec) { s.Command = "a\x00b" },
		"bad env name":       func(s *Spec) { s.Env = map[string]string{"A=B": "x"} },
		"mask of /":          func(s *Spec) { s.Masks = []string{"/"} },
		"mask = workspace":   func(s *Spec) { s.Masks = []string{s.Workspace} },
		"relative bind":      func(s *Spec) { s.ReadWrite = []Bind{{Src: "x"}} },
		"relative home":      func(s *Spec) { s.Home = "home" },
		"sandbox w/o image":  func(s *Spec) { *s = sandboxSpec(); s.Image = "" },
		"limits w/o prlimit": func(s *Spec) { *s = sandboxSpec(); s.Prlimit = "" },
		"negative limit":     func(s *Spec) { *s = sandboxSpec(); s.Limits.PidsMax = -1 },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			s := localSpec()
			mutate(&s)
			if _, err := Build(s); !errors.Is(err, ErrInvalid) {
				t.Fatalf("Build = %v, want ErrInvalid", err)
			}
		})
	}
}

// TestBuildTerminal: only a Terminal spec (a setup shell on a pty Berth made for it) keeps the
// session; every other jail gets --new-session.
func TestBuildTerminal(t *testing.T) {
	for _, term := range []bool{false, true} {
		s := sandboxSpec()
		s.Profile, s.Terminal = Setup, term
		c, err := Build(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := index(c.Args, "--new-session") >= 0; got == term {
			t.Errorf("Terminal=%t: --new-session present=%t: %q", term, got, c.Args)
		}
	}
}
