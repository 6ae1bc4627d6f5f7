package environment

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"berth/environment/jail"
	"berth/environment/netns"
)

// Sentinel errors of the drivers: every refusal wraps exactly one of these, so jobs can map them to
// run and operation states with errors.Is.
var (
	// ErrDriverUnavailable means the environment's driver cannot be used on this node (not built yet,
	// or unknown). Jobs report it as a configuration problem, not as a failed command.
	ErrDriverUnavailable = errors.New("environment driver unavailable")
	// ErrInvalidRequest means a request to a driver is malformed (a relative directory, an empty
	// command or tag, an environment name with '=' …); nothing was started.
	ErrInvalidRequest = errors.New("invalid driver request")
	// ErrNotGone means processes could still be seen after they were sent SIGKILL and the deadline
	// passed. The caller must not treat the work as cleaned up (keep the lease for cleanup).
	ErrNotGone = errors.New("processes still running after kill")
	// ErrNoProcess means a pid names no process (it exited and was reaped).
	ErrNoProcess = errors.New("no such process")
)

// Driver is where an environment executes commands. Every driver (local, ssh, sandbox) implements
// the same lifecycle for one run: Acquire an instance, Realize the workspace on it, Exec commands in
// it, Sync the results back to the host, Release the instance. Probe qualifies an environment
// without a run. Methods are safe for concurrent use, and each is idempotent where the lifecycle
// may retry it after a crash (Acquire with the same key, Sync, Release).
type Driver interface {
	// Acquire returns the instance a run will use. A retry with the same Key returns the same
	// instance rather than making a second one.
	Acquire(ctx context.Context, req AcquireRequest) (Instance, error)
	// Realize makes the workspace that package workspace realized at HostPath available on the
	// instance and says where it lives there.
	Realize(ctx context.Context, req RealizeRequest) (Realization, error)
	// Exec runs one command to its end and returns only when every process it started is gone.
	// A non-nil error with a non-zero Started in the result means the command did run and the
	// result says how it ended.
	Exec(ctx context.Context, req ExecRequest) (ExecResult, error)
	// Sync brings the instance's copy of the workspace back to HostPath so finalize can read it.
	Sync(ctx context.Context, req SyncRequest) error
	// Release gives the instance back. Releasing an instance already released is not an error.
	Release(ctx context.Context, inst Instance) error
	// Probe checks that the environment can run commands. Failed checks are reported in the
	// result (OK false); the error is only for a probe that could not be carried out.
	Probe(ctx context.Context) (ProbeResult, error)
}

// AcquireRequest identifies the occupancy an instance is acquired for.
type AcquireRequest struct {
	// Key makes Acquire idempotent: the lease id (with its generation, if the caller wants a fresh
	// instance per generation).
	Key string
	// Tag is the run id; processes the instance starts for the run carry it.
	Tag string
}

// Instance is the provider's handle on where a run executes; jobs store Ref in the lease row and
// hand the Instance back to Realize, Sync and Release.
type Instance struct {
	Driver string // the driver that made it
	Ref    string // opaque provider ref, stable across retries with the same key
}

// RealizeRequest says which realized workspace to make available on an instance.
type RealizeRequest struct {
	Instance     Instance
	WorkspaceRef string // the workspace's opaque ref (package workspace); for logs and remote naming
	HostPath     string // absolute path of the realized workspace root on this host
}

// Realization is where the workspace lives for the driver: ExecRequest.Dir for its commands.
type Realization struct {
	Root string // absolute path as the driver's commands see it
}

// SyncRequest names the workspace copy to bring back to the host.
type SyncRequest struct {
	Instance Instance
	Root     string // Realization.Root
	HostPath string // where the workspace lives on this host
}

// ExecRequest is one command to run. The process's environment is exactly a minimal base (PATH,
// HOME, LANG=C.UTF-8, TERM=dumb), then the environment's configured variables, then Env, plus
// BERTH_RUN_ID=Tag; nothing is inherited from Berth's own environment.
type ExecRequest struct {
	Command string            // run as /bin/sh -c Command
	Dir     string            // absolute working directory, an existing directory
	Env     map[string]string // added variables (run token, API URL, ids); HOME here overrides the base
	Timeout time.Duration     // 0 means no limit beyond ctx
	Log     io.Writer         // stdout and stderr, interleaved in order; nil discards
	// Tag is the run id, set as BERTH_RUN_ID in every process so orphan sweeps can find them. It
	// must be unique to this Exec call while it runs: when Exec returns, no process carrying it is
	// left.
	Tag string
	// Home is HOME for a jailed command: a private directory per workspace, outside its tree.
	Home string
	// Git is what a jailed command in a git worktree may write (package workspace, RunGit).
	Git jail.GitAccess
	// Network names the network namespace the command joins (its execution workspace's, shared
	// with the workspace's other jails and services, package netns); "" gives it a loopback of
	// its own and nothing else.
	Network string
	// OnStart, if set, is called once with the leader's pid as soon as the command has started (for
	// example to record it in the run row). It must return quickly.
	OnStart func(pid int)
}

// ExecResult says how a command ended. Exactly one of "exited" (neither flag), TimedOut and
// Cancelled describes why it ended; Signaled says a signal ended its leader, in which case ExitCode
// is 128 plus the signal number, as a shell reports it.
type ExecResult struct {
	ExitCode  int
	Signaled  bool
	TimedOut  bool // Timeout passed; the group was terminated
	Cancelled bool // ctx ended; the group was terminated
	Started   time.Time
	Finished  time.Time // after every process was gone and the output drained
	PID       int       // the leader's pid, which is also the process group and session id
}

// CheckStatus grades one probe check.
type CheckStatus string

// The grades of a probe check: a failed check makes the probe fail; info is reported only.
const (
	CheckPass CheckStatus = "pass"
	CheckFail CheckStatus = "fail"
	CheckInfo CheckStatus = "info"
)

// Check is one probe step, shown to administrators (it never holds a secret or a host path).
type Check struct {
	Name   string      `json:"name"`
	Status CheckStatus `json:"status"`
	Detail string      `json:"detail"`
}

// ProbeResult is what a probe found; jobs store OK and Summary in the environment's qualification.
type ProbeResult struct {
	OK      bool    `json:"ok"`
	Summary string  `json:"summary"`
	Checks  []Check `json:"checks"`
}

// DefaultGrace is how long a process group has between SIGTERM and SIGKILL.
const DefaultGrace = 5 * time.Second

// Options are what a driver needs beyond the environment's stored configuration.
type Options struct {
	// Secrets are the environment's secret values: secret env variables and the ssh key.
	Secrets Secrets
	// Grace is the time between SIGTERM and SIGKILL when stopping processes (default DefaultGrace).
	Grace time.Duration
	// Home is HOME for commands that do not set it; default the command's Dir. A private directory
	// outside the workspace keeps dotfiles out of the task's commits.
	Home string
	// Path is PATH for commands that do not set it; default the absolute entries of Berth's own
	// PATH, else a standard list.
	Path string
	// ProbeDir is where Probe creates and removes its test file (default the system temp dir).
	ProbeDir string
	// NodeID names this Berth node in local instance refs (default the host name): a local
	// workspace lives on one node's disk.
	NodeID string
	// Jail is this host's bubblewrap and run identity (jail.Detect). A contained driver without
	// one (bwrap missing) refuses to run commands with ErrDriverUnavailable naming the package.
	Jail *jail.Host
	// Masks are host paths no jailed command may see: Berth's data dir and the server user's home
	// (the environment's own "mask" setting is added to them).
	Masks []string
	// DataDir is Berth's data dir: the jail makes the directories in it that lead to a workspace
	// traversable for the run user, and never touches modes anywhere else.
	DataDir string
	// ImageDir is the host directory of a sandbox environment's active image layer, mounted at
	// /opt/image; for a plugin environment, the layer sent to the plugin when it lacks it.
	ImageDir string
	// Networks are this node's workspace network namespaces (package netns); nil when Berth is
	// not root, and then a jail that wants a network has the host's (docs/network.md).
	Networks *netns.Networks
	// CABundle, for an environment whose credentials the egress proxy injects, is the host path
	// of the certificate bundle its jails trust (the system's roots and Berth's egress CA).
	CABundle string
	// ImageDigest is the active image version's digest (plugin environments name it in Acquire).
	ImageDigest string
	// Plugins runs the plugin processes of plugin environments (nil: plugins are off on this node).
	Plugins *PluginHost
}

// New returns the driver for an environment's configuration.
func New(cfg Config, opts Options) (Driver, error) {
	switch cfg.Driver {
	case DriverLocal:
		return newLocal(cfg, opts)
	case DriverSandbox:
		return newSandbox(cfg, opts)
	case DriverSSH:
		return newSSH(cfg, opts)
	case DriverPlugin:
		return newPlugin(cfg, opts)
	default:
		return nil, fmt.Errorf("new driver: unknown driver %q: %w", cfg.Driver, ErrDriverUnavailable)
	}
}
