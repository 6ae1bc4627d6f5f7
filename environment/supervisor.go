package environment

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"berth/environment/jail"
	"berth/environment/netns"
)

// Runtime services (docs/previews.md): long-running dev and preview servers Berth starts for an
// execution workspace. The supervisor starts each in the jail profile of its environment, in a
// process group of its own, with a reserved port, a 0600 log file and the variables below; it
// waits for HTTP readiness and it stops a service as a whole: every process of it gone and its port
// free. It keeps no database state: package jobs/services records what it reports.

// The variables every service process carries. ServiceVar is the tag that finds a service's
// processes (adoption after a restart, stop, the orphan sweep); it is never BERTH_RUN_ID, so a
// run's end never kills the preview it started.
const (
	ServiceVar     = "BERTH_SERVICE_ID"
	WorkspaceVar   = "BERTH_WORKSPACE_ID"
	PreviewBaseVar = "BERTH_PREVIEW_BASE"
)

// ErrServiceExited means a service's process ended before it became ready.
var ErrServiceExited = errors.New("service exited")

// ErrServiceNotReady means a service did not answer its health check within its ready timeout.
var ErrServiceNotReady = errors.New("service not ready")

// ErrServicesUnsupported means an environment cannot run services this proxy can reach (an ssh
// host, a sandbox without network).
var ErrServicesUnsupported = errors.New("runtime services unsupported")

// Placement is how one environment runs service processes: in a jail built from Spec (the
// profile and its masks and mounts; Start fills the workspace, the command and the variables) or,
// for an uncontained local environment, as /bin/sh on the host.
type Placement struct {
	Contained bool
	Host      jail.Host
	Spec      jail.Spec
	// Within is Berth's data dir: the trees below it a jail writes change hands (jail.Host.Prepare).
	Within string
	// Env is the base environment (PATH, LANG, the environment's configured variables).
	Env map[string]string
	// Networks are this node's workspace namespaces: a service joins its workspace's (nil: the
	// host's network, when Berth is not root).
	Networks *netns.Networks
	// CABundle is Options.CABundle.
	CABundle string
}

// ServicePlacement is where services of an environment run: the local profile (the workspace at
// its real path, the data dir and the server home masked, a private HOME), the sandbox profile
// when its network is on (a sandbox without network cannot be reached by the proxy), or the host
// for "containment": "none". home is the service's private HOME ("" = the jail's /tmp).
func ServicePlacement(cfg Config, opts Options, home string) (Placement, error) {
	env, err := configuredEnv(cfg, opts)
	if err != nil {
		return Placement{}, fmt.Errorf("service placement: %w", err)
	}
	base := map[string]string{"LANG": "C.UTF-8", "TERM": "dumb"}
	maps.Copy(base, env)
	switch cfg.Driver {
	case DriverLocal:
		path := absolutePath(os.Getenv("PATH"))
		if opts.Path != "" {
			path = opts.Path
		}
		if path == "" {
			path = defaultPath
		}
		base["PATH"] = path
		if cfg.Containment == ContainmentNone {
			if home != "" {
				base["HOME"] = home
			}
			return Placement{Env: base}, nil
		}
		if opts.Jail == nil {
			return Placement{}, fmt.Errorf("service placement: %s: %w", jail.Fix, ErrDriverUnavailable)
		}
		return Placement{Contained: true, Host: *opts.Jail, Within: opts.DataDir, Env: base, Networks: opts.Networks, CABundle: opts.CABundle,
			Spec: jail.Spec{Profile: jail.Local, Bwrap: opts.Jail.Bwrap, Home: home,
				Masks: append(append([]string{}, opts.Masks...), cfg.Masks...)}}, nil
	case DriverSandbox:
		if !cfg.Sandbox.Network {
			return Placement{}, fmt.Errorf("service placement: a sandbox without network cannot serve a preview: %w", ErrServicesUnsupported)
		}
		if opts.Jail == nil {
			return Placement{}, fmt.Errorf("service placement: %s: %w", jail.Fix, ErrDriverUnavailable)
		}
		imageEnv, err := readImageEnv(opts.ImageDir)
		if err != nil {
			return Placement{}, fmt.Errorf("service placement: %w", err)
		}
		maps.Copy(base, imageEnv)
		maps.Copy(base, env)
		return Placement{Contained: true, Host: *opts.Jail, Within: opts.DataDir, Env: base, Networks: opts.Networks, CABundle: opts.CABundle,
			Spec: jail.Spec{Profile: jail.Sandbox, Bwrap: opts.Jail.Bwrap, Prlimit: opts.Jail.Prlimit, Image: opts.ImageDir,
				Network: true, Limits: jail.Limits{MemoryMB: cfg.Sandbox.MemoryMB, PidsMax: cfg.Sandbox.PidsMax}}}, nil
	}
	return Placement{}, fmt.Errorf("service placement: %s environments: %w", cfg.Driver, ErrServicesUnsupported)
}

// ServiceSpec is one service to start.
type ServiceSpec struct {
	ID          string
	WorkspaceID string
	Command     string
	// Root is the absolute host path of the execution workspace: the working directory.
	Root       string
	PortEnv    string // default PORT
	Port       int
	HealthPath string // requested exactly as given (with the preview prefix when it is not stripped)
	// PreviewBase is BERTH_PREVIEW_BASE, the path the service is served under on its preview
	// origin: "/" (the default) or "/preview/{id}/" for a definition with strip_prefix false.
	PreviewBase string
	// ReadyTimeout bounds the wait for a non-5xx answer on HealthPath.
	ReadyTimeout time.Duration
	// LogPath is the service's log file (created 0600, appended to).
	LogPath   string
	Placement Placement
}

// Process is a started service process.
type Process struct {
	ID        string
	PID       int
	PGID      int
	StartTime uint64 // ProcessStartTime(PID), which defeats pid reuse
	Port      int
	done      chan struct{}
	exitCode  int
	dial      Dialer // the service's network; nil: the host's
}

// Dial connects to addr in the service's own network (its workspace's namespace), or the host's
// when it has none.
func (p *Process) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if p.dial != nil {
		return p.dial(ctx, network, addr)
	}
	return (&net.Dialer{}).DialContext(ctx, network, addr)
}

// Done is closed when the service's first process has exited (its jail is then gone).
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitCode is the exit status of the service's first process once Done is closed (128+signal
// when a signal ended it), and -1 before.
func (p *Process) ExitCode() int {
	select {
	case <-p.done:
		return p.exitCode
	default:
		return -1
	}
}

// Supervisor starts and stops the service processes of this node and remembers the ones it
// started. It is safe for concurrent use.
type Supervisor struct {
	Grace time.Duration // SIGTERM to SIGKILL; DefaultGrace when zero
	mu    sync.Mutex
	procs map[string]*Process
}

// Running is the process this supervisor started for service id and that has not exited.
func (s *Supervisor) Running(id string) (*Process, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.procs[id]
	if !ok {
		return nil, false
	}
	select {
	case <-p.done:
		return nil, false
	default:
		return p, true
	}
}

func (s *Supervisor) grace() time.Duration {
	if s.Grace > 0 {
		return s.Grace
	}
	return DefaultGrace
}

// Start starts spec's command and waits for it to answer its health check. Whatever is left of
// an earlier process of the same service is stopped first, so one service never has two servers.
// On success the process runs on (Done tells when it ends); on failure (ErrServiceExited,
// ErrServiceNotReady, a start error) nothing of it is left and the Process, when one started,
// carries the exit code.
func (s *Supervisor) Start(ctx context.Context, spec ServiceSpec) (*Process, error) {
	if err := checkTag(spec.ID); err != nil || spec.Root == "" || !filepath.IsAbs(spec.Root) {
		return nil, fmt.Errorf("start service: id and an absolute root are required: %w", ErrInvalidRequest)
	}
	if spec.Port <= 0 || spec.Port > 65535 {
		return nil, fmt.Errorf("start service: port %d: %w", spec.Port, ErrInvalidRequest)
	}
	if err := StopService(ctx, spec.ID, 0, 0, s.grace()); err != nil {
		return nil, fmt.Errorf("start service: stop the earlier process: %w", err)
	}
	cmd, start, dial, done, err := s.command(spec)
	if err != nil {
		return nil, fmt.Errorf("start service: %w", err)
	}
	logf, err := os.OpenFile(spec.LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		done()
		return nil, fmt.Errorf("start service: log: %w", err)
	}
	_ = logf.Chmod(0o600)
	fmt.Fprintf(logf, "--- berth: starting service on port %d at %s\n", spec.Port, time.Now().UTC().Format(time.RFC3339))
	cmd.Stdout, cmd.Stderr = logf, logf
	err = start()
	logf.Close()
	if err != nil {
		done()
		return nil, fmt.Errorf("start service: %w", err)
	}
	p := &Process{ID: spec.ID, PID: cmd.Process.Pid, PGID: cmd.Process.Pid, Port: spec.Port, done: make(chan struct{}), exitCode: -1,
		dial: dial}
	p.StartTime, _ = ProcessStartTime(p.PID)
	go func() {
		werr := cmd.Wait()
		var res ExecResult
		if setExitStatus(&res, werr) == nil {
			p.exitCode = res.ExitCode
		}
		done()
		close(p.done)
	}()
	s.mu.Lock()
	if s.procs == nil {
		s.procs = map[string]*Process{}
	}
	s.procs[spec.ID] = p
	s.mu.Unlock()

	if err := WaitHealthy(ctx, p.done, p.Dial, spec.Port, spec.HealthPath, spec.ReadyTimeout); err != nil {
		stopErr := s.Stop(context.WithoutCancel(ctx), spec.ID)
		return p, errors.Join(fmt.Errorf("start service: %w", err), stopErr)
	}
	return p, nil
}

// command builds the service's process: its jail in its workspace's network namespace, or
// /bin/sh on the host when uncontained. dial reaches the service's own network (nil: the host's).
func (s *Supervisor) command(spec ServiceSpec) (cmd *exec.Cmd, start func() error, dial Dialer, done func(), err error) {
	portEnv := spec.PortEnv
	if portEnv == "" {
		portEnv = "PORT"
	}
	vars := maps.Clone(spec.Placement.Env)
	if vars == nil {
		vars = map[string]string{}
	}
	delete(vars, TagVar)
	vars[portEnv] = strconv.Itoa(spec.Port)
	vars[ServiceVar] = spec.ID
	vars[WorkspaceVar] = spec.WorkspaceID
	vars[PreviewBaseVar] = spec.PreviewBase
	if spec.PreviewBase == "" {
		vars[PreviewBaseVar] = "/"
	}
	pl := spec.Placement
	if !pl.Contained {
		if vars["HOME"] == "" {
			vars["HOME"] = spec.Root
		}
		env := make([]string, 0, len(vars))
		for k, v := range vars {
			env = append(env, k+"="+v)
		}
		cmd := &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", spec.Command}, Dir: spec.Root, Env: env,
			SysProcAttr: &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}}
		return cmd, cmd.Start, nil, func() {}, nil
	}
	js := pl.Spec
	js.Workspace, js.Command, js.Env = spec.Root, spec.Command, vars
	if js.Home != "" {
		if err := os.MkdirAll(js.Home, 0o700); err != nil {
			return nil, nil, nil, nil, fmt.Errorf("service home: %w", err)
		}
	}
	n, err := jailNet(pl.Networks, spec.WorkspaceID, true, pl.CABundle)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if n.ns != nil {
		dial = n.ns.Dial
	}
	cmd, start, done, err = startJail(pl.Host, js, pl.Within, "", n)
	if err != nil {
		n.release()
		return nil, nil, nil, nil, err
	}
	return cmd, start, dial, done, nil
}

// Stop stops service id's processes: the one this supervisor started and anything else tagged
// with the id (see StopService).
func (s *Supervisor) Stop(ctx context.Context, id string) error {
	s.mu.Lock()
	p := s.procs[id]
	s.mu.Unlock()
	pid, port := 0, 0
	if p != nil {
		pid, port = p.PID, p.Port
	}
	err := StopService(ctx, id, pid, port, s.grace())
	if p != nil && err == nil {
		select {
		case <-p.done:
		case <-time.After(killWait):
			err = fmt.Errorf("stop service: pid %d not reaped: %w", pid, ErrNotGone)
		}
	}
	return err
}

// WaitHealthy polls http://127.0.0.1:port+path (through dial: the service's own network, nil for
// the host's) until it answers with a status below 500 (ErrServiceNotReady after timeout,
// ErrServiceExited as soon as exited is closed).
func WaitHealthy(ctx context.Context, exited <-chan struct{}, dial Dialer, port int, path string, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	deadline := time.Now().Add(timeout)
	wait := 10 * time.Millisecond
	for {
		select {
		case <-exited:
			return ErrServiceExited
		default:
		}
		if CheckHealth(ctx, dial, port, path) == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer below 500 on %s within %s: %w", path, timeout, ErrServiceNotReady)
		}
		select {
		case <-exited:
			return ErrServiceExited
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(wait*2, 250*time.Millisecond)
	}
}

// Dialer connects to an address in a service's network (netns.Namespace.Dial).
type Dialer func(ctx context.Context, network, addr string) (net.Conn, error)

// healthClient never follows redirects: a 3xx is an answer. Its transport dials through the
// Dialer the request's context carries (the service's own network), else the host's.
var healthClient = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if d, ok := ctx.Value(dialerKey{}).(Dialer); ok && d != nil {
			return d(ctx, network, addr)
		}
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}}

type dialerKey struct{}

// CheckHealth sends one GET to the service as the proxy would (Host 127.0.0.1:port), through dial
// (nil: the host's network), and reports whether it answered below 500 within a second.
func CheckHealth(ctx context.Context, dial Dialer, port int, path string) error {
	if path == "" {
		path = "/"
	}
	ctx, cancel := context.WithTimeout(context.WithValue(ctx, dialerKey{}, dial), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(port)+path, nil)
	if err != nil {
		return err
	}
	resp, err := healthClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode >= 500 {
		return fmt.Errorf("health: status %d", resp.StatusCode)
	}
	return nil
}

// PortFree reports whether nothing listens on 127.0.0.1:port (verified by binding it).
func PortFree(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// ReservePort picks a port for a service: preferred when it is free and not taken (a restart
// keeps its URL's port), else one the kernel hands out that taken does not hold. Free means
// verified by bind on 127.0.0.1; taken says which ports other services of this node hold (the
// database keeps them unique per node).
func ReservePort(preferred int, taken func(int) bool) (int, error) {
	if preferred > 0 && !taken(preferred) && PortFree(preferred) {
		return preferred, nil
	}
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("reserve port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !taken(port) {
			return port, nil
		}
	}
	return 0, errors.New("reserve port: no free port")
}

// LogTail is the last n bytes of a service's log file, as valid UTF-8 ("" when there is none).
func LogTail(path string, n int64) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", nil
		}
		return "", fmt.Errorf("log tail: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("log tail: %w", err)
	}
	off := max(fi.Size()-n, 0)
	b := make([]byte, fi.Size()-off)
	if _, err := f.ReadAt(b, off); err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("log tail: %w", err)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), nil
}
