package environment

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"berth/environment/jail"
	"berth/environment/netns"
)

// sandbox runs every command in the jail's sandbox profile (docs/security.md): an explicit
// minimal root, the active image layer read-only at /opt/image, the workspace at /workspace, no
// network unless configured, uid/gid 1000 with every capability dropped, and the limits of its
// configuration (memory and processes as rlimits, time as the command's timeout). It has one
// instance per node; the workspace is on this host's disk.
type sandbox struct {
	onHost
	cfg       SandboxConfig
	env       map[string]string
	jail      *jail.Host
	networks  *netns.Networks // this node's workspace namespaces (network on); nil when Berth is not root
	caBundle  string          // Options.CABundle
	image     string          // host directory of the active image layer
	dataDir   string
	probeDir  string
	grace     time.Duration
	drainWait time.Duration
}

func newSandbox(cfg Config, opts Options) (*sandbox, error) {
	env, err := configuredEnv(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("new sandbox driver: %w", err)
	}
	if opts.ImageDir == "" || !filepath.IsAbs(opts.ImageDir) {
		return nil, fmt.Errorf("new sandbox driver: the image layer must be an absolute path: %w", ErrInvalidRequest)
	}
	d := &sandbox{onHost: newOnHost(DriverSandbox, opts.NodeID), cfg: cfg.Sandbox, env: env, jail: opts.Jail,
		image: filepath.Clean(opts.ImageDir), dataDir: opts.DataDir, probeDir: opts.ProbeDir, grace: opts.Grace, networks: opts.Networks, caBundle: opts.CABundle,
		drainWait: drainWait}
	if d.grace <= 0 {
		d.grace = DefaultGrace
	}
	if d.probeDir == "" {
		d.probeDir = os.TempDir()
	}
	return d, nil
}

// Exec runs /bin/sh -c Command in a sandbox over the workspace at req.Dir (a host path; the
// command sees it as /workspace). The configured timeout_s caps req.Timeout. The rest is as for
// the local driver: one output pipe, and every process gone when Exec returns.
func (d *sandbox) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	res := ExecResult{ExitCode: -1}
	if err := checkRequest(req); err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	if d.jail == nil {
		return res, fmt.Errorf("exec: %s: %w", jail.Fix, ErrDriverUnavailable)
	}
	if err := os.MkdirAll(d.image, 0o755); err != nil { // version 1 is the empty layer
		return res, fmt.Errorf("exec: image layer: %w", err)
	}
	imageEnv, err := readImageEnv(d.image)
	if err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	base := map[string]string{"LANG": "C.UTF-8", "TERM": "dumb"}
	for k, v := range imageEnv {
		base[k] = v
	}
	env, err := commandEnv(req, base, d.env)
	if err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	vars := envMap(env)
	delete(vars, "PATH") // the profile's: /opt/image/bin first
	spec := jail.Spec{Profile: jail.Sandbox, Bwrap: d.jail.Bwrap, Prlimit: d.jail.Prlimit, Workspace: req.Dir,
		Image: d.image, Env: vars, Command: req.Command,
		Limits: jail.Limits{MemoryMB: d.cfg.MemoryMB, PidsMax: d.cfg.PidsMax}}
	n, err := jailNet(d.networks, req.Network, d.cfg.Network, d.caBundle)
	if err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	cmd, start, done, err := startJail(*d.jail, spec, d.dataDir, "", n)
	if err != nil {
		n.release()
		return res, fmt.Errorf("exec: %w", err)
	}
	defer done()
	if limit := time.Duration(d.cfg.TimeoutS) * time.Second; limit > 0 && (req.Timeout == 0 || req.Timeout > limit) {
		req.Timeout = limit
	}
	return runCommand(ctx, cmd, start, req, d.grace, d.drainWait, true)
}

// maxImageEnv caps the image's env file.
const maxImageEnv = 64 << 10

// readImageEnv reads the layer's env file (KEY=VALUE lines; blank lines and # comments skipped):
// variables the image adds to every command. A missing file is no variables.
func readImageEnv(layer string) (map[string]string, error) {
	root, err := os.OpenRoot(layer)
	if err != nil {
		return nil, fmt.Errorf("image layer: %w", err)
	}
	defer root.Close()
	f, err := root.Open("env")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("image env file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() > maxImageEnv {
		return nil, fmt.Errorf("image env file must be a regular file of at most %d bytes: %w", maxImageEnv, ErrInvalidRequest)
	}
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || envNameProblem(k) != "" || k == TagVar || strings.HasPrefix(k, "BERTH_") {
			return nil, fmt.Errorf("image env file line %d: want NAME=value with a valid name (not BERTH_*): %w", n, ErrInvalidRequest)
		}
		out[k] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("image env file: %w", err)
	}
	return out, nil
}

// Probe runs a command in a sandbox and checks it ran as the sandbox user; the image digest is
// recorded by the caller (it knows the active version).
func (d *sandbox) Probe(ctx context.Context) (ProbeResult, error) {
	if err := ctx.Err(); err != nil {
		return ProbeResult{}, fmt.Errorf("probe: %w", err)
	}
	c := Check{Name: "sandbox", Status: CheckFail}
	dir, err := os.MkdirTemp(d.probeDir, ".berth-probe-")
	if err == nil {
		defer os.RemoveAll(dir)
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		c.Detail = "cannot make a probe directory: " + errnoText(err)
	} else {
		var out bytes.Buffer
		res, err := d.Exec(ctx, ExecRequest{Command: "echo berth-probe; id -u", Dir: dir, Timeout: probeTimeout, Log: &out,
			Tag: "probe-" + randomHex(8)})
		switch {
		case err != nil:
			c.Detail = "the sandbox did not start: " + err.Error()
		case res.ExitCode != 0 || out.String() != fmt.Sprintf("berth-probe\n%d\n", d.jail.SandboxUser().UID):
			c.Detail = fmt.Sprintf("the sandbox did not run a test command (exit %d)", res.ExitCode) +
				failureOutput(out.String(), "berth-probe", d.probeDir, d.dataDir, d.image)
		default:
			c.Status, c.Detail = CheckPass, fmt.Sprintf("commands run in a bubblewrap sandbox as uid %d", d.jail.SandboxUser().UID)
		}
	}
	network := "off"
	if d.cfg.Network {
		network = "on"
	}
	r := ProbeResult{OK: c.Status == CheckPass, Checks: []Check{c, probeOS(),
		{Name: "network", Status: CheckInfo, Detail: network}}}
	if r.OK {
		r.Summary = "Sandbox commands run (network " + network + ")."
	} else {
		r.Summary = "Sandbox probe failed: " + c.Detail + "."
	}
	return r, nil
}
