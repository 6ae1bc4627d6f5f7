package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"berth/db/pgembed"
	"berth/environment/jail"
)

// checkLevel says how much a doctor check matters when it does not hold.
type checkLevel int

const (
	levelOK   checkLevel = iota // holds
	levelInfo                   // a fact worth knowing (e.g. what limits fall back to)
	levelWarn                   // an optional part is missing: a feature or the tests of one are off
	levelFail                   // a required part is missing: Berth cannot run tasks
)

// doctorCheck is one thing `berth doctor` looked at: what it found and, when it does not hold,
// how to fix it.
type doctorCheck struct {
	Name   string
	Level  checkLevel
	Detail string
	Fix    string
}

// doctor is what the checks look at: the environment, the data dir, and where tools are searched
// (the system directories Berth's jail uses first, then $PATH).
type doctor struct {
	getenv   func(string) string
	dataDir  string
	euid     int
	toolDirs []string
}

// systemToolDirs are searched before $PATH, as environment/jail does.
var systemToolDirs = []string{"/usr/bin", "/bin", "/usr/local/bin", "/usr/sbin", "/sbin"}

// doctorCmd runs every check, prints them (with --quiet only those that do not hold) and fails
// when a required one does not hold.
func doctorCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flagSet("doctor", stderr)
	c := baseConfig(fs, getenv)
	quiet := fs.Bool("quiet", false, "print only the checks that do not hold (make run uses this)")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if err := c.finish(getenv, ""); err != nil {
		return err
	}
	d := doctor{getenv: getenv, dataDir: c.DataDir, euid: os.Geteuid(), toolDirs: systemToolDirs}
	checks := d.run(ctx)
	return report(stdout, checks, *quiet)
}

// run is every check, in the order an administrator would fix them.
func (d doctor) run(ctx context.Context) []doctorCheck {
	bwrap := d.bubblewrap(ctx)
	out := []doctorCheck{bwrap.doctorCheck}
	out = append(out, d.namespaces(ctx, bwrap.path)...)
	out = append(out, d.jailTools(), d.runUser(), d.postgres(ctx), d.dataDirCheck(), cgroupCheck("/sys/fs/cgroup"),
		d.optionalTool(ctx, "sshd", []string{"-V"}, "ssh environments' tests (a real sshd on loopback)",
			"apt-get install openssh-server (only the ssh driver's tests need it; ssh environments reach other hosts)"),
		d.optionalTool(ctx, "node", []string{"--version"}, "JavaScript previews (npm and dev servers in workspaces)",
			"apt-get install nodejs npm (only workspaces whose services run Node need it)"))
	return out
}

// report prints checks and answers an error naming the required ones that failed.
func report(w io.Writer, checks []doctorCheck, quiet bool) error {
	var failed []string
	words := map[checkLevel]string{levelOK: "ok", levelInfo: "info", levelWarn: "warn", levelFail: "FAIL"}
	for _, c := range checks {
		if c.Level == levelFail {
			failed = append(failed, c.Name)
		}
		if quiet && c.Level < levelWarn {
			continue
		}
		fmt.Fprintf(w, "%-5s %-18s %s\n", words[c.Level], c.Name, c.Detail)
		if c.Fix != "" && c.Level >= levelInfo {
			label := "fix:"
			if c.Level == levelInfo {
				label = "note:"
			}
			fmt.Fprintf(w, "      %-18s %s %s\n", "", label, c.Fix)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("doctor: required checks failed: %s", strings.Join(failed, ", "))
	}
	if !quiet {
		fmt.Fprintln(w, "berth doctor: everything Berth needs is here")
	}
	return nil
}

// look finds an executable as the jail does: the system directories first, then $PATH.
func (d doctor) look(name string) (string, bool) {
	dirs := append([]string{}, d.toolDirs...)
	dirs = append(dirs, filepath.SplitList(d.getenv("PATH"))...)
	for _, dir := range dirs {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}

// output runs a program for at most 10 s and answers its combined output on one line.
func output(ctx context.Context, path string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var b bytes.Buffer
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	line := strings.Join(strings.Fields(b.String()), " ")
	if len(line) > 300 {
		line = line[:300] + "…"
	}
	return line, err
}

// bwrapCheck is the bubblewrap check and the path it found ("" when missing).
type bwrapCheck struct {
	doctorCheck
	path string
}

func (d doctor) bubblewrap(ctx context.Context) bwrapCheck {
	c := bwrapCheck{doctorCheck: doctorCheck{Name: "bubblewrap"}}
	p, ok := d.look("bwrap")
	if !ok {
		c.Level, c.Detail = levelFail, "not installed: every task command runs in a bubblewrap jail, so runs are refused"
		c.Fix = "apt-get install bubblewrap (0.8 or newer)"
		return c
	}
	v, err := output(ctx, p, "--version")
	if err != nil {
		c.Level, c.Detail, c.Fix = levelFail, p+" does not run: "+v, "reinstall bubblewrap (apt-get install --reinstall bubblewrap)"
		return c
	}
	c.path, c.Level, c.Detail = p, levelOK, v+" at "+p
	return c
}

// namespaces starts real jails: all namespaces at once (what every run needs), and on failure
// the user and network namespaces alone, to say which one the host refuses.
func (d doctor) namespaces(ctx context.Context, bwrap string) []doctorCheck {
	if bwrap == "" {
		return []doctorCheck{{Name: "namespaces", Level: levelFail, Detail: "not checked: bubblewrap is missing",
			Fix: "install bubblewrap, then run berth doctor again"}}
	}
	base := []string{"--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"}
	try := func(unshare ...string) (string, error) {
		return output(ctx, bwrap, append(append(unshare, base...), "/bin/true")...)
	}
	if _, err := try("--unshare-all"); err == nil {
		return []doctorCheck{{Name: "namespaces", Level: levelOK,
			Detail: "a jail with its own user, pid, mount, ipc, uts and network namespaces starts"}}
	}
	out := []doctorCheck{}
	for _, ns := range []struct{ name, flag, fix string }{
		{"user namespaces", "--unshare-user", "sysctl -w user.max_user_namespaces=15000 (and kernel.unprivileged_userns_clone=1 where it exists); in a container, allow unshare (e.g. --security-opt seccomp=unconfined or --privileged)"},
		{"network namespaces", "--unshare-net", "allow CLONE_NEWNET (in a container: --cap-add SYS_ADMIN or --privileged); jails need their own network namespace"},
	} {
		if msg, err := try(ns.flag); err != nil {
			out = append(out, doctorCheck{Name: ns.name, Level: levelFail, Detail: "bubblewrap cannot make one: " + msg, Fix: ns.fix})
		} else {
			out = append(out, doctorCheck{Name: ns.name, Level: levelOK, Detail: "usable"})
		}
	}
	msg, _ := try("--unshare-all")
	out = append(out, doctorCheck{Name: "namespaces", Level: levelFail, Detail: "a full jail does not start: " + msg,
		Fix: "make the namespaces above usable; bubblewrap's message says which mount or namespace it refused"})
	return out
}

// jailTools are util-linux's prlimit (sandbox limits) and, as root, setpriv (the drop to the run
// user inside the jail).
func (d doctor) jailTools() doctorCheck {
	c := doctorCheck{Name: "jail tools", Level: levelOK}
	need := []string{"prlimit"}
	if d.euid == 0 {
		need = append(need, "setpriv")
	}
	var missing, found []string
	for _, n := range need {
		if p, ok := d.look(n); ok {
			found = append(found, p)
		} else {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		c.Level, c.Detail, c.Fix = levelFail, "missing: "+strings.Join(missing, ", "), "apt-get install util-linux"
		return c
	}
	c.Detail = strings.Join(found, ", ")
	return c
}

// runUser is berth-run, the user jailed commands run as when Berth is root.
func (d doctor) runUser() doctorCheck {
	c := doctorCheck{Name: "run user"}
	if d.euid != 0 {
		c.Level, c.Detail = levelOK, fmt.Sprintf("Berth is not root: jailed commands run as you (uid %d)", d.euid)
		return c
	}
	if id, err := lookupUser(jailRunUser); err == nil {
		c.Level, c.Detail = levelOK, fmt.Sprintf("%s exists (uid %s): commands drop to it inside the jail", jailRunUser, id)
		return c
	}
	if _, ok := d.look("useradd"); ok {
		c.Level, c.Detail = levelInfo, jailRunUser+" does not exist yet: the first berth serve creates it (useradd --system)"
		return c
	}
	c.Level, c.Detail = levelFail, jailRunUser+" does not exist and useradd is missing"
	c.Fix = "useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin " + jailRunUser
	return c
}

// postgres is the embedded cluster's server programs (not needed with DATABASE_URL).
func (d doctor) postgres(ctx context.Context) doctorCheck {
	c := doctorCheck{Name: "PostgreSQL"}
	if d.getenv("DATABASE_URL") != "" {
		c.Level, c.Detail = levelOK, "DATABASE_URL is set: Berth uses that server (15 or newer), not an embedded cluster"
		return c
	}
	dir, err := findPostgres(ctx)
	if err != nil {
		c.Level, c.Detail = levelFail, "no server programs (initdb, postgres) for the embedded cluster"
		c.Fix = "apt-get install postgresql-15 (or newer), or set DATABASE_URL to a PostgreSQL 15+ database"
		return c
	}
	v, _ := output(ctx, filepath.Join(dir, "postgres"), "--version")
	c.Level, c.Detail = levelOK, v+" in "+dir
	return c
}

// dataDirCheck is the data dir: where it is, who may enter it, and the free space under it.
func (d doctor) dataDirCheck() doctorCheck {
	c := doctorCheck{Name: "data dir", Level: levelOK}
	dir := d.dataDir
	existing := dir
	for {
		if _, err := os.Stat(existing); err == nil || existing == "/" {
			break
		}
		existing = filepath.Dir(existing)
	}
	fi, err := os.Stat(existing)
	if err != nil || !fi.IsDir() {
		c.Level, c.Detail, c.Fix = levelFail, dir+": "+existing+" is not a directory", "set BERTH_DATA_DIR to a directory path"
		return c
	}
	if existing != dir {
		if syscall.Access(existing, 0o3) != nil { // W_OK|X_OK: it can be made here
			c.Level, c.Detail = levelFail, dir+" does not exist and "+existing+" is not writable"
			c.Fix = "create it (mkdir -p -m 0700 " + dir + ") or set BERTH_DATA_DIR to a writable place"
			return c
		}
		c.Detail = dir + " (created 0700 on first start)"
	} else {
		if syscall.Access(dir, 0o7) != nil {
			c.Level, c.Detail, c.Fix = levelFail, dir+" is not readable and writable by this user", "chown it to the user Berth runs as"
			return c
		}
		c.Detail = fmt.Sprintf("%s (mode %04o)", dir, fi.Mode().Perm())
		if fi.Mode().Perm()&0o077 != 0 {
			c.Level, c.Fix = levelWarn, "chmod 0700 "+dir+" (it holds the database and the key that seals secrets)"
		}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(existing, &st); err == nil {
		free := st.Bavail * uint64(st.Bsize)
		c.Detail += fmt.Sprintf("; %s free", humanBytes(free))
		switch {
		case free < 256<<20:
			c.Level, c.Fix = levelFail, "free space under the data dir (workspaces, logs and the database grow there) or move BERTH_DATA_DIR"
		case free < 2<<30 && c.Level < levelWarn:
			c.Level, c.Fix = levelWarn, "less than 2 GiB free: workspaces and the database will fill it soon"
		}
	}
	return c
}

// cgroupCheck says whether cgroup v2 is mounted and delegated, and what sandbox limits are.
func cgroupCheck(root string) doctorCheck {
	c := doctorCheck{Name: "cgroup v2", Level: levelInfo,
		Fix: "memory and process limits are rlimits set by prlimit inside the jail (RLIMIT_DATA per process, RLIMIT_NPROC for the run user)"}
	ctrl, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		c.Detail = "not mounted (cgroup v1 or none): sandbox limits are per-process rlimits, not a cgroup budget"
		return c
	}
	sub, _ := os.ReadFile(filepath.Join(root, "cgroup.subtree_control"))
	delegated := syscall.Access(filepath.Join(root, "cgroup.subtree_control"), 0o2) == nil
	c.Detail = fmt.Sprintf("mounted (controllers: %s; enabled for children: %s; delegated to this user: %t); Berth does not use it yet",
		strings.TrimSpace(string(ctrl)), orNone(strings.TrimSpace(string(sub))), delegated)
	return c
}

// optionalTool is a program only some features (or their tests) need.
func (d doctor) optionalTool(ctx context.Context, name string, versionArgs []string, what, fix string) doctorCheck {
	c := doctorCheck{Name: name}
	p, ok := d.look(name)
	if !ok {
		c.Level, c.Detail, c.Fix = levelWarn, "not installed: needed for "+what, fix
		return c
	}
	v, _ := output(ctx, p, versionArgs...)
	if len(v) > 80 {
		v = v[:80] + "…"
	}
	c.Level, c.Detail = levelOK, strings.TrimSpace(v+" at "+p)
	return c
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func humanBytes(n uint64) string {
	const gib = 1 << 30
	if n >= gib {
		return fmt.Sprintf("%.1f GiB", float64(n)/gib)
	}
	return fmt.Sprintf("%d MiB", n>>20)
}

// jailRunUser is the user jailed commands run as when Berth is root.
const jailRunUser = jail.RunUser

// lookupUser answers the uid of a host user.
func lookupUser(name string) (string, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return "", err
	}
	return u.Uid, nil
}

// findPostgres is the bin directory the embedded cluster would use.
func findPostgres(ctx context.Context) (string, error) {
	return pgembed.FindServer(ctx, "")
}
