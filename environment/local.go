package environment

import (
	"berth/environment/jail"
	"berth/environment/netns"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

const (
	// defaultPath is PATH for commands when Berth itself has none.
	defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// drainWait is how long Exec waits for the output pipe to close once every process it knows of
	// is gone; after it, the read side is closed (a process that left both the group and the tag
	// behind may still hold the pipe, and must not hold Exec).
	drainWait = 2 * time.Second
	// probeTimeout bounds the probe's test command.
	probeTimeout = 10 * time.Second
)

// local runs commands on this host as Berth's own user, each in a session and process group of its
// own, with a cleared environment. It has one instance, this node; realizing and syncing are
// nothing to do because package workspace already put the workspace on this host's disk.
type local struct {
	env       map[string]string // the environment's configured variables, secret values resolved
	jail      *jail.Host        // nil: bubblewrap missing (contained runs are refused)
	contained bool              // false only for "containment": "none", an instance admin's choice
	networks  *netns.Networks   // this node's workspace namespaces; nil when Berth is not root
	caBundle  string            // Options.CABundle
	masks     []string
	dataDir   string
	grace     time.Duration
	home      string // "" = the command's Dir
	path      string
	probeDir  string
	drainWait time.Duration
	onHost
}

func newLocal(cfg Config, opts Options) (*local, error) {
	env, err := configuredEnv(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("new local driver: %w", err)
	}
	d := &local{env: env, grace: opts.Grace, home: opts.Home, path: opts.Path, probeDir: opts.ProbeDir,
		drainWait: drainWait, jail: opts.Jail, contained: cfg.Containment != ContainmentNone,
		masks: append(slices.Clone(opts.Masks), cfg.Masks...), dataDir: opts.DataDir, networks: opts.Networks, caBundle: opts.CABundle}
	if d.grace <= 0 {
		d.grace = DefaultGrace
	}
	if d.home != "" && !filepath.IsAbs(d.home) {
		return nil, fmt.Errorf("new local driver: home must be an absolute path: %w", ErrInvalidRequest)
	}
	if d.path == "" {
		d.path = absolutePath(os.Getenv("PATH"))
	}
	if d.path == "" {
		d.path = defaultPath
	}
	if d.probeDir == "" {
		d.probeDir = os.TempDir()
	}
	d.onHost = newOnHost(DriverLocal, opts.NodeID)
	return d, nil
}

// absolutePath keeps the absolute entries of a PATH list: a relative one ("", ".") would let a
// workspace's own files shadow system commands.
func absolutePath(list string) string {
	var keep []string
	for _, dir := range filepath.SplitList(list) {
		if filepath.IsAbs(dir) {
			keep = append(keep, dir)
		}
	}
	return strings.Join(keep, string(filepath.ListSeparator))
}

// Exec runs /bin/sh -c Command in a new session (hence its own process group, with no controlling
// terminal and no way to join Berth's process groups), stdin /dev/null, stdout and stderr on one
// pipe to Log. When the command ends, times out or ctx ends, what is left of its group and every
// process tagged with its Tag gets SIGTERM, then SIGKILL after the grace; Exec returns once they
// are gone and the output is drained (at most drainWait more if an untagged process outside the
// group still holds the pipe). Cleanup runs even after ctx has ended.
func (d *local) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	res := ExecResult{ExitCode: -1}
	env, err := d.environ(req)
	if err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	cmd, start, done, err := d.command(req, env)
	if err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	defer done()
	return runCommand(ctx, cmd, start, req, d.grace, d.drainWait, d.contained)
}

// command is the process of one Exec: the jail of the local profile (docs/security.md), in the
// workspace's network namespace (req.Network), or for an uncontained environment /bin/sh itself.
// start starts it; done releases what starting needed (the jail's data pipes, the namespace).
func (d *local) command(req ExecRequest, env []string) (cmd *exec.Cmd, start func() error, done func(), err error) {
	if !d.contained {
		cmd := &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", req.Command}, Dir: req.Dir, Env: env,
			// Setsid gives a new session and process group (pgid = pid). Pdeathsig only takes the
			// leader down with Berth; the rest is for the orphan sweep, by tag. (Linux sends it
			// when the forking thread ends, so Berth must not end threads: no LockOSThread
			// without Unlock.)
			SysProcAttr: &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}}
		return cmd, cmd.Start, func() {}, nil
	}
	if d.jail == nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", jail.Fix, ErrDriverUnavailable)
	}
	vars := envMap(env)
	maps.Copy(vars, req.Git.Env)
	home := req.Home
	if home == "" {
		home = d.home
	}
	spec := jail.Spec{Profile: jail.Local, Bwrap: d.jail.Bwrap, Workspace: req.Dir, Home: home, Masks: d.masks,
		ReadOnly: req.Git.ReadOnly, ReadWrite: req.Git.ReadWrite, Env: vars, Command: req.Command}
	if home == "" {
		delete(spec.Env, "HOME") // the jail's private /tmp
	}
	n, err := jailNet(d.networks, req.Network, true, d.caBundle)
	if err != nil {
		return nil, nil, nil, err
	}
	cmd, start, done, err = startJail(*d.jail, spec, d.dataDir, req.Git.Store, n)
	if err != nil {
		n.release()
	}
	return cmd, start, done, err
}

// runCommand starts cmd with its output on one pipe to req.Log and waits for its end, a timeout or
// ctx, then stops what is left of its group and its tag (see Exec).
func runCommand(ctx context.Context, cmd *exec.Cmd, start func() error, req ExecRequest, grace, drainWait time.Duration, jailed bool) (ExecResult, error) {
	res := ExecResult{ExitCode: -1}
	pr, pw, err := os.Pipe()
	if err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	defer pr.Close()
	cmd.Stdout, cmd.Stderr = pw, pw // an *os.File: the child gets the fd itself, Wait copies nothing
	started := time.Now()
	err = start()
	pw.Close()
	if err != nil {
		return res, fmt.Errorf("exec: start: %w", err)
	}
	res.Started, res.PID = started, cmd.Process.Pid
	copied := make(chan error, 1)
	go func() { copied <- drain(pr, req.Log) }()
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	if req.OnStart != nil {
		req.OnStart(res.PID)
	}

	var timeout <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	var waitErr error
	exited := false
	select {
	case waitErr = <-waited:
		exited = true
	case <-ctx.Done():
		res.Cancelled = true
	case <-timeout:
		res.TimedOut = true
	}
	if !exited { // an exit that raced the deadline still counts as an exit
		select {
		case waitErr = <-waited:
			exited, res.Cancelled, res.TimedOut = true, false, false
		default:
		}
	}

	// Background processes do not outlive their command, whatever the way it ended. A jail that
	// exited by itself needs no sweep: its pid namespace ended with its first process, and the
	// kernel reaps every process in it before bwrap's own wait returns.
	var stopErr error
	if !exited || !jailed {
		_, stopErr = stopProcesses(context.WithoutCancel(ctx), res.PID, req.Tag, grace)
	}
	if !exited {
		wait := killWait
		if stopErr != nil {
			wait = time.Second
		}
		select {
		case waitErr = <-waited:
			exited = true
		case <-time.After(wait):
		}
	}
	var logErr error
	select {
	case logErr = <-copied:
	case <-time.After(drainWait):
		pr.Close() // unblocks drain's Read
		logErr = <-copied
	}
	res.Finished = time.Now()

	if exited {
		stopErr = errors.Join(stopErr, setExitStatus(&res, waitErr))
	}
	if err := errors.Join(stopErr, logErr); err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	return res, nil
}

// setExitStatus fills the exit code from cmd.Wait's error, as a shell reports it (128 plus the
// signal number when a signal ended the leader); an error that is not an exit status is returned.
func setExitStatus(res *ExecResult, waitErr error) error {
	var ee *exec.ExitError
	switch {
	case waitErr == nil:
		res.ExitCode = 0
	case errors.As(waitErr, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res.Signaled, res.ExitCode = true, 128+int(ws.Signal())
		} else {
			res.ExitCode = ee.ExitCode()
		}
	default:
		return waitErr
	}
	return nil
}

// drain copies the command's output to w until every writer is gone or r is closed. After a write
// error it keeps reading and discards, so the command never blocks on a full pipe.
func drain(r io.Reader, w io.Writer) error {
	if w == nil {
		w = io.Discard
	}
	buf := make([]byte, 32<<10)
	var werr error
	for {
		n, err := r.Read(buf)
		if n > 0 && werr == nil {
			if _, e := w.Write(buf[:n]); e != nil {
				werr = fmt.Errorf("log: %w", e)
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, os.ErrClosed) {
				return werr
			}
			return errors.Join(werr, fmt.Errorf("read output: %w", err))
		}
	}
}

// environ checks req and builds the command's whole environment: the base, the environment's
// variables, req.Env, and the tag (first, so it is cheap to find).
func (d *local) environ(req ExecRequest) ([]string, error) {
	if err := checkRequest(req); err != nil {
		return nil, err
	}
	home := d.home
	if home == "" {
		home = req.Dir
	}
	return commandEnv(req, map[string]string{"PATH": d.path, "HOME": home, "LANG": "C.UTF-8", "TERM": "dumb"}, d.env)
}
