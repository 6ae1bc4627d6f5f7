package environment

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testDeadline bounds every wait in these tests; nothing here asserts how long anything took.
const testDeadline = 20 * time.Second

func testTag() string { return "test-" + randomHex(8) }

// newTag is a fresh tag whose processes are killed when the test ends, even if it failed before
// Exec could clean up (so a broken build leaves no sleepers behind).
func newTag(t *testing.T) string {
	tag := testTag()
	t.Cleanup(func() { _, _ = KillTagged(context.Background(), tag, 0) })
	return tag
}

// newTestLocal is an uncontained local driver ("containment": "none"): these tests check the
// process mechanics by host pid, which a jail's pid namespace hides; local_jail_test.go checks
// the jail. Tests keep the default grace unless they need SIGKILL: processes
// that honour SIGTERM end Exec as soon as they are gone, and a loaded machine must not turn a
// SIGTERM death into a SIGKILL one.
func newTestLocal(t *testing.T, opts Options) *local {
	t.Helper()
	d, err := newLocal(Config{Driver: DriverLocal, Containment: ContainmentNone}, opts)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// execWithin runs Exec and fails the test if it has not returned before the test deadline.
func execWithin(t *testing.T, ctx context.Context, d Driver, req ExecRequest) (ExecResult, error) {
	t.Helper()
	type out struct {
		res ExecResult
		err error
	}
	ch := make(chan out, 1)
	go func() {
		res, err := d.Exec(ctx, req)
		ch <- out{res, err}
	}()
	select {
	case o := <-ch:
		return o.res, o.err
	case <-time.After(testDeadline):
		t.Fatalf("Exec(%q) did not return before the test deadline", req.Command)
		return ExecResult{}, nil
	}
}

// waitFor polls cond until it holds, failing the test at the deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readPidFile waits for a file holding one pid and a newline, as `echo $! > file` writes it.
func readPidFile(t *testing.T, path string) int {
	t.Helper()
	pid, err := awaitPidFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// awaitPidFile is readPidFile for goroutines other than the test's.
func awaitPidFile(path string) (int, error) {
	deadline := time.Now().Add(testDeadline)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil && bytes.HasSuffix(b, []byte("\n")) {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
				return pid, nil
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return 0, fmt.Errorf("timed out waiting for %s", filepath.Base(path))
}

// cancelWhenWritten cancels once every pid file exists and delivers the pids.
func cancelWhenWritten(t *testing.T, cancel context.CancelFunc, paths ...string) <-chan []int {
	ch := make(chan []int, 1)
	go func() {
		defer cancel()
		var pids []int
		for _, p := range paths {
			pid, err := awaitPidFile(p)
			if err != nil {
				t.Error(err)
			}
			pids = append(pids, pid)
		}
		ch <- pids
	}()
	return ch
}

// procStatus reads one field of /proc/<pid>/status (independently of the code under test).
func procStatus(pid int, field string) (string, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "", false
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// alive reports whether pid is a running (not zombie) process.
func alive(pid int) bool {
	s, ok := procStatus(pid, "State")
	return ok && !strings.HasPrefix(s, "Z") && !strings.HasPrefix(s, "X")
}

// groupMembers lists the running processes of process group pgid.
func groupMembers(t *testing.T, pgid int) []int {
	t.Helper()
	names, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range names {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		g, ok := procStatus(pid, "NSpgid")
		if ok && strings.Fields(g)[0] == strconv.Itoa(pgid) && alive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// assertGone fails unless every pid is dead and nothing runs in group pgid.
func assertGone(t *testing.T, pgid int, pids ...int) {
	t.Helper()
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("process %d still runs", pid)
		}
	}
	if m := groupMembers(t, pgid); len(m) > 0 {
		t.Errorf("process group %d still has %v", pgid, m)
	}
}

// killLater kills pid at the end of the test if it is still the same process.
func killLater(t *testing.T, pid int) {
	start, err := ProcessStartTime(pid)
	if err != nil {
		return
	}
	t.Cleanup(func() {
		if s, err := ProcessStartTime(pid); err == nil && s == start {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

func TestExecExitStatus(t *testing.T) {
	t.Parallel()
	d := newTestLocal(t, Options{})
	cases := []struct {
		command  string
		code     int
		signaled bool
	}{
		{"true", 0, false},
		{"exit 3", 3, false},
		{"kill -TERM $$", 128 + int(syscall.SIGTERM), true},
		{"kill -KILL $$", 128 + int(syscall.SIGKILL), true},
	}
	for _, c := range cases {
		t.Run(c.command, func(t *testing.T) {
			t.Parallel()
			var started int
			res, err := execWithin(t, t.Context(), d, ExecRequest{Command: c.command, Dir: workDir(t), Tag: newTag(t),
				OnStart: func(pid int) { started = pid }})
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != c.code || res.Signaled != c.signaled || res.TimedOut || res.Cancelled {
				t.Fatalf("result %+v, want exit %d signaled %v", res, c.code, c.signaled)
			}
			if res.PID <= 0 || started != res.PID {
				t.Fatalf("OnStart got pid %d, result has %d", started, res.PID)
			}
			if res.Started.IsZero() || res.Finished.Before(res.Started) {
				t.Fatalf("times: started %v finished %v", res.Started, res.Finished)
			}
		})
	}
}

func TestExecInterleavesStdoutAndStderrInOneLog(t *testing.T) {
	t.Parallel()
	d := newTestLocal(t, Options{})
	var log bytes.Buffer
	_, err := execWithin(t, t.Context(), d, ExecRequest{Command: "echo one; echo two >&2; echo three; echo four >&2",
		Dir: workDir(t), Tag: newTag(t), Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := log.String(), "one\ntwo\nthree\nfour\n"; got != want {
		t.Fatalf("log %q, want %q", got, want)
	}
}

func TestExecWorkingDirectoryAndEmptyStdin(t *testing.T) {
	t.Parallel()
	d := newTestLocal(t, Options{})
	dir := workDir(t)
	var log bytes.Buffer
	_, err := execWithin(t, t.Context(), d, ExecRequest{Command: "pwd -P; wc -c; readlink /proc/self/fd/0",
		Dir: dir, Tag: newTag(t), Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := log.String(), real+"\n0\n/dev/null\n"; got != want {
		t.Fatalf("output %q, want %q", got, want)
	}
}

// TestExecEnvironmentIsExactlyTheAllowedSet sets secrets in Berth's own environment and checks
// that the command's environment is exactly the base, the environment's variables, the request's
// variables and the tag. It uses t.Setenv, so it cannot run in parallel.
func TestExecEnvironmentIsExactlyTheAllowedSet(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://berth:secret@localhost/berth")
	t.Setenv("BERTH_SECRET_KEY", "do-not-leak")
	t.Setenv("HOME", "/root/berth-home-leak")
	t.Setenv("LEAK_CANARY", "1")

	cfg := Config{Driver: DriverLocal, Containment: ContainmentNone, Env: []EnvVar{{Name: "PUBLIC_VAR", Value: "public"}, {Name: "SECRET_VAR", Secret: true}}}
	runEnv := map[string]string{"BERTH_RUN_TOKEN": "tok", "BERTH_API_URL": "http://127.0.0.1:8080",
		"BERTH_TASK_ID": "task-1", "BERTH_WORKSPACE_ID": "ws-1"}
	privateHome := workDir(t)
	cases := []struct {
		name     string
		home     string            // Options.Home
		env      map[string]string // beyond runEnv
		wantHome func(dir string) string
	}{
		{"home is the workspace by default", "", nil, func(dir string) string { return dir }},
		{"private home", privateHome, nil, func(string) string { return privateHome }},
		{"request sets home", privateHome, map[string]string{"HOME": "/nonexistent-home"}, func(string) string { return "/nonexistent-home" }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := newLocal(cfg, Options{Secrets: Secrets{Env: map[string]string{"SECRET_VAR": "sealed"}},
				Path: "/usr/bin:/bin", Home: c.home})
			if err != nil {
				t.Fatal(err)
			}
			dir, tag := workDir(t), newTag(t)
			env := maps.Clone(runEnv)
			maps.Copy(env, c.env)
			var log bytes.Buffer
			// The shell's own /proc environ is exactly what Berth passed; `env` shows what a
			// child sees after the shell added its own (PWD and the like).
			_, err = execWithin(t, t.Context(), d, ExecRequest{Command: `tr '\0' '\n' < /proc/$$/environ; echo ---; env`,
				Dir: dir, Tag: tag, Env: env, Log: &log})
			if err != nil {
				t.Fatal(err)
			}
			passed, shown, ok := strings.Cut(log.String(), "---\n")
			if !ok {
				t.Fatalf("output %q", log.String())
			}
			got := parseEnvLines(passed)
			want := map[string]string{"PATH": "/usr/bin:/bin", "HOME": c.wantHome(dir), "LANG": "C.UTF-8", "TERM": "dumb",
				TagVar: tag, "PUBLIC_VAR": "public", "SECRET_VAR": "sealed"}
			maps.Copy(want, env)
			if !maps.Equal(got, want) {
				t.Fatalf("environment\n got %v\nwant %v", got, want)
			}
			child := parseEnvLines(shown)
			for _, name := range []string{"DATABASE_URL", "BERTH_SECRET_KEY", "LEAK_CANARY"} {
				if _, leaked := child[name]; leaked {
					t.Errorf("%s reached the command", name)
				}
			}
			if child[TagVar] != tag || child["HOME"] != c.wantHome(dir) {
				t.Errorf("child sees %s=%q HOME=%q", TagVar, child[TagVar], child["HOME"])
			}
		})
	}
}

func parseEnvLines(s string) map[string]string {
	m := map[string]string{}
	for line := range strings.Lines(s) {
		if k, v, ok := strings.Cut(strings.TrimSuffix(line, "\n"), "="); ok {
			m[k] = v
		}
	}
	return m
}

func TestExecTimeoutKillsTheWholeGroup(t *testing.T) {
	t.Parallel()
	d := newTestLocal(t, Options{})
	dir := workDir(t)
	res, err := execWithin(t, t.Context(), d, ExecRequest{
		Command: `sh -c 'sleep 300 & echo $! > grandchild.pid; sleep 300' & echo $! > child.pid; wait`,
		Dir:     dir, Tag: newTag(t), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut || res.Cancelled {
		t.Fatalf("result %+v, want timed out", res)
	}
	assertGone(t, res.PID, res.PID, readPidFile(t, filepath.Join(dir, "child.pid")), readPidFile(t, filepath.Join(dir, "grandchild.pid")))
}

func TestExecCancelKillsTheWholeGroup(t *testing.T) {
	t.Parallel()
	d := newTestLocal(t, Options{})
	dir := workDir(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pids := cancelWhenWritten(t, cancel, filepath.Join(dir, "child.pid"), filepath.Join(dir, "grandchild.pid"))
	res, err := execWithin(t, ctx, d, ExecRequest{
		Command: `sh -c 'sleep 300 & echo $! > grandchild.pid; wait' & echo $! > child.pid; wait`,
		Dir:     dir, Tag: newTag(t)})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Cancelled || res.TimedOut || !res.Signaled || res.ExitCode != 128+int(syscall.SIGTERM) {
		t.Fatalf("result %+v, want cancelled by SIGTERM", res)
	}
	assertGone(t, res.PID, append([]int{res.PID}, <-pids...)...)
}

func TestExecSIGKILLsWhatIgnoresSIGTERM(t *testing.T) {
	t.Parallel()
	d := newTestLocal(t, Options{Grace: 300 * time.Millisecond})
	dir := workDir(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pids := cancelWhenWritten(t, cancel, filepath.Join(dir, "sleeper.pid"))
	res, err := execWithin(t, ctx, d, ExecRequest{Command: `trap '' TERM; sleep 300 & echo $! > sleeper.pid; wait`,
		Dir: dir, Tag: newTag(t)})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Cancelled || !res.Signaled || res.ExitCode != 128+int(syscall.SIGKILL) {
		t.Fatalf("result %+v, want cancelled and SIGKILLed", res)
	}
	assertGone(t, res.PID, append([]int{res.PID}, <-pids...)...)
}

// TestExecDoesNotHangOnOutputHolders: after the command exits, processes it left holding the
// output pipe cannot keep Exec waiting.
func TestExecDoesNotHangOnOutputHolders(t *testing.T) {
	t.Parallel()
	// Each command leaves one sleeper holding stdout and writes its pid to bg.pid before exiting.
	const waitPid = `while [ ! -f bg.pid ]; do sleep 0.01; done; echo done`
	cases := []struct {
		name      string
		command   string
		survives  bool // outside both the group and the tag: Exec stops waiting for the pipe instead
		sameGroup bool
	}{
		{"background job in the group", `sleep 300 & echo $! > bg.pid; ` + waitPid, false, true},
		{"left the group, still tagged", `setsid sh -c 'echo $$ > bg.tmp; mv bg.tmp bg.pid; exec sleep 300' & ` + waitPid, false, false},
		{"left the group and dropped the tag", `setsid env -u BERTH_RUN_ID sh -c 'echo $$ > bg.tmp; mv bg.tmp bg.pid; exec sleep 300' & ` + waitPid, true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := newTestLocal(t, Options{})
			d.drainWait = 300 * time.Millisecond
			dir := workDir(t)
			var log bytes.Buffer
			res, err := execWithin(t, t.Context(), d, ExecRequest{Command: c.command, Dir: dir, Tag: newTag(t), Log: &log})
			if err != nil {
				t.Fatal(err)
			}
			bg := readPidFile(t, filepath.Join(dir, "bg.pid"))
			killLater(t, bg)
			if res.ExitCode != 0 || log.String() != "done\n" {
				t.Fatalf("result %+v, log %q", res, log.String())
			}
			if c.survives {
				if !alive(bg) {
					t.Fatalf("the untagged escaped sleeper %d is gone: the pipe-holder path was not exercised", bg)
				}
				return
			}
			assertGone(t, res.PID, bg)
		})
	}
}

func TestExecIntoLogBuffer(t *testing.T) {
	t.Parallel()
	d := newTestLocal(t, Options{})
	log := NewLogBuffer(LogOptions{Limit: 4096})
	res, err := execWithin(t, t.Context(), d, ExecRequest{Command: "head -c 100000 /dev/zero; echo tail >&2",
		Dir: workDir(t), Tag: newTag(t), Log: log})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("result %+v, err %v", res, err)
	}
	kept := log.Bytes()
	if log.Total() != 100005 || !log.Truncated() || !strings.Contains(string(kept), "… 95909 bytes omitted …\n") ||
		!strings.HasSuffix(string(kept), "tail\n") {
		t.Fatalf("log total %d truncated %v kept %d bytes ending %q", log.Total(), log.Truncated(), len(kept), kept[max(0, len(kept)-40):])
	}
}

func TestExecRefusesBadRequests(t *testing.T) {
	t.Parallel()
	d := newTestLocal(t, Options{})
	dir := workDir(t)
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(dir, "ran")
	ok := ExecRequest{Command: "touch " + marker, Dir: dir, Tag: newTag(t)}
	cases := []struct {
		name string
		edit func(*ExecRequest)
	}{
		{"empty command", func(r *ExecRequest) { r.Command = "  " }},
		{"NUL in command", func(r *ExecRequest) { r.Command += "\x00" }},
		{"relative dir", func(r *ExecRequest) { r.Dir = "relative" }},
		{"missing dir", func(r *ExecRequest) { r.Dir = filepath.Join(dir, "missing") }},
		{"dir is a file", func(r *ExecRequest) { r.Dir = file }},
		{"empty tag", func(r *ExecRequest) { r.Tag = "" }},
		{"newline in tag", func(r *ExecRequest) { r.Tag = "a\nb" }},
		{"negative timeout", func(r *ExecRequest) { r.Timeout = -time.Second }},
		{"= in env name", func(r *ExecRequest) { r.Env = map[string]string{"A=B": "c"} }},
		{"empty env name", func(r *ExecRequest) { r.Env = map[string]string{"": "c"} }},
		{"NUL in env value", func(r *ExecRequest) { r.Env = map[string]string{"A": "\x00"} }},
		{"env contradicts the tag", func(r *ExecRequest) { r.Env = map[string]string{TagVar: "other"} }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := ok
			c.edit(&req)
			res, err := d.Exec(t.Context(), req)
			if !errors.Is(err, ErrInvalidRequest) || !res.Started.IsZero() || res.PID != 0 {
				t.Fatalf("Exec = %+v, %v; want ErrInvalidRequest and nothing started", res, err)
			}
		})
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if res, err := d.Exec(ctx, ok); !errors.Is(err, context.Canceled) || res.PID != 0 {
		t.Fatalf("Exec with an ended context = %+v, %v", res, err)
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused command ran: %v", err)
	}
	// The control: the unedited request does run.
	if res, err := d.Exec(t.Context(), ok); err != nil || res.ExitCode != 0 {
		t.Fatalf("valid request: %+v, %v", res, err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatal(err)
	}
}

func TestProbe(t *testing.T) {
	t.Parallel()
	dir := workDir(t)
	res, err := newTestLocal(t, Options{ProbeDir: dir}).Probe(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]CheckStatus{}
	for _, c := range res.Checks {
		status[c.Name] = c.Status
		if strings.Contains(c.Detail, dir) || strings.Contains(res.Summary, dir) {
			t.Errorf("probe output names the host path: %q / %q", c.Detail, res.Summary)
		}
	}
	want := map[string]CheckStatus{"shell": CheckPass, "scratch_dir": CheckPass, "os": CheckInfo, "bubblewrap": CheckInfo}
	if !res.OK || !maps.Equal(status, want) || !strings.Contains(res.Summary, "Linux") {
		t.Fatalf("probe = %+v", res)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("probe left %v behind", left)
	}

	bad, err := newTestLocal(t, Options{ProbeDir: filepath.Join(dir, "missing")}).Probe(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if bad.OK || !strings.Contains(bad.Summary, "scratch_dir") {
		t.Fatalf("probe of a missing directory = %+v", bad)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := newTestLocal(t, Options{ProbeDir: dir}).Probe(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("probe with an ended context: %v", err)
	}
}
