package environment

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startDetached starts `sh -c script` in a session of its own with exactly env, reaped by the test.
func startDetached(t *testing.T, dir, script string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-done:
		case <-time.After(testDeadline):
			t.Errorf("process %d was not reaped", cmd.Process.Pid)
		}
	})
	return cmd
}

func TestFindAndKillTagged(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tag := testTag()
	// Group A mixes tagged processes (one ignoring SIGTERM) with an untagged one; group B is
	// wholly tagged; C is untagged and D only looks like it is tagged.
	a := startDetached(t, dir, `sleep 300 & (trap '' TERM; exec sleep 300) & env -u BERTH_RUN_ID sleep 300 & echo $! > untagged.pid; wait`,
		TagVar+"="+tag)
	b := startDetached(t, dir, `sleep 300 & wait`, TagVar+"="+tag)
	c := startDetached(t, dir, `exec sleep 300`)
	d := startDetached(t, dir, `exec sleep 300`, TagVar+"="+tag+"-x", "NOT_"+TagVar+"="+tag)
	untagged := readPidFile(t, filepath.Join(dir, "untagged.pid"))
	// Until env has dropped the tag and exec'd sleep, the untagged child is a fork of the tagged
	// shell, tag and all (a loaded machine once caught it there).
	waitFor(t, "the untagged child to run sleep", func() bool {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", untagged))
		return strings.HasPrefix(string(cmdline), "sleep\x00")
	})

	var found []int
	waitFor(t, "five tagged processes", func() bool {
		var err error
		found, err = FindTagged(tag)
		if err != nil {
			t.Fatal(err)
		}
		return len(found) == 5
	})
	for _, pid := range []int{a.Process.Pid, b.Process.Pid} {
		if !slices.Contains(found, pid) {
			t.Fatalf("FindTagged = %v, missing tagged %d", found, pid)
		}
	}
	spared := []int{untagged, c.Process.Pid, d.Process.Pid}
	for _, pid := range spared {
		if slices.Contains(found, pid) {
			t.Fatalf("FindTagged = %v, includes untagged %d", found, pid)
		}
	}

	killed, err := KillTagged(t.Context(), tag, 300*time.Millisecond)
	if err != nil || killed != 5 {
		t.Fatalf("KillTagged = %d, %v; want 5 killed", killed, err)
	}
	for _, pid := range found {
		if alive(pid) {
			t.Errorf("tagged process %d survived", pid)
		}
	}
	for _, pid := range spared {
		if !alive(pid) {
			t.Errorf("untagged process %d was killed", pid)
		}
	}
	if left, err := FindTagged(tag); err != nil || len(left) != 0 {
		t.Fatalf("after KillTagged, FindTagged = %v, %v", left, err)
	}
	if n, err := KillTagged(t.Context(), tag, time.Second); err != nil || n != 0 {
		t.Fatalf("KillTagged with nothing left = %d, %v", n, err)
	}
}

func TestTaggedRefusesBadTags(t *testing.T) {
	t.Parallel()
	for _, tag := range []string{"", "a\x00b", "a\nb", strings.Repeat("x", 257)} {
		if _, err := FindTagged(tag); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("FindTagged(%q) = %v", tag, err)
		}
		if _, err := KillTagged(t.Context(), tag, 0); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("KillTagged(%q) = %v", tag, err)
		}
	}
}

// uptimeTicks is the time since boot in clock ticks (USER_HZ is 100 on Linux), read from
// /proc/uptime, independently of /proc/<pid>/stat.
func uptimeTicks(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		t.Fatal(err)
	}
	f, err := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(f * 100)
}

// startedWithin starts a process running script and checks that its start time lies between the
// uptimes read just before and after, which pins ProcessStartTime to field 22.
func startedWithin(t *testing.T, script string) (*exec.Cmd, uint64) {
	t.Helper()
	before := uptimeTicks(t)
	cmd := startDetached(t, t.TempDir(), script)
	after := uptimeTicks(t)
	st, err := ProcessStartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if st+2 < before || st > after+2 {
		t.Fatalf("start time %d outside [%d, %d]", st, before, after)
	}
	return cmd, st
}

func TestProcessStartTime(t *testing.T) {
	t.Parallel()
	first, st1 := startedWithin(t, "exec sleep 300")
	if again, err := ProcessStartTime(first.Process.Pid); err != nil || again != st1 {
		t.Fatalf("second reading %d, %v; want %d", again, err, st1)
	}
	// A process started a few ticks later has a later start time.
	waitFor(t, "the clock to move on", func() bool { return uptimeTicks(t) > st1+2 })
	second, st2 := startedWithin(t, "exec sleep 300")
	if st2 <= st1 || second.Process.Pid == first.Process.Pid {
		t.Fatalf("start times %d then %d", st1, st2)
	}
}

func TestProcessStartTimeOddCommandName(t *testing.T) {
	t.Parallel()
	// The shell renames itself so that its stat line holds ") (" and spaces in the name field.
	dir := t.TempDir()
	before := uptimeTicks(t)
	cmd := startDetached(t, dir, `printf ') (x 1 2' > /proc/$$/comm; echo $$ > renamed.pid; sleep 300`)
	readPidFile(t, filepath.Join(dir, "renamed.pid"))
	if name, _ := procStatus(cmd.Process.Pid, "Name"); name != ") (x 1 2" {
		t.Fatalf("comm is %q: the rename did not happen", name)
	}
	st, err := ProcessStartTime(cmd.Process.Pid)
	if err != nil || st+2 < before || st > uptimeTicks(t)+2 {
		t.Fatalf("ProcessStartTime = %d, %v (uptime before start %d)", st, err, before)
	}
}

func TestProcessStartTimeOfNoProcess(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{cmd.Process.Pid, 0, -1} {
		if _, err := ProcessStartTime(pid); !errors.Is(err, ErrNoProcess) {
			t.Errorf("ProcessStartTime(%d) = %v, want ErrNoProcess", pid, err)
		}
	}
}
