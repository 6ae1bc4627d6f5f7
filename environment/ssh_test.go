package environment

import (
	"berth/environment/sshtest"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// driver is an ssh driver for the server, signed in as the current user, with a configured and
// a secret variable.
func driverFor(t *testing.T, s *sshtest.Server, hostKey string) *sshDriver {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Driver: DriverSSH, SSH: SSHConfig{Host: "127.0.0.1", Port: s.Port, User: u.Username, HostKey: hostKey},
		Env: []EnvVar{{Name: "CONFIGURED", Value: "from config"}, {Name: "SECRET_VALUE", Secret: true}}}
	d, err := newSSH(cfg, Options{Grace: time.Second,
		Secrets: Secrets{PrivateKey: s.ClientKey, Env: map[string]string{"SECRET_VALUE": "s3cret"}}})
	if err != nil {
		t.Fatal(err)
	}
	d.baseDir = s.Base
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// otherHostKey is a host key nobody serves.
func otherHostKey(t *testing.T) string {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k)))
}

// writeTreeFiles makes files (path → content; a "->" prefix makes a symlink) under dir.
func writeTreeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if target, ok := strings.CutPrefix(content, "->"); ok {
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// realized acquires an instance for a fresh key and realizes a small workspace on it.
func realized(t *testing.T, d *sshDriver, files map[string]string) (Instance, string, Realization) {
	t.Helper()
	host := t.TempDir()
	writeTreeFiles(t, host, files)
	inst, err := d.Acquire(t.Context(), AcquireRequest{Key: "lease-" + randomHex(4) + ":1", Tag: "run"})
	if err != nil {
		t.Fatal(err)
	}
	ref := "ws-" + randomHex(16)
	real, err := d.Realize(t.Context(), RealizeRequest{Instance: inst, WorkspaceRef: ref, HostPath: host})
	if err != nil {
		t.Fatal(err)
	}
	return inst, host, real
}

// liveSleeps lists the live (not zombie) processes of this machine that run sleep marker, as
// pgrep finds them.
func liveSleeps(t *testing.T, marker string) []int {
	t.Helper()
	out, err := exec.Command("pgrep", "-f", "^sleep "+marker).Output()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) {
		t.Fatalf("pgrep: %v", err)
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		pid, _ := strconv.Atoi(f)
		if st, err := readStat(pid); err == nil && st.live() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// sleepMarker is a sleep duration no other process uses, so pgrep -f finds exactly its sleeps.
func sleepMarker() string {
	n, err := rand.Int(rand.Reader, big.NewInt(1_000_000_000))
	if err != nil {
		panic(err)
	}
	return fmt.Sprintf("3%09d.5", n)
}

func TestSSHProbe(t *testing.T) {
	t.Parallel()
	s := sshtest.Start(t)
	ctx := t.Context()

	res, err := driverFor(t, s, s.HostKey).Probe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK {
		t.Fatalf("probe failed: %+v", res)
	}
	got := map[string]CheckStatus{}
	for _, c := range res.Checks {
		got[c.Name] = c.Status
	}
	for _, name := range []string{"host_key", "connect", "sh", "tar", "git", "setsid", "disk"} {
		if got[name] != CheckPass {
			t.Errorf("check %s = %q, want pass (%+v)", name, got[name], res.Checks)
		}
	}
	if !strings.Contains(res.Summary, "free for workspaces") {
		t.Errorf("summary %q does not report the free space", res.Summary)
	}

	wrong := otherHostKey(t)
	d := driverFor(t, s, wrong)
	res, err = d.Probe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.OK || len(res.Checks) != 1 || res.Checks[0].Name != "host_key" || res.Checks[0].Status != CheckFail ||
		!strings.Contains(res.Checks[0].Detail, "host_key_mismatch") || !strings.Contains(res.Summary, "host_key_mismatch") {
		t.Fatalf("probe with a wrong pinned key = %+v, want only the failed host_key check", res)
	}
	for _, key := range []string{wrong, s.HostKey} {
		blob := strings.Fields(key)[1]
		if strings.Contains(res.Summary+res.Checks[0].Detail, blob) {
			t.Fatalf("the probe result quotes key material: %+v", res)
		}
	}
	// Runs fail the same way, and the error names the condition, not the key.
	_, err = d.Acquire(ctx, AcquireRequest{Key: "lease-1:1", Tag: "run"})
	if !errors.Is(err, ErrHostKeyMismatch) || !strings.Contains(err.Error(), "host_key_mismatch") ||
		strings.Contains(err.Error(), strings.Fields(s.HostKey)[1]) {
		t.Fatalf("Acquire with a wrong pinned key: %v", err)
	}
}

func TestSSHRealizeExec(t *testing.T) {
	t.Parallel()
	s := sshtest.Start(t)
	d := driverFor(t, s, s.HostKey)
	ctx := t.Context()
	inst, host, real := realized(t, d, map[string]string{"a.txt": "alpha\n", "sub/run.sh": "#!/bin/sh\necho ran\n",
		"link": "->a.txt", ".git/config": "[core]\n", "sub/.git": "gitdir: elsewhere\n"})
	if again, err := d.Acquire(ctx, AcquireRequest{Key: strings.TrimPrefix(inst.Ref, d.prefix+"/"), Tag: "run"}); err != nil || again != inst {
		t.Fatalf("Acquire again = %+v, %v; want %+v", again, err, inst)
	}
	if !strings.HasPrefix(inst.Ref, "ssh:127.0.0.1:"+strconv.Itoa(s.Port)+"/lease-") || inst.Driver != DriverSSH {
		t.Fatalf("instance %+v", inst)
	}
	if filepath.Dir(real.Root) != s.Base {
		t.Fatalf("Root %q is not below the base %q", real.Root, s.Base)
	}

	// The copy on the remote: contents, the execute bit, the symlink; no .git.
	if got := readFile(t, filepath.Join(real.Root, "a.txt")); got != "alpha\n" {
		t.Errorf("remote a.txt = %q", got)
	}
	if fi, err := os.Stat(filepath.Join(real.Root, "sub/run.sh")); err != nil || fi.Mode().Perm()&0o100 == 0 {
		t.Errorf("remote run.sh lost its execute bit: %v %v", fi, err)
	}
	if target, err := os.Readlink(filepath.Join(real.Root, "link")); err != nil || target != "a.txt" {
		t.Errorf("remote link = %q, %v", target, err)
	}
	for _, g := range []string{".git", "sub/.git"} {
		if _, err := os.Lstat(filepath.Join(real.Root, g)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s reached the remote: %v", g, err)
		}
	}
	if entries, _ := filepath.Glob(filepath.Join(s.Base, ".upload.*")); len(entries) != 0 {
		t.Errorf("uploads left behind: %v", entries)
	}

	token := "tok-" + randomHex(16)
	var out bytes.Buffer
	res, err := d.Exec(ctx, ExecRequest{Command: `printf '%s|%s|%s|%s|%s|%s\n' "$BERTH_RUN_TOKEN" "$CONFIGURED" "$SECRET_VALUE" "$TRICKY" "$BERTH_RUN_ID" "${SSH_CONNECTION:-unset}"; pwd; sub/run.sh; echo oops >&2; exit 3`,
		Dir: real.Root, Tag: "run-1", Log: &out,
		Env: map[string]string{"BERTH_RUN_TOKEN": token, "TRICKY": "it's \"$HOME\"\nsecond line"}})
	if err != nil {
		t.Fatalf("Exec: %v (output %q)", err, out.String())
	}
	want := token + "|from config|s3cret|it's \"$HOME\"\nsecond line|run-1|unset\n" + real.Root + "\nran\noops\n"
	if res.ExitCode != 3 || res.TimedOut || res.Cancelled || out.String() != want {
		t.Fatalf("Exec = %+v, output %q; want exit 3 and %q", res, out.String(), want)
	}
	if res.Started.IsZero() || res.PID <= 1 || res.Finished.Before(res.Started) {
		t.Errorf("Exec result times and pid: %+v", res)
	}

	// A missing directory is refused before anything runs.
	res, err = d.Exec(ctx, ExecRequest{Command: "true", Dir: real.Root + "/missing", Tag: "run-1"})
	if !errors.Is(err, ErrInvalidRequest) || !res.Started.IsZero() {
		t.Fatalf("Exec in a missing directory = %+v, %v; want ErrInvalidRequest before the start", res, err)
	}
	for name, req := range map[string]ExecRequest{
		"no command":      {Command: " ", Dir: real.Root, Tag: "t"},
		"relative dir":    {Command: "true", Dir: "ws", Tag: "t"},
		"no tag":          {Command: "true", Dir: real.Root},
		"bad name":        {Command: "true", Dir: real.Root, Tag: "t", Env: map[string]string{"A-B": "x"}},
		"wrapper's name":  {Command: "true", Dir: real.Root, Tag: "t", Env: map[string]string{"berth_dir": "/"}},
		"tag mismatch":    {Command: "true", Dir: real.Root, Tag: "t", Env: map[string]string{TagVar: "u"}},
		"negative timout": {Command: "true", Dir: real.Root, Tag: "t", Timeout: -1},
	} {
		if _, err := d.Exec(ctx, req); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("Exec with %s: %v, want ErrInvalidRequest", name, err)
		}
	}

	// A background process does not outlive a command that exited.
	marker := sleepMarker()
	res, err = d.Exec(ctx, ExecRequest{Command: "sleep " + marker + " & echo started", Dir: real.Root, Tag: "run-2"})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Exec with a background sleep = %+v, %v", res, err)
	}
	if pids := liveSleeps(t, marker); len(pids) != 0 {
		t.Fatalf("the background sleep outlived its command: %v", pids)
	}
	if _, err := os.Stat(host); err != nil {
		t.Fatal(err)
	}
}

// TestSSHExecSecretsStayOffTheHost: while a command runs, its token is in no process's argv on the
// remote host, and in no file below the base directory.
func TestSSHExecSecretsStayOffTheHost(t *testing.T) {
	t.Parallel()
	s := sshtest.Start(t)
	d := driverFor(t, s, s.HostKey)
	_, _, real := realized(t, d, map[string]string{"a.txt": "a\n"})
	token := "tok-" + randomHex(16)
	marker := sleepMarker()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	type result struct {
		res ExecResult
		err error
	}
	done := make(chan result, 1)
	var out bytes.Buffer
	go func() {
		res, err := d.Exec(ctx, ExecRequest{Command: `printf %s "$BERTH_RUN_TOKEN" | sha256sum; sleep ` + marker,
			Dir: real.Root, Tag: "run-ps", Log: &out, Env: map[string]string{"BERTH_RUN_TOKEN": token}})
		done <- result{res, err}
	}()
	waitFor(t, "the command to run", func() bool { return len(liveSleeps(t, marker)) > 0 })
	ps, err := exec.Command("ps", "-eo", "pid,args").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(ps), token) {
		t.Fatalf("the token is in the process list:\n%s", ps)
	}
	if grep := exec.Command("grep", "-rqF", token, s.Base); grep.Run() == nil {
		t.Fatal("the token is in a file below the base directory")
	}
	cancel()
	select {
	case r := <-done:
		if sum := sha256.Sum256([]byte(token)); !r.res.Cancelled || r.err != nil || !strings.HasPrefix(out.String(), hex.EncodeToString(sum[:])+"  -\n") {
			t.Fatalf("Exec = %+v, %v, output %q", r.res, r.err, out.String())
		}
	case <-time.After(testDeadline):
		t.Fatal("Exec did not return after the cancel")
	}
	if records, _ := filepath.Glob(filepath.Join(s.Base, ".run", "*")); len(records) != 0 {
		t.Errorf("process records left behind: %v", records)
	}
}

func TestSSHExecCancelKillsTheGroup(t *testing.T) {
	t.Parallel()
	s := sshtest.Start(t)
	d := driverFor(t, s, s.HostKey)
	_, _, real := realized(t, d, map[string]string{"a.txt": "a\n"})
	marker := sleepMarker()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var started sync.WaitGroup
	started.Add(1)
	var pgid int
	type result struct {
		res ExecResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := d.Exec(ctx, ExecRequest{Command: "sleep " + marker + " & sleep " + marker + "; echo never",
			Dir: real.Root, Tag: "run-cancel", OnStart: func(pid int) { pgid = pid; started.Done() }})
		done <- result{res, err}
	}()
	waitFor(t, "both sleeps", func() bool { return len(liveSleeps(t, marker)) == 2 })
	started.Wait()
	for _, pid := range liveSleeps(t, marker) {
		if st, err := readStat(pid); err != nil || st.pgid != pgid {
			t.Fatalf("sleep %d is in group %d, want the command's group %d (%v)", pid, st.pgid, pgid, err)
		}
	}
	cancel()
	var r result
	select {
	case r = <-done:
	case <-time.After(testDeadline):
		t.Fatal("Exec did not return after the cancel")
	}
	if !r.res.Cancelled || r.res.TimedOut || r.err != nil {
		t.Fatalf("Exec = %+v, %v; want Cancelled", r.res, r.err)
	}
	if pids := liveSleeps(t, marker); len(pids) != 0 {
		t.Fatalf("processes of the cancelled group still run: %v", pids)
	}
}

// TestSSHConnectionLossKillsTheGroup: when Berth's connection goes (Berth died, the network
// broke), the remote wrapper stops the command's group by itself.
func TestSSHConnectionLossKillsTheGroup(t *testing.T) {
	t.Parallel()
	s := sshtest.Start(t)
	d := driverFor(t, s, s.HostKey)
	inst, _, real := realized(t, d, map[string]string{"a.txt": "a\n"})
	marker := sleepMarker()
	done := make(chan error, 1)
	go func() {
		_, err := d.Exec(t.Context(), ExecRequest{Command: "sleep " + marker + " & sleep " + marker, Dir: real.Root, Tag: "run-lost"})
		done <- err
	}()
	waitFor(t, "both sleeps", func() bool { return len(liveSleeps(t, marker)) == 2 })
	d.mu.Lock()
	c := d.conns[inst.Ref]
	d.mu.Unlock()
	_ = c.client.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Exec over a lost connection reported no error")
		}
	case <-time.After(testDeadline):
		t.Fatal("Exec did not return after the connection was lost")
	}
	waitFor(t, "the remote group to be stopped", func() bool { return len(liveSleeps(t, marker)) == 0 })
}

func TestSSHExecTimeout(t *testing.T) {
	t.Parallel()
	s := sshtest.Start(t)
	d := driverFor(t, s, s.HostKey)
	d.grace = 300 * time.Millisecond
	_, _, real := realized(t, d, map[string]string{"a.txt": "a\n"})
	for name, command := range map[string]string{
		"honours SIGTERM": "sleep %s",
		"ignores SIGTERM": "trap '' TERM; while :; do sleep %s; done",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			marker := sleepMarker()
			res, err := execWithin(t, t.Context(), d, ExecRequest{Command: fmt.Sprintf(command, marker), Dir: real.Root,
				Tag: "run-timeout", Timeout: 500 * time.Millisecond})
			if err != nil || !res.TimedOut || res.Cancelled || res.ExitCode == 0 {
				t.Fatalf("Exec = %+v, %v; want TimedOut", res, err)
			}
			if pids := liveSleeps(t, marker); len(pids) != 0 {
				t.Fatalf("processes survived the timeout: %v", pids)
			}
		})
	}
}

func TestSSHSync(t *testing.T) {
	t.Parallel()
	s := sshtest.Start(t)
	d := driverFor(t, s, s.HostKey)
	ctx := t.Context()
	inst, host, real := realized(t, d, map[string]string{"a.txt": "alpha\n", "same.txt": "same\n",
		"sub/gone.txt": "bye\n", "old/deep/x": "x\n", "keep.sock": "", ".git/config": "[core]\n"})
	// A FIFO here is not sent, and not removed by the sync.
	if err := os.Remove(filepath.Join(host, "keep.sock")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(host, "keep.sock"), 0o644); err != nil {
		t.Fatal(err)
	}
	real, err := d.Realize(ctx, RealizeRequest{Instance: inst, WorkspaceRef: filepath.Base(real.Root), HostPath: host})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(real.Root, "keep.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the FIFO reached the remote: %v", err)
	}
	sameBefore, err := os.Stat(filepath.Join(host, "same.txt"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := d.Exec(ctx, ExecRequest{Dir: real.Root, Tag: "run-sync", Command: `set -e
echo changed > a.txt
echo new > sub/new.txt
rm sub/gone.txt
rm -rf old
mkdir -p d/e && echo f > d/e/f && chmod +x d/e/f
ln -s a.txt rel-link
ln -s /etc/passwd outside
ln -s ../../x escape
mkfifo pipe
mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit`})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Exec = %+v, %v", res, err)
	}
	for _, root := range []string{real.Root, ""} { // twice: the second finds nothing more to do
		if err := d.Sync(ctx, SyncRequest{Instance: inst, Root: root, HostPath: host}); err != nil {
			t.Fatalf("Sync(root %q): %v", root, err)
		}
	}
	if got := readFile(t, filepath.Join(host, "a.txt")); got != "changed\n" {
		t.Errorf("a.txt = %q", got)
	}
	if got := readFile(t, filepath.Join(host, "sub/new.txt")); got != "new\n" {
		t.Errorf("sub/new.txt = %q", got)
	}
	if fi, err := os.Stat(filepath.Join(host, "d/e/f")); err != nil || fi.Mode().Perm()&0o100 == 0 {
		t.Errorf("d/e/f = %v, %v; want an executable file", fi, err)
	}
	if target, err := os.Readlink(filepath.Join(host, "rel-link")); err != nil || target != "a.txt" {
		t.Errorf("rel-link = %q, %v", target, err)
	}
	for _, gone := range []string{"sub/gone.txt", "old", "outside", "escape", "pipe", ".git/hooks"} {
		if _, err := os.Lstat(filepath.Join(host, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s exists after the sync: %v", gone, err)
		}
	}
	if fi, err := os.Lstat(filepath.Join(host, "keep.sock")); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("the local FIFO did not stay: %v, %v", fi, err)
	}
	if got := readFile(t, filepath.Join(host, ".git/config")); got != "[core]\n" {
		t.Errorf(".git/config = %q", got)
	}
	if sameAfter, err := os.Stat(filepath.Join(host, "same.txt")); err != nil || !sameAfter.ModTime().Equal(sameBefore.ModTime()) {
		t.Errorf("an unchanged file was rewritten: %v, %v", sameAfter, err)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(host, "*", ".berth-sync-*")); len(leftovers) != 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}

	// Another lease's instance cannot read this workspace.
	other, err := d.Acquire(ctx, AcquireRequest{Key: "other:1", Tag: "run"})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(ctx, SyncRequest{Instance: other, Root: real.Root, HostPath: t.TempDir()}); err == nil {
		t.Fatal("Sync of another lease's workspace succeeded")
	}
}

func TestSSHRelease(t *testing.T) {
	t.Parallel()
	s := sshtest.Start(t)
	d := driverFor(t, s, s.HostKey)
	ctx := t.Context()
	inst, host, real := realized(t, d, map[string]string{"a.txt": "a\n", "ro/f": "f\n"})
	if err := os.Chmod(filepath.Join(real.Root, "ro"), 0o555); err != nil {
		t.Fatal(err)
	}
	// A process group recorded for the workspace, as a crashed Berth would leave it.
	marker := sleepMarker()
	left := exec.Command("setsid", "sleep", marker)
	if err := left.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = left.Wait() }()
	st, err := readStat(left.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	record := filepath.Join(s.Base, ".run", filepath.Base(real.Root)+".crashed")
	if err := os.WriteFile(record, fmt.Appendf(nil, "%d %d\n", left.Process.Pid, st.start), 0o600); err != nil {
		t.Fatal(err)
	}

	// A fresh driver (as in the cleanup job) releases by the instance alone.
	fresh := driverFor(t, s, s.HostKey)
	for range 2 { // idempotent
		if err := fresh.Release(ctx, inst); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{real.Root, real.Root + ".lease", record} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there after Release: %v", p, err)
		}
	}
	waitFor(t, "the recorded group to be stopped", func() bool { return len(liveSleeps(t, marker)) == 0 })
	if _, err := os.Stat(filepath.Join(host, "a.txt")); err != nil {
		t.Errorf("Release touched the host copy: %v", err)
	}

	// A workspace another lease realized since is not removed by the old lease's release.
	inst2, err := d.Acquire(ctx, AcquireRequest{Key: "second:1", Tag: "run"})
	if err != nil {
		t.Fatal(err)
	}
	name := "ws-" + randomHex(16)
	if _, err := d.Realize(ctx, RealizeRequest{Instance: inst, WorkspaceRef: name, HostPath: host}); err != nil {
		t.Fatal(err)
	}
	again, err := d.Realize(ctx, RealizeRequest{Instance: inst2, WorkspaceRef: name, HostPath: host})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, inst); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(again.Root, "a.txt")); err != nil {
		t.Fatalf("the old lease's release removed the new lease's workspace: %v", err)
	}
	if err := d.Release(ctx, Instance{Driver: DriverSSH, Ref: "ssh:elsewhere:22/x"}); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("Release of another host's instance: %v", err)
	}
}

// TestSSHKeepaliveDropsDeadConnection: a connection whose server stops answering is dropped by
// the keepalive, and the next use dials a new one.
func TestSSHKeepaliveDropsDeadConnection(t *testing.T) {
	t.Parallel()
	s := sshtest.Start(t)
	d := driverFor(t, s, s.HostKey)
	d.keepalive = 200 * time.Millisecond // dropped after 600 ms of silence
	inst, _, real := realized(t, d, map[string]string{"a.txt": "a\n"})
	d.mu.Lock()
	first := d.conns[inst.Ref]
	d.mu.Unlock()
	if first == nil {
		t.Fatal("no connection for the instance")
	}
	// Freeze the server's per-connection processes: the connection stays open but silent.
	frozen := descendants(s.PID)
	if len(frozen) == 0 {
		t.Fatal("sshd has no connection processes")
	}
	for _, pid := range frozen {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	t.Cleanup(func() {
		for _, pid := range frozen {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	})
	waitFor(t, "the keepalive to drop the connection", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.conns[inst.Ref] != first
	})
	var out bytes.Buffer
	res, err := d.Exec(t.Context(), ExecRequest{Command: "cat a.txt", Dir: real.Root, Tag: "run-redial", Log: &out})
	if err != nil || res.ExitCode != 0 || out.String() != "a\n" {
		t.Fatalf("Exec after the drop = %+v, %v, %q", res, err, out.String())
	}
}

// descendants lists the processes below pid.
func descendants(pid int) []int {
	procs, _ := scanProcs("")
	parents := map[int]int{}
	for _, p := range procs {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 1 {
			parents[p.pid], _ = strconv.Atoi(f[1])
		}
	}
	var out []int
	below := map[int]bool{pid: true}
	for changed := true; changed; {
		changed = false
		for p, pp := range parents {
			if below[pp] && !below[p] {
				below[p], changed = true, true
				out = append(out, p)
			}
		}
	}
	return out
}
