package environment

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"berth/environment/jail"
)

// SetupShell describes an image setup session's interactive shell: the setup jail profile (the
// sandbox profile with the scratch layer writable at /opt/image), over an empty scratch
// workspace, with the network per the environment's setup_network.
type SetupShell struct {
	Jail      jail.Host
	DataDir   string // Berth's data dir: the trees below it are made reachable for the run user
	Layer     string // the scratch image layer (host path)
	Workspace string // an empty directory, the shell's /workspace
	Config    SandboxConfig
}

// setupShellCommand picks bash when the image or the host has it, else sh, and runs it
// interactively right on Berth's pty (jail.Spec.Terminal: the pty is its controlling terminal, so
// job control, Ctrl-C and window resizes reach it; no script(1) in between).
const setupShellCommand = `sh=/bin/sh
for c in /opt/image/bin/bash /usr/bin/bash /bin/bash; do
  if [ -x "$c" ]; then sh=$c; break; fi
done
cd /opt/image 2>/dev/null || true
exec "$sh" -i`

// SetupShellCommand makes the jailed command of a setup shell, ready for a pty. done hands the
// scratch trees back to Berth's uid and closes the jail's data pipes; call it once the shell has
// ended.
func SetupShellCommand(s SetupShell) (*exec.Cmd, func(), error) {
	for _, p := range []string{s.Layer, s.Workspace} {
		if !filepath.IsAbs(p) {
			return nil, nil, fmt.Errorf("setup shell: %q must be absolute: %w", p, ErrInvalidRequest)
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return nil, nil, fmt.Errorf("setup shell: %w", err)
		}
	}
	spec := jail.Spec{Profile: jail.Setup, Bwrap: s.Jail.Bwrap, Prlimit: s.Jail.Prlimit, Workspace: s.Workspace,
		Image: s.Layer, Network: s.Config.SetupNetwork, Command: setupShellCommand,
		Env:    map[string]string{"TERM": "xterm-256color", "LANG": "C.UTF-8", "HOME": "/tmp"},
		Limits: jail.Limits{PidsMax: s.Config.PidsMax}, Terminal: true}
	c, err := s.Jail.Build(spec)
	if err != nil {
		return nil, nil, fmt.Errorf("setup shell: %w: %w", err, ErrInvalidRequest)
	}
	if err := s.Jail.Prepare(spec, s.DataDir, s.Layer); err != nil {
		return nil, nil, fmt.Errorf("setup shell: %w: %w", err, ErrDriverUnavailable)
	}
	cmd, closeData, err := s.Jail.Command(c)
	if err != nil {
		return nil, nil, fmt.Errorf("setup shell: %w", err)
	}
	done := func() {
		closeData()
		for _, p := range []string{s.Layer, s.Workspace} {
			if s.DataDir != "" && jail.Within(p, s.DataDir) && p != s.DataDir {
				_ = s.Jail.HandBack(p)
			}
		}
	}
	return cmd, done, nil
}
