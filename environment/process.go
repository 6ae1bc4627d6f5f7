package environment

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// TagVar is the environment variable that marks every process Berth starts for a run; its value is
// the run id. Orphan sweeps find a dead executor's processes by it.
const TagVar = "BERTH_RUN_ID"

const (
	// killWait bounds how long stopping waits for processes to vanish after SIGKILL.
	killWait = 10 * time.Second
	// pollEvery is how often stopping looks again whether the processes are gone.
	pollEvery = 10 * time.Millisecond
	// maxEnviron caps how much of one process's environment a scan reads (Linux caps argv plus
	// environ at 6 MiB).
	maxEnviron = 8 << 20
)

// FindTagged lists the live processes whose environment holds BERTH_RUN_ID=tag exactly, sorted,
// never Berth itself. Processes that exit or cannot be read during the scan are skipped.
func FindTagged(tag string) ([]int, error) {
	if err := checkTag(tag); err != nil {
		return nil, fmt.Errorf("find tagged: %w", err)
	}
	procs, err := scanProcs(tag)
	if err != nil {
		return nil, fmt.Errorf("find tagged: %w", err)
	}
	var pids []int
	for _, p := range procs {
		if p.tagged {
			pids = append(pids, p.pid)
		}
	}
	return pids, nil
}

// KillTagged stops every process tagged BERTH_RUN_ID=tag: SIGTERM, up to grace for them to exit,
// then SIGKILL until none is left. A process group is signalled as a whole only when every live
// member carries the tag, so an untagged process is never hit (Berth's own group never is). It
// returns how many processes it signalled; ErrNotGone if some survived the deadline, or ctx's error
// if ctx ended first (SIGKILL has then been sent to what was found).
func KillTagged(ctx context.Context, tag string, grace time.Duration) (killed int, err error) {
	if err := checkTag(tag); err != nil {
		return 0, fmt.Errorf("kill tagged: %w", err)
	}
	n, err := stopProcesses(ctx, 0, tag, grace)
	if err != nil {
		return n, fmt.Errorf("kill tagged: %w", err)
	}
	return n, nil
}

// ProcessStartTime is when pid started, in clock ticks since boot (field 22 of /proc/<pid>/stat).
// A pid with the same start time is the same process, which defeats pid reuse.
func ProcessStartTime(pid int) (uint64, error) {
	st, err := readStat(pid)
	if err != nil {
		return 0, fmt.Errorf("process start time: %w", err)
	}
	return st.start, nil
}

func checkTag(tag string) error {
	if tag == "" || len(tag) > 256 || strings.ContainsAny(tag, "\x00\n") {
		return fmt.Errorf("tag must be 1 to 256 bytes without NUL or newline: %w", ErrInvalidRequest)
	}
	return nil
}

// procStat is what Berth reads from /proc/<pid>/stat.
type procStat struct {
	state byte   // R, S, D, Z, X, …
	pgid  int    // process group
	start uint64 // start time in clock ticks since boot
}

// live reports whether the process still runs: a zombie is dead and only waits to be reaped
// (possibly by an init that never reaps), so it does not count.
func (s procStat) live() bool { return s.state != 'Z' && s.state != 'X' && s.state != 'x' }

// readStat parses /proc/<pid>/stat. The command name is in parentheses and may itself hold spaces
// and parentheses, so fields are counted from the last ')'.
func readStat(pid int) (procStat, error) {
	if pid <= 0 {
		return procStat{}, fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return procStat{}, fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
		}
		return procStat{}, err
	}
	return parseStat(b)
}

func parseStat(b []byte) (procStat, error) {
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return procStat{}, errors.New("malformed /proc stat")
	}
	// After ")": field 3 (state) is f[0], field 5 (pgrp) f[2], field 22 (starttime) f[19].
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, errors.New("malformed /proc stat")
	}
	pgid, err := strconv.Atoi(f[2])
	if err != nil {
		return procStat{}, fmt.Errorf("malformed /proc stat pgrp: %w", err)
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("malformed /proc stat starttime: %w", err)
	}
	return procStat{state: f[0][0], pgid: pgid, start: start}, nil
}

// proc is one live process seen by a scan.
type proc struct {
	pid    int
	stat   procStat
	tagged bool
}

// scanProcs lists every live process but Berth itself, marking those tagged with tag (none when
// tag is ""). It reads only /proc/<pid>/stat and /proc/<pid>/environ by number (never through a
// process's root or cwd links), and skips any process it cannot read: one that exited, belongs to
// a user Berth may not inspect, or is a kernel thread.
func scanProcs(tag string) ([]proc, error) {
	d, err := os.Open("/proc")
	if err != nil {
		return nil, fmt.Errorf("scan processes: %w", err)
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil, fmt.Errorf("scan processes: %w", err)
	}
	self := os.Getpid()
	var needle []byte
	if tag != "" {
		needle = []byte(TagVar + "=" + tag)
	}
	var out []proc
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid <= 1 || pid == self {
			continue
		}
		st, err := readStat(pid)
		if err != nil || !st.live() {
			continue
		}
		p := proc{pid: pid, stat: st}
		if needle != nil {
			p.tagged = environHas(pid, needle)
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b proc) int { return a.pid - b.pid })
	return out, nil
}

// environHas reports whether the process's initial environment holds the entry exactly.
func environHas(pid int, entry []byte) bool {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxEnviron))
	if err != nil {
		return false
	}
	for len(b) > 0 {
		var e []byte
		if i := bytes.IndexByte(b, 0); i >= 0 {
			e, b = b[:i], b[i+1:]
		} else {
			e, b = b, nil
		}
		if bytes.Equal(e, entry) {
			return true
		}
	}
	return false
}

// scanProcsCtx is scanProcs bounded by ctx: reading a process's environ can block while that
// process's memory map is locked (a hung FUSE or NFS page fault), and stopping must not hang on it.
// On ctx's end the scan is abandoned (its goroutine finishes in the background).
func scanProcsCtx(ctx context.Context, tag string) ([]proc, error) {
	type result struct {
		procs []proc
		err   error
	}
	ch := make(chan result, 1)
	go func() {
		p, err := scanProcs(tag)
		ch <- result{p, err}
	}()
	select {
	case r := <-ch:
		return r.procs, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// procKey identifies a process across scans despite pid reuse.
type procKey struct {
	pid   int
	start uint64
}

// stopProcesses stops the process group pgid (when > 0) and every process tagged tag (when not
// ""): SIGTERM, up to grace for them to go (late arrivals get SIGTERM too), then SIGKILL until
// a scan finds none, at most killWait. ctx ending cuts the grace short; SIGKILL is still sent, and
// ctx's error returned if processes remain. It returns how many processes it signalled.
func stopProcesses(ctx context.Context, pgid int, tag string, grace time.Duration) (int, error) {
	ownGroup := syscall.Getpgrp()
	signalled := map[procKey]bool{}
	// round scans, signals the targets not yet signalled with sig (all of them when again is set),
	// and reports whether any target was left.
	round := func(ctx context.Context, sig syscall.Signal, again bool) (bool, error) {
		procs, err := scanProcsCtx(ctx, tag)
		if err != nil {
			return true, err
		}
		targets := stopTargets(procs, pgid, ownGroup)
		if len(targets) == 0 {
			return false, nil
		}
		var fresh []proc
		for _, t := range targets {
			k := procKey{t.pid, t.stat.start}
			if again || !signalled[k] {
				fresh = append(fresh, t)
			}
			signalled[k] = true
		}
		signalTargets(fresh, procs, pgid, ownGroup, sig)
		return true, nil
	}

	// The grace bounds the scans too, so a scan stuck on one process cannot delay SIGKILL.
	tctx, cancelTerm := context.WithTimeout(ctx, grace)
	defer cancelTerm()
	for {
		left, err := round(tctx, syscall.SIGTERM, false)
		if err == nil && !left {
			return len(signalled), nil
		}
		if err != nil || tctx.Err() != nil {
			break
		}
		sleepCtx(tctx, pollEvery)
	}

	// SIGKILL needs no cooperation, so this phase runs under its own deadline even when ctx has
	// ended: the kill is always sent, and only the verification gives up early on ctx.
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killWait)
	defer cancel()
	if pgid > 0 && pgid != ownGroup {
		_ = syscall.Kill(-pgid, syscall.SIGKILL) // even if the scans keep failing
	}
	for {
		left, err := round(kctx, syscall.SIGKILL, true)
		if err == nil && !left {
			return len(signalled), nil
		}
		if kctx.Err() != nil {
			return len(signalled), fmt.Errorf("%d process(es): %w", len(signalled), ErrNotGone)
		}
		if ctx.Err() != nil {
			return len(signalled), ctx.Err()
		}
		sleepCtx(kctx, pollEvery)
	}
}

// stopTargets are the live processes in group pgid or tagged, never in Berth's own group.
func stopTargets(procs []proc, pgid, ownGroup int) []proc {
	var out []proc
	for _, p := range procs {
		if p.stat.pgid == ownGroup {
			continue
		}
		if p.tagged || (pgid > 0 && p.stat.pgid == pgid) {
			out = append(out, p)
		}
	}
	return out
}

// signalTargets sends sig to each target. The group pgid is Berth's own creation and is signalled
// whole (that also catches children forked since the scan). Another group is signalled whole only
// if every live member is a target; otherwise each target gets the signal alone, so untagged
// processes sharing a group with tagged ones are spared.
func signalTargets(targets, all []proc, pgid, ownGroup int, sig syscall.Signal) {
	isTarget := map[int]bool{}
	for _, t := range targets {
		isTarget[t.pid] = true
	}
	whole := map[int]bool{} // group -> every live member is a target
	for _, p := range all {
		g := p.stat.pgid
		if _, seen := whole[g]; !seen {
			whole[g] = true
		}
		if !isTarget[p.pid] {
			whole[g] = false
		}
	}
	sentGroup := map[int]bool{}
	for _, t := range targets {
		g := t.stat.pgid
		if g > 1 && g != ownGroup && (g == pgid || whole[g]) {
			if !sentGroup[g] {
				sentGroup[g] = true
				_ = syscall.Kill(-g, sig) // ESRCH: the group is already gone
			}
			continue
		}
		_ = syscall.Kill(t.pid, sig)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
