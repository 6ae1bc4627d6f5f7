package environment

import (
	"maps"
	"slices"
	"strings"
	"unicode/utf8"
)

// The drivers an environment can use.
const (
	DriverLocal   = "local"
	DriverSSH     = "ssh"
	DriverSandbox = "sandbox"
	// DriverPlugin is a driver outside Berth's binary: an executable under BERTH_PLUGIN_DIR that
	// speaks the driver protocol (docs/plugins.md), pinned by its sha256.
	DriverPlugin = "plugin"
)

// Drivers lists every driver in the order people choose from them.
func Drivers() []string { return []string{DriverLocal, DriverSSH, DriverSandbox, DriverPlugin} }

// ValidDriver reports whether driver is one Berth knows.
func ValidDriver(driver string) bool { return slices.Contains(Drivers(), driver) }

// The containment modes of a local environment.
const (
	ContainmentJail = "jail"
	ContainmentNone = "none"
)

// Limits of a configuration, so one environment cannot hold unbounded data.
const (
	MaxEnvVars       = 100
	MaxEnvValueBytes = 32 << 10
	MaxKeyBytes      = 16 << 10
)

// Sandbox limits and defaults (docs/api.md, "Config per driver").
const (
	DefaultSandboxMemoryMB = 1024
	DefaultSandboxCPUs     = 1.0
	DefaultSandboxPidsMax  = 512
	DefaultSandboxTimeoutS = 3600
	DefaultSSHPort         = 22
	MaxParallelRunsLimit   = 1000
)

// Config is an environment's validated, normalized configuration without its secret values:
// exactly what the config column stores. SSH and Sandbox hold the settings of their driver and are
// zero for the others. Env is sorted by name; a secret entry's value lives in Secrets.
type Config struct {
	Driver string
	// Containment is "jail" (every command in the local jail profile) or "none" (an instance
	// admin's explicit choice on a single-user machine); local environments only.
	Containment string
	// Masks are host paths hidden from a local environment's runs (besides Berth's data dir and
	// the server user's home, which are always hidden).
	Masks   []string
	SSH     SSHConfig
	Sandbox SandboxConfig
	Plugin  PluginConfig
	Env     []EnvVar
	// MaxParallelRuns is the environment's capacity: how many runs may hold a lease on it at once
	// (0: no bound beyond the workers). Runs past it wait in the queue (jobs/provision.go).
	MaxParallelRuns int
	// Egress is what the jails may reach through the egress proxy (local and sandbox drivers;
	// DefaultEgress when unset).
	Egress EgressConfig
}

// SSHConfig is where and as whom the ssh driver connects. HostKey is the pinned public key in
// authorized_keys form (type and base64, no comment): there is no trust on first use.
type SSHConfig struct {
	Host    string
	Port    int
	User    string
	HostKey string
	// BaseDir is where workspaces live on the remote ("" = DefaultSSHBaseDir).
	BaseDir string
}

// SandboxConfig is the bubblewrap sandbox's network switch and resource limits.
type SandboxConfig struct {
	Network      bool
	SetupNetwork bool
	MemoryMB     int
	CPUs         float64
	PidsMax      int
	TimeoutS     int
}

// EnvVar is one variable added to every command's environment. Value is empty when Secret is
// set: the value is sealed with the other secrets. A secret with Inject is not a variable at all:
// the egress proxy adds it to requests for its hosts, and the jail never sees it.
type EnvVar struct {
	Name   string
	Value  string
	Secret bool
	Inject *Inject
}

// Secrets are an environment's secret values, sealed at rest as one JSON object and never
// returned. Salt keys the secrets' share of the fingerprint, so a published fingerprint cannot be
// used to guess a short secret; it is kept for the environment's lifetime.
type Secrets struct {
	PrivateKey string            `json:"private_key,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Salt       string            `json:"salt,omitempty"`
}

// SecretsAAD is the associated data an environment's sealed secrets are bound to, so a sealed blob
// copied to another environment's row does not open.
func SecretsAAD(environmentID string) string { return "environment:" + environmentID }

// Empty reports whether there is no secret value to seal.
func (s Secrets) Empty() bool { return s.PrivateKey == "" && len(s.Env) == 0 }

// Equal reports whether two sets of secrets hold the same values (the salt aside).
func (s Secrets) Equal(o Secrets) bool {
	return s.PrivateKey == o.PrivateKey && maps.Equal(s.Env, o.Env)
}

// FieldErrors maps a configuration key, relative to the config object ("host", "env[2].name";
// "" for the object itself), to what is wrong with it, in words for the person who sent it.
type FieldErrors map[string]string

// allowedKeys are the settings each driver accepts; anything else is refused.
func allowedKeys(driver string) []string {
	switch driver {
	case DriverSSH:
		return []string{"host", "port", "user", "private_key", "host_key", "base_dir", "env", "max_parallel_runs"}
	case DriverLocal:
		return []string{"containment", "mask", "env", "max_parallel_runs", "egress"}
	case DriverSandbox:
		return []string{"network", "setup_network", "memory_mb", "cpus", "pids_max", "timeout_s", "env", "max_parallel_runs", "egress"}
	case DriverPlugin:
		return []string{"plugin", "sha256", "settings", "timeout_s", "env", "max_parallel_runs"}
	default:
		return []string{"env", "max_parallel_runs"}
	}
}

// ValidName reports what is wrong with an environment name, or "" when it is acceptable:
// 1–100 characters of printable text.
func ValidName(name string) string {
	switch {
	case strings.TrimSpace(name) == "":
		return "required"
	case utf8.RuneCountInString(name) > 100:
		return "at most 100 characters"
	case !utf8.ValidString(name) || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return "must be printable text on one line"
	}
	return ""
}
