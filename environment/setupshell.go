package environment

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/creack/pty"

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

// StartSetupShell starts s's shell in the setup jail on a new pty of cols×rows. It is the one
// place Berth starts a process on a pty (make verify holds creack/pty to this file), and it takes
// only a SetupShell, so a pty of Berth's always holds a jailed process. Once the shell has ended
// and been reaped, the scratch trees go back to Berth's uid.
func StartSetupShell(s SetupShell, cols, rows int) (*SetupTerminal, error) {
	cmd, done, err := setupShellJail(s)
	if err != nil {
		return nil, err
	}
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)})
	if err != nil {
		done()
		return nil, fmt.Errorf("start pty: %w", err)
	}
	t := &SetupTerminal{f: f, cmd: cmd, exited: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		t.code = -1
		var ee *exec.ExitError
		switch {
		case err == nil:
			t.code = 0
		case errors.As(err, &ee) && ee.ExitCode() >= 0:
			t.code = ee.ExitCode()
		}
		done()
		close(t.exited)
	}()
	return t, nil
}

// setupShellJail makes the jailed command of s's shell. done hands the scratch trees back to
// Berth's uid and closes the jail's data pipes; call it once the shell has ended (or failed to
// start).
func setupShellJail(s SetupShell) (*exec.Cmd, func(), error) {
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

// SetupTerminal is a setup shell running in its jail on a pty Berth holds the master of. It has
// the shape of terminal.Pty (Read, Write, Resize, Wait, Close), as PluginTerminal has, so the
// WebSocket bridge serves it; only StartSetupShell makes one.
type SetupTerminal struct {
	f      *os.File
	cmd    *exec.Cmd
	exited chan struct{}
	code   int
	once   sync.Once
}

// Read reads the shell's output from the pty master.
func (t *SetupTerminal) Read(b []byte) (int, error) { return t.f.Read(b) }

// Write types b into the shell.
func (t *SetupTerminal) Write(b []byte) (int, error) { return t.f.Write(b) }

// Resize sets the pty's window size (1–1000 each); the foreground program gets SIGWINCH.
func (t *SetupTerminal) Resize(cols, rows int) error {
	if cols < 1 || rows < 1 || cols > 1000 || rows > 1000 {
		return fmt.Errorf("resize: %dx%d is out of range", cols, rows)
	}
	return pty.Setsize(t.f, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)})
}

// Wait blocks until the jail has exited and returns its exit code (-1 when killed).
func (t *SetupTerminal) Wait() int {
	<-t.exited
	return t.code
}

// Close kills the jail's process group and releases the pty; Wait then returns.
func (t *SetupTerminal) Close() error {
	t.once.Do(func() {
		// bwrap is its own group leader (the pty start's Setsid): the whole group goes.
		_ = syscall.Kill(-t.cmd.Process.Pid, syscall.SIGKILL)
		<-t.exited
		t.f.Close()
	})
	return nil
}
