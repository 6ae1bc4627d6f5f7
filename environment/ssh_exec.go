package environment

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"
)

// execWrapper is what an ssh Exec runs on the remote host ($1 terminator, $2 grace in tenths,
// $3 the name of its process record). It reads the run's variables and the command from its
// standard input up to the terminator line (so no value is in an argv, in the ssh protocol's
// environment or in a file), clears the environment sshd gave it, and starts the command with
// setsid: its own session and process group, recorded as "pgid starttime" under <base>/.run for
// Release. The command's first output line is "berth-pgid N" (from the new leader, before its
// exec). A watchdog on the wrapper's standard input stops the group when Berth closes it or the
// connection goes; when the leader exits, what is left of its group is stopped too. The wrapper's
// own standard error (the command's goes to its output) says "berth-not-gone" if the group
// survived SIGKILL.
const execWrapper = `berth_term=$1 berth_grace=$2 berth_name=$3
berth_path=$PATH berth_home=$HOME
berth_setsid=$(command -v setsid 2>/dev/null) || berth_setsid=
for berth_v in $(env | sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p'); do
	case "$berth_v" in berth_*) continue ;; esac
	unset "$berth_v" 2>/dev/null || :
done
berth_pre= berth_ok=
while IFS= read -r berth_line; do
	if [ "$berth_line" = "$berth_term" ]; then berth_ok=1; break; fi
	berth_pre="$berth_pre$berth_line
"
done
if [ -z "$berth_ok" ]; then echo "berth-error: the command's environment did not arrive"; exit 125; fi
export PATH="$berth_path" HOME="$berth_home" LANG=C.UTF-8 TERM=dumb
berth_dir= berth_cmd=
eval "$berth_pre"
berth_pre=
if [ -z "$berth_setsid" ]; then echo "berth-error: setsid is not installed on the remote host"; exit 125; fi
if ! cd "$berth_dir" 2>/dev/null; then echo "berth-error: the directory does not exist on the remote host"; exit 125; fi
mkdir -p "$base/.run" 2>/dev/null
berth_rec=$base/.run/$berth_name
exec 3<&0
"$berth_setsid" /bin/sh -c 's=$(cut -d" " -f22 /proc/$$/stat 2>/dev/null); echo "$$ ${s:--}" >"$2" 2>/dev/null; echo "berth-pgid $$"; exec /bin/sh -c "$1"' berth "$berth_cmd" "$berth_rec" </dev/null 2>&1 &
berth_pid=$!
berth_cmd=
{ while IFS= read -r berth_l; do :; done; berth_stop "$berth_pid" "$berth_grace" || echo berth-not-gone >&2; } <&3 &
berth_dog=$!
exec 3<&-
wait "$berth_pid"
berth_rc=$?
kill "$berth_dog" 2>/dev/null
berth_stop "$berth_pid" "$berth_grace" || echo berth-not-gone >&2
rm -f "$berth_rec"
exit "$berth_rc"
`

// stopScript ($1 pgid, $2 grace) stops one process group, for a cancel or a timeout.
const stopScript = `berth_stop "$1" "$2"`

// Exec runs /bin/sh -c Command in Dir on the remote host, in a new session and process group of
// its own there, with exactly the base variables (the remote PATH and HOME, LANG=C.UTF-8,
// TERM=dumb), the environment's variables, Env and BERTH_RUN_ID=Tag, passed on the session's
// standard input. Its output (stdout and stderr together) goes to Log. On a timeout or the end
// of ctx the group gets SIGTERM, then SIGKILL after the grace, over a second session (Timeout
// counts from the command's start on the remote host); if Berth's
// connection goes instead, the remote wrapper stops the group itself. Exec returns once the
// remote wrapper has seen the group gone. PID is the remote leader's pid.
func (d *sshDriver) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	res := ExecResult{ExitCode: -1}
	term := "berth-end-" + randomHex(16)
	pre, err := d.preamble(req, term)
	if err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	ref, name := d.rootOf(req.Dir)
	cl, s, err := d.session(ctx, ref)
	if err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	defer s.Close()
	stdin, err := s.StdinPipe()
	if err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	stdout, err := s.StdoutPipe()
	if err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	log := &syncWriter{w: req.Log}
	wrapperErr := &tailBuffer{max: 4 << 10}
	s.Stderr = wrapperErr
	record := name + "." + randomHex(8)
	if err := s.Start(remoteCommand(d.script(execWrapper), term, d.graceTenths(), record)); err != nil {
		return res, fmt.Errorf("exec: start: %w", err)
	}
	// The preamble is small; a server that does not read it makes the write fail, not hang,
	// once the session is closed below.
	wrote := make(chan error, 1)
	go func() {
		_, err := io.WriteString(stdin, pre)
		wrote <- err
	}()

	firstLine := make(chan string, 1)
	copied := make(chan error, 1)
	go func() {
		br := bufio.NewReaderSize(stdout, 64<<10)
		line, err := br.ReadString('\n')
		firstLine <- line
		if err != nil {
			copied <- nil
			return
		}
		copied <- drain(br, log)
	}()
	waited := make(chan error, 1)
	go func() { waited <- s.Wait() }()

	var timeout <-chan time.Time // runs from the command's start on the remote host
	var (
		waitErr  error
		exited   bool
		startErr error
		stopped  bool // a stop session was started
		giveUp   <-chan time.Time
		done     = ctx.Done()
		stopping bool
	)
	stop := func() {
		stopping, done, timeout = true, nil, nil
		_ = stdin.Close() // the remote watchdog stops the group even if the stop session fails
		if res.PID > 0 && !stopped {
			stopped = true
			d.stopGroup(ctx, ref, res.PID)
		}
		gt := time.NewTimer(d.grace + killWait + 5*time.Second)
		giveUp = gt.C
	}
	// onLine reads the wrapper's first line: the leader's pid, or why the command did not start.
	onLine := func(line string) {
		pgid, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "berth-pgid ")
		n, err := strconv.Atoi(pgid)
		switch {
		case ok && err == nil && n > 1:
			res.PID, res.Started = n, time.Now()
			if req.Timeout > 0 && !stopping && !exited {
				t := time.NewTimer(req.Timeout)
				timeout = t.C
			}
			if req.OnStart != nil {
				req.OnStart(n)
			}
			if stopping && !stopped && !exited {
				stopped = true
				d.stopGroup(ctx, ref, n)
			}
		case strings.HasPrefix(line, "berth-error: "):
			startErr = fmt.Errorf("%s: %w", strings.TrimSpace(strings.TrimPrefix(line, "berth-error: ")), ErrInvalidRequest)
		default:
			startErr = errors.New("the remote wrapper did not start the command")
		}
	}
	// exitedNow takes an exit that raced a deadline: it still counts as an exit.
	exitedNow := func() bool {
		select {
		case waitErr = <-waited:
			exited = true
		default:
		}
		return exited
	}
	for !exited {
		select {
		case line := <-firstLine:
			firstLine = nil
			onLine(line)
		case err := <-wrote:
			wrote = nil
			if err != nil && !stopping {
				startErr = fmt.Errorf("send the command: %w", err)
			}
		case waitErr = <-waited:
			exited = true
		case <-done:
			if !exitedNow() {
				res.Cancelled = true
				stop()
			}
		case <-timeout:
			if !exitedNow() {
				res.TimedOut = true
				stop()
			}
		case <-giveUp:
			// The remote end did not finish: the connection is dropped, which also makes the
			// remote watchdog stop the group.
			d.dropClient(ref, cl)
			res.Finished = time.Now()
			return res, fmt.Errorf("exec: the remote command did not end after SIGKILL: %w", ErrNotGone)
		}
	}
	_ = stdin.Close()
	var logErr error
	select {
	case logErr = <-copied:
	case <-time.After(d.drainWait):
		_ = s.Close()
		logErr = <-copied
	}
	if firstLine != nil { // the session ended before the loop read the first line
		onLine(<-firstLine)
	}
	// The wrapper's own messages (a shell error, the survivors' marker) follow the output.
	notGone := false
	for line := range strings.Lines(wrapperErr.String()) {
		if strings.TrimSpace(line) == "berth-not-gone" {
			notGone = true
		} else {
			_, _ = io.WriteString(log, line)
		}
	}
	res.Finished = time.Now()
	if res.Started.IsZero() {
		if stopping && res.Cancelled { // stopped while it was starting
			return res, fmt.Errorf("exec: %w", context.Cause(ctx))
		}
		if startErr == nil {
			startErr = fmt.Errorf("the session ended before the command started: %w", waitErr)
		}
		return res, fmt.Errorf("exec: %w", startErr)
	}
	statusErr := sshExitStatus(&res, waitErr)
	if statusErr != nil {
		d.dropClient(ref, cl)
	}
	if notGone {
		statusErr = errors.Join(statusErr, fmt.Errorf("the remote process group: %w", ErrNotGone))
	}
	if err := errors.Join(statusErr, logErr); err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	return res, nil
}

// stopGroup stops the remote group pgid over a second session, in the background. Its outcome
// is the wrapper's to report: the wrapper only ends once the group is gone.
func (d *sshDriver) stopGroup(ctx context.Context, ref string, pgid int) {
	go func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.grace+killWait+5*time.Second)
		defer cancel()
		_, _ = d.run(sctx, ref, d.script(stopScript), nil, nil, strconv.Itoa(pgid), d.graceTenths())
	}()
}

// dropClient drops the connection of ref if it is still cl.
func (d *sshDriver) dropClient(ref string, cl *ssh.Client) {
	d.mu.Lock()
	c := d.conns[ref]
	d.mu.Unlock()
	if c != nil && c.client == cl {
		d.drop(ref, c)
	}
}

// sshExitStatus fills the exit code from the session's end; an end without an exit status (a
// lost connection) is an error.
func sshExitStatus(res *ExecResult, waitErr error) error {
	var ee *ssh.ExitError
	switch {
	case waitErr == nil:
		res.ExitCode = 0
	case errors.As(waitErr, &ee):
		res.ExitCode = ee.ExitStatus()
		if sig := ee.Signal(); sig != "" {
			res.Signaled = true
			if n := unix.SignalNum("SIG" + sig); n != 0 {
				res.ExitCode = 128 + int(n)
			}
		}
	default:
		return fmt.Errorf("the connection ended before the command's exit status: %w", waitErr)
	}
	return nil
}

// rootOf finds the realized workspace that holds dir: its instance (whose connection the command
// uses) and its name (for the process record). A directory outside every realized workspace
// uses the driver's own connection.
func (d *sshDriver) rootOf(dir string) (ref, name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for root, r := range d.roots {
		if dir == root || strings.HasPrefix(dir, root+"/") {
			return r.instance, r.name
		}
	}
	return "", "_"
}

// preamble checks req and writes what the remote wrapper reads from standard input: one
// `export NAME='value'` per variable, the directory and the command, then the terminator line.
func (d *sshDriver) preamble(req ExecRequest, term string) (string, error) {
	if strings.TrimSpace(req.Command) == "" || strings.ContainsRune(req.Command, 0) {
		return "", fmt.Errorf("command must be non-empty without NUL: %w", ErrInvalidRequest)
	}
	if !path.IsAbs(req.Dir) || strings.ContainsRune(req.Dir, 0) {
		return "", fmt.Errorf("dir must be an absolute path: %w", ErrInvalidRequest)
	}
	if err := checkTag(req.Tag); err != nil {
		return "", err
	}
	if req.Timeout < 0 {
		return "", fmt.Errorf("timeout must not be negative: %w", ErrInvalidRequest)
	}
	vars := maps.Clone(d.env)
	for k, v := range req.Env {
		if !envNamePattern.MatchString(k) || strings.ContainsRune(v, 0) {
			return "", fmt.Errorf("env %q: names must be shell identifiers, values without NUL: %w", k, ErrInvalidRequest)
		}
		if k == TagVar && v != req.Tag {
			return "", fmt.Errorf("env %s differs from the tag: %w", TagVar, ErrInvalidRequest)
		}
		vars[k] = v
	}
	vars[TagVar] = req.Tag
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		if strings.HasPrefix(k, "berth_") {
			return "", fmt.Errorf("env %q: names starting with berth_ are the wrapper's: %w", k, ErrInvalidRequest)
		}
		b.WriteString("export " + k + "=" + shellQuote(vars[k]) + "\n")
	}
	b.WriteString("berth_dir=" + shellQuote(req.Dir) + "\n")
	b.WriteString("berth_cmd=" + shellQuote(req.Command) + "\n")
	pre := b.String()
	if strings.Contains("\n"+pre, "\n"+term+"\n") {
		return "", fmt.Errorf("a value holds the terminator line: %w", ErrInvalidRequest)
	}
	return pre + term + "\n", nil
}

// syncWriter serializes writes from the output and error streams to one log (nil discards).
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	if s.w == nil {
		return len(p), nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
