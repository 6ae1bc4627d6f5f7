package environment

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// jailLocations are the places a user puts a data dir: the default temp dir (0700, under the
// jail's own private /tmp), a directory below a 0700 parent outside /tmp, and below /root when
// the tests run as root (the default data dir of `make run` from a checkout there).
func jailLocations(t *testing.T) map[string]string {
	t.Helper()
	locs := map[string]string{"tmp": t.TempDir(), "0700 parent": workDir(t)}
	if os.Geteuid() == 0 {
		d, err := os.MkdirTemp("/root", "berth-jailtest-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		if err := os.Chmod("/root", 0o700); err != nil {
			t.Fatal(err)
		}
		locs["/root"] = d
	}
	if d, err := os.MkdirTemp("/dev/shm", "berth-jailtest-"); err == nil { // a tmpfs below /dev
		t.Cleanup(func() { os.RemoveAll(d) })
		locs["/dev/shm"] = d
	}
	return locs
}

// TestJailWherever runs a command in the local and the sandbox profile with the data dir in each
// location a user puts it (issue 21: a data dir under /tmp or below a 0700 directory broke every
// run). The command writes its workspace and HOME, and still cannot see the data dir around it.
func TestJailWherever(t *testing.T) {
	t.Parallel()
	for name, root := range jailLocations(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			data := filepath.Join(root, "data")
			ws := filepath.Join(data, "workspaces", "ws-w")
			home := filepath.Join(data, "homes", "ws-w")
			image := filepath.Join(data, "images", "env-1", "1")
			for _, d := range []string{ws, home, image} {
				if err := os.MkdirAll(d, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			write(t, filepath.Join(data, "secret.key"), "the-secret-key", 0o600)
			local, err := newLocal(Config{Driver: DriverLocal}, Options{Jail: &testJail, DataDir: data, Masks: []string{data, "/root"}})
			if err != nil {
				t.Fatal(err)
			}
			sb, err := newSandbox(Config{Driver: DriverSandbox}, Options{Jail: &testJail, DataDir: data, ImageDir: image})
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				profile string
				d       Driver
				command string
			}{
				{"local", local, `echo ok > made-local && cat made-local && echo h > "$HOME/h" && ! cat ` + filepath.Join(data, "secret.key")},
				{"sandbox", sb, `echo ok > made-sandbox && cat made-sandbox && ! ls /opt/image/../../` + filepath.Base(data)},
			} {
				var log bytes.Buffer
				res, err := execWithin(t, t.Context(), c.d, ExecRequest{Command: c.command, Dir: ws, Home: home, Tag: newTag(t),
					Log: &log, Timeout: 30 * time.Second})
				if err != nil || res.ExitCode != 0 {
					t.Fatalf("%s in %s: exit %d, err %v, log %q", c.profile, name, res.ExitCode, err, log.String())
				}
			}
		})
	}
}

// TestJailDropsEverything: when Berth is root, bubblewrap runs as root to build the mounts, and
// the command must then hold nothing of root: no capability in any set, no new privileges (a
// setuid binary of the host cannot raise it), no supplementary group. The negative control runs
// the same probe in a jail without the drop, where root's capabilities show.
func TestJailDropsEverything(t *testing.T) {
	if testJail.Identity == nil {
		t.Skip("Berth is not root here: no drop to make")
	}
	t.Parallel()
	probe := `grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status | tr -s '\t' ' '; id -G`
	root := workDir(t)
	ws := filepath.Join(root, "ws")
	image := filepath.Join(root, "image")
	for _, d := range []string{ws, image} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	local, err := newLocal(Config{Driver: DriverLocal}, Options{Jail: &testJail, DataDir: root})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := newSandbox(Config{Driver: DriverSandbox}, Options{Jail: &testJail, DataDir: root, ImageDir: image})
	if err != nil {
		t.Fatal(err)
	}
	zero := "0000000000000000"
	want := "CapInh: " + zero + "\nCapPrm: " + zero + "\nCapEff: " + zero + "\nCapBnd: " + zero + "\nCapAmb: " + zero +
		"\nNoNewPrivs: 1\n" + strconv.Itoa(testJail.Identity.GID) + "\n"
	for name, d := range map[string]Driver{"local": local, "sandbox": sb} {
		var log bytes.Buffer
		res, err := execWithin(t, t.Context(), d, ExecRequest{Command: probe, Dir: ws, Tag: newTag(t), Log: &log, Timeout: 30 * time.Second})
		if err != nil || res.ExitCode != 0 || log.String() != want {
			t.Errorf("%s: exit %d, err %v:\n%s\nwant\n%s", name, res.ExitCode, err, log.String(), want)
		}
	}
	out, err := exec.Command(testJail.Bwrap, "--unshare-pid", "--ro-bind", "/", "/", "--proc", "/proc", "--", "/bin/sh", "-c", probe).CombinedOutput()
	if err != nil || strings.Contains(string(out), "CapEff: "+zero) {
		t.Errorf("negative control: a root jail without the drop should show root's capabilities: %v %q", err, out)
	}
}
