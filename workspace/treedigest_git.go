package workspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"syscall"
	"time"
)

// stream runs git with stdin and hands its stdout to consume as it is produced (for output too
// large to buffer, such as `cat-file --batch`); a git failure wins over a consume error that it
// caused.
func (g gitRunner) stream(ctx context.Context, c gitCall, stdin io.Reader, consume func(io.Reader) error, args ...string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("git %s: %w", subcommand(args), err)
	}
	cmd := exec.CommandContext(ctx, "git", append(gitSafetyFlags(), args...)...)
	cmd.Dir = c.dir
	if cmd.Dir == "" {
		cmd.Dir = g.home
	}
	cmd.Env = g.env(g.author, c.env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Stdin = stdin
	var stderr bytes.Buffer
	cmd.Stderr = &limitedBuffer{max: 8 << 10, buf: &stderr}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("git %s: %w", subcommand(args), err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("git %s: %v: %w", subcommand(args), err, ErrGit)
	}
	cerr := consume(out)
	_, _ = io.Copy(io.Discard, out)
	werr := cmd.Wait()
	var exitErr *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("git %s: %w", subcommand(args), ctx.Err())
	case errors.As(werr, &exitErr):
		return g.failure(args, exitErr.ExitCode(), gitOutput{stderr: stderr.Bytes()})
	case werr != nil:
		return fmt.Errorf("git %s: %v: %w", subcommand(args), werr, ErrGit)
	}
	return cerr
}
