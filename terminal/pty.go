package terminal

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"

	"github.com/creack/pty"
)

// Pty is the seam between the bridge and a shell: its output, its input, its window size, and
// its end. Tests use a fake; Start gives the real one.
type Pty interface {
	Read(p []byte) (int, error)
	Write(p []byte) (int, error)
	Resize(cols, rows int) error
	// Wait blocks until the process has exited and returns its exit code (-1 when killed).
	Wait() int
	// Close kills the process group and releases the pty; Wait then returns.
	Close() error
}

// Start starts cmd on a new pty of cols×rows (in its own session, the pty its controlling
// terminal) and calls after once the process has been reaped (e.g. to hand files back).
func Start(cmd *exec.Cmd, cols, rows int, after func()) (Pty, error) {
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)})
	if err != nil {
		if after != nil {
			after()
		}
		return nil, fmt.Errorf("start pty: %w", err)
	}
	p := &procPty{f: f, cmd: cmd, exited: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		p.code = -1
		var ee *exec.ExitError
		switch {
		case err == nil:
			p.code = 0
		case errors.As(err, &ee) && ee.ExitCode() >= 0:
			p.code = ee.ExitCode()
		}
		if after != nil {
			after()
		}
		close(p.exited)
	}()
	return p, nil
}

type procPty struct {
	f      *os.File
	cmd    *exec.Cmd
	exited chan struct{}
	code   int
	once   sync.Once
}

func (p *procPty) Read(b []byte) (int, error)  { return p.f.Read(b) }
func (p *procPty) Write(b []byte) (int, error) { return p.f.Write(b) }

func (p *procPty) Resize(cols, rows int) error {
	if cols < 1 || rows < 1 || cols > 1000 || rows > 1000 {
		return fmt.Errorf("resize: %dx%d is out of range", cols, rows)
	}
	return pty.Setsize(p.f, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)})
}

func (p *procPty) Wait() int {
	<-p.exited
	return p.code
}

func (p *procPty) Close() error {
	p.once.Do(func() {
		// The process is its own group leader (Setsid): the whole group goes.
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
		p.f.Close()
	})
	return nil
}
