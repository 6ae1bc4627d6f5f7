package terminal

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"

	"github.com/creack/pty"
)

// plainPty is the tests' door to a real pty: a plain, unjailed process on a pty of 80×24, for
// the bridge's own tests and the benchmarks' raw and Berth figures. It lives in a _test.go file
// on purpose: Go never builds it into Berth, whose only pty start is environment.StartSetupShell
// (the setup jail), and make verify keeps creack/pty out of every other non-test file.
type plainPty struct {
	f      *os.File
	cmd    *exec.Cmd
	exited chan struct{}
	code   int
	once   sync.Once
}

// plainStart is a session's start that runs argv on a new plain pty with env (nil: the test's
// own environment, as exec.Cmd has it).
func plainStart(env []string, argv ...string) StartFunc {
	return func() (Pty, error) {
		p, err := startPlain(env, argv...)
		if err != nil {
			return nil, err
		}
		return p, nil
	}
}

// startPlain starts argv with env on a new plain pty.
func startPlain(env []string, argv ...string) (*plainPty, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Cols: 80, Rows: 24})
	if err != nil {
		return nil, fmt.Errorf("plain pty: %w", err)
	}
	p := &plainPty{f: f, cmd: cmd, exited: make(chan struct{}), code: -1}
	go func() {
		_ = cmd.Wait()
		if cmd.ProcessState != nil {
			p.code = cmd.ProcessState.ExitCode() // -1 when a signal ended it
		}
		close(p.exited)
	}()
	return p, nil
}

func (p *plainPty) Read(b []byte) (int, error)  { return p.f.Read(b) }
func (p *plainPty) Write(b []byte) (int, error) { return p.f.Write(b) }
func (p *plainPty) Wait() int                   { <-p.exited; return p.code }

func (p *plainPty) Resize(cols, rows int) error {
	return pty.Setsize(p.f, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)})
}

// Close kills the process's group (pty.Start made it a session leader) and releases the pty.
func (p *plainPty) Close() error {
	p.once.Do(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
		_ = p.f.Close()
	})
	return nil
}
