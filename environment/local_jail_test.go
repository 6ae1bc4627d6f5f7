package environment

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// jailFixture is a data dir laid out like Berth's (secret key, a database socket, two
// workspaces), outside /tmp, and a local driver contained in the jail with that data dir masked.
type jailFixture struct {
	data, ws, other, home, socket string
	d                             *local
}

func newJailFixture(t testing.TB) jailFixture {
	t.Helper()
	root := workDir(t)
	f := jailFixture{data: filepath.Join(root, "data")}
	f.ws = filepath.Join(f.data, "workspaces", "ws-a")
	f.other = filepath.Join(f.data, "workspaces", "ws-b")
	f.home = filepath.Join(f.data, "homes", "ws-a")
	for _, d := range []string{f.ws, f.other, f.home, filepath.Join(f.data, "pg")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Modes are open on purpose: the jail's masks must hide these, not their permissions (a
	// non-root Berth owns them with the same uid its runs have).
	write(t, filepath.Join(f.data, "secret.key"), "the-secret-key", 0o644)
	write(t, filepath.Join(f.other, "notes.txt"), "another workspace", 0o644)
	write(t, filepath.Join(root, "outside.txt"), "beside the data dir", 0o644)
	f.socket = filepath.Join(f.data, "pg", ".s.PGSQL.5432")
	l, err := net.Listen("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if err := os.Chmod(f.socket, 0o777); err != nil {
		t.Fatal(err)
	}
	d, err := newLocal(Config{Driver: DriverLocal}, Options{Jail: &testJail, DataDir: f.data,
		Masks: []string{f.data, "/root"}, Home: f.home})
	if err != nil {
		t.Fatal(err)
	}
	f.d = d
	return f
}

func write(t testing.TB, p, body string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(p, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
}

// jailed runs command in the fixture's workspace and returns its log.
func (f jailFixture) jailed(t *testing.T, ctx context.Context, command string, timeout time.Duration) (ExecResult, string) {
	t.Helper()
	var log bytes.Buffer
	res, err := execWithin(t, ctx, f.d, ExecRequest{Command: command, Dir: f.ws, Tag: newTag(t), Log: &log,
		Timeout: timeout, Home: f.home, Env: map[string]string{"BERTH_RUN_TOKEN": "run-token"}})
	if err != nil {
		t.Fatalf("exec %q: %v (log %q)", command, err, log.String())
	}
	return res, log.String()
}

// TestLocalJail checks, on real bubblewrap, what a run on a contained local environment cannot
// reach (docs/security.md, "What a run can see"): each command must fail inside the jail.
func TestLocalJail(t *testing.T) {
	t.Parallel()
	f := newJailFixture(t)
	self := strconv.Itoa(os.Getpid())
	refused := []struct{ name, command string }{
		{"read the secret key", "cat " + filepath.Join(f.data, "secret.key")},
		{"list the data dir", "ls -A " + f.data + " | grep -v workspaces | grep -v homes | grep ."},
		{"see another workspace", "cat " + filepath.Join(f.other, "notes.txt")},
		{"reach the database socket", "test -S " + f.socket},
		{"connect to the database socket", "python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])' " + f.socket},
		{"read the server's environ", "cat /proc/" + self + "/environ | grep -a ."},
		{"see the server's process", "ps -eo args | grep -a -- '-test\\.' | grep -v grep"},
		{"write beside the data dir", "echo x > " + filepath.Join(filepath.Dir(f.data), "planted")},
		{"write into the masked data dir", "echo x > " + filepath.Join(f.data, "planted")},
		{"write /etc", "echo x > /etc/berth-planted"},
		{"write /usr", "touch /usr/berth-planted"},
		{"hard link to a file outside", "ln " + filepath.Join(filepath.Dir(f.data), "outside.txt") + " linked"},
		{"hard link to /etc/passwd", "ln /etc/passwd linked"},
		{"read /root", "ls -A /root | grep ."},
	}
	for _, c := range refused {
		t.Run(c.name, func(t *testing.T) {
			res, log := f.jailed(t, t.Context(), c.command, 30*time.Second)
			if res.ExitCode == 0 {
				t.Fatalf("%q succeeded in the jail: %q", c.command, log)
			}
		})
	}
	allowed := []struct{ name, command string }{
		{"write the workspace", "echo ok > made.txt && cat made.txt"},
		{"write HOME", `echo ok > "$HOME/.cache-file" && test "$HOME" = ` + f.home},
		{"write a private /tmp", "echo ok > /tmp/x && cat /tmp/x"},
		{"see its own token", `test "$BERTH_RUN_TOKEN" = run-token`},
		{"run host tools", "git --version && sh -c true"},
	}
	for _, c := range allowed {
		t.Run(c.name, func(t *testing.T) {
			res, log := f.jailed(t, t.Context(), c.command, 30*time.Second)
			if res.ExitCode != 0 {
				t.Fatalf("%q failed in the jail (exit %d): %q", c.command, res.ExitCode, log)
			}
		})
	}
	for _, p := range []string{filepath.Join(filepath.Dir(f.data), "planted"), filepath.Join(f.data, "planted"), "/etc/berth-planted"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s was planted on the host", p)
		}
	}
	if _, err := os.Lstat(filepath.Join(f.ws, "made.txt")); err != nil {
		t.Errorf("the workspace write did not reach the host: %v", err)
	}
	// As root, what the run wrote belongs to the run user, never to root.
	if fi, err := os.Stat(filepath.Join(f.ws, "made.txt")); err == nil && testJail.Identity != nil {
		if uid := fileUID(fi); uid != testJail.Identity.UID {
			t.Errorf("made.txt is owned by uid %d, want the run user's %d", uid, testJail.Identity.UID)
		}
	}
}

// TestLocalJailEscapees: a process that leaves the group and drops BERTH_RUN_ID still dies when
// the run ends, however it ends.
func TestLocalJailEscapees(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		command string
		timeout time.Duration
		cancel  bool
	}{
		{"exit", "setsid env -u BERTH_RUN_ID sleep %s & sleep 0.2; exit 0", 0, false},
		{"timeout", "setsid env -u BERTH_RUN_ID sleep %s & sleep 300", time.Second, false},
		{"cancel", "setsid env -u BERTH_RUN_ID sleep %s & sleep 300", 0, true},
		{"nohup daemon", "(nohup setsid env -u BERTH_RUN_ID sleep %s >/dev/null 2>&1 &) ; sleep 0.2", 0, false},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newJailFixture(t)
			marker := "333." + strconv.Itoa(os.Getpid()) + strconv.Itoa(i)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if c.cancel {
				go func() {
					for range 200 {
						if len(findCmdline("sleep "+marker)) > 0 {
							break
						}
						time.Sleep(10 * time.Millisecond)
					}
					cancel()
				}()
			}
			f.jailed(t, ctx, strings.ReplaceAll(c.command, "%s", marker), c.timeout)
			deadline := time.Now().Add(5 * time.Second)
			for len(findCmdline("sleep "+marker)) > 0 {
				if time.Now().After(deadline) {
					t.Fatalf("the escapee %v survived the run's end by 5 s", findCmdline("sleep "+marker))
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// TestLocalJailUnprivileged runs TestLocalJail again in a copy of this test binary started as an
// unprivileged user (setpriv), the way a non-root Berth runs it: its own uid in the jail, the
// namespaces as the boundary.
func TestLocalJailUnprivileged(t *testing.T) {
	if os.Getenv("BERTH_JAIL_UNPRIVILEGED") != "" {
		t.Skip("already the unprivileged run")
	}
	if os.Geteuid() != 0 {
		t.Skip("the tests already run unprivileged")
	}
	t.Parallel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := workDir(t)
	bin := filepath.Join(dir, "environment.test")
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	write(t, bin, string(b), 0o755)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
		bin, "-test.run", "^(TestLocalJail|TestLocalJailEscapees)$", "-test.v")
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/nonexistent", "BERTH_JAIL_UNPRIVILEGED=1"}
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("\nPASS")) {
		t.Fatalf("unprivileged run: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("--- PASS: TestLocalJail ")) {
		t.Fatalf("the unprivileged run did not run TestLocalJail:\n%s", out)
	}
}

// findCmdline lists the host pids whose command line contains s.
func findCmdline(s string) []int {
	var out []int
	procs, _ := scanProcs("")
	for _, p := range procs {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/cmdline")
		if err == nil && strings.Contains(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})), s) {
			out = append(out, p.pid)
		}
	}
	return out
}
