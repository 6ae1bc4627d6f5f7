package workspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// Identity is the author and committer Berth writes into the commits it makes.
type Identity struct {
	Name  string // author and committer name
	Email string // author and committer email
}

// DefaultIdentity is the author used when a caller configures none.
func DefaultIdentity() Identity { return Identity{Name: "Berth", Email: "berth@localhost"} }

func (id Identity) orDefault() Identity {
	if strings.TrimSpace(id.Name) == "" || strings.TrimSpace(id.Email) == "" {
		return DefaultIdentity()
	}
	return id
}

// gitSafetyFlags neutralize repository configuration that would run code or prompt: hooks, fsmonitor,
// signing, credential helpers, the ext transport, and background maintenance.
func gitSafetyFlags() []string {
	return []string{
		"-c", "core.hooksPath=/dev/null",
		// Jailed runs own their worktrees (another uid than Berth's when Berth is root).
		"-c", "safe.directory=*",
		"-c", "core.fsmonitor=false",
		"-c", "commit.gpgSign=false",
		"-c", "tag.gpgSign=false",
		"-c", "credential.helper=",
		"-c", "protocol.ext.allow=never",
		"-c", "gc.auto=0",
		"-c", "maintenance.auto=false",
		"-c", "advice.detachedHead=false",
	}
}

// gitRunner runs git with a clean environment: no system or global config, a private HOME, no
// terminal prompts, C locale, and a fixed identity. Cancelling the context kills git's whole process
// group.
type gitRunner struct {
	home   string // private HOME directory (0700)
	path   string // PATH captured when the Manager was made
	author Identity
}

func newGitRunner(home string, author Identity) gitRunner {
	p := os.Getenv("PATH")
	if p == "" {
		p = "/usr/local/bin:/usr/bin:/bin"
	}
	return gitRunner{home: home, path: p, author: author.orDefault()}
}

func (g gitRunner) env(author Identity, extra []string) []string {
	a := author.orDefault()
	env := []string{
		"PATH=" + g.path,
		"HOME=" + g.home,
		"XDG_CONFIG_HOME=" + g.home,
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_TERMINAL_PROMPT=0",
		"GIT_SSH_COMMAND=ssh -o BatchMode=yes",
		"LC_ALL=C",
		"LANG=C",
		"GIT_AUTHOR_NAME=" + a.Name,
		"GIT_AUTHOR_EMAIL=" + a.Email,
		"GIT_COMMITTER_NAME=" + a.Name,
		"GIT_COMMITTER_EMAIL=" + a.Email,
	}
	return append(env, extra...)
}

// gitCall describes one git invocation.
type gitCall struct {
	dir    string    // working directory ("" = private home)
	env    []string  // extra environment
	author Identity  // zero = runner default
	stdin  io.Reader // nil = no input
}

// run executes git and returns its stdout with the trailing newline trimmed.
func (g gitRunner) run(ctx context.Context, c gitCall, args ...string) (string, error) {
	out, code, err := g.exec(ctx, c, args...)
	if err != nil {
		return "", err
	}
	if code != 0 {
		return "", g.failure(args, code, out)
	}
	return strings.TrimRight(string(out.stdout), "\n"), nil
}

// test runs a git predicate: exit 0 is true, exit 1 is false, anything else is an error.
func (g gitRunner) test(ctx context.Context, c gitCall, args ...string) (bool, error) {
	out, code, err := g.exec(ctx, c, args...)
	if err != nil {
		return false, err
	}
	switch code {
	case 0:
		return true, nil
	case 1:
		return false, nil
	}
	return false, g.failure(args, code, out)
}

type gitOutput struct{ stdout, stderr []byte }

func (g gitRunner) exec(ctx context.Context, c gitCall, args ...string) (gitOutput, int, error) {
	if err := ctx.Err(); err != nil {
		return gitOutput{}, -1, fmt.Errorf("git %s: %w", subcommand(args), err)
	}
	full := append(gitSafetyFlags(), args...)
	cmd := exec.CommandContext(ctx, "git", full...)
	cmd.Dir = c.dir
	if cmd.Dir == "" {
		cmd.Dir = g.home
	}
	author := c.author
	if author == (Identity{}) {
		author = g.author
	}
	cmd.Env = g.env(author, c.env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		// Kill the whole group: git forks helpers (remote transports, pack-objects).
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = 5 * time.Second
	if c.stdin != nil {
		cmd.Stdin = c.stdin
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &limitedBuffer{max: 8 << 10, buf: &stderr}
	err := cmd.Run()
	out := gitOutput{stdout: stdout.Bytes(), stderr: stderr.Bytes()}
	if ctx.Err() != nil {
		return out, -1, fmt.Errorf("git %s: %w", subcommand(args), ctx.Err())
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		return out, exitErr.ExitCode(), nil
	}
	if err != nil {
		return out, -1, fmt.Errorf("git %s: %v: %w", subcommand(args), err, ErrGit)
	}
	return out, 0, nil
}

func (g gitRunner) failure(args []string, code int, out gitOutput) error {
	msg := strings.TrimSpace(string(out.stderr))
	if msg == "" {
		msg = fmt.Sprintf("exit status %d", code)
	}
	return fmt.Errorf("git %s: %s: %w", subcommand(args), redactURLs(msg), ErrGit)
}

func subcommand(args []string) string {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "-C" || a == "-c" {
			i++
			continue
		}
		if strings.HasPrefix(a, "-") {
			continue
		}
		return a
	}
	return "?"
}

var userinfoRE = regexp.MustCompile(`://[^/@\s]+@`)

// redactURLs hides credentials embedded in URLs (https://user:token@host) from error messages.
func redactURLs(s string) string { return userinfoRE.ReplaceAllString(s, "://***@") }

// limitedBuffer keeps the first max bytes written and discards the rest, so a chatty git cannot
// grow memory without bound.
type limitedBuffer struct {
	max int
	buf *bytes.Buffer
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.max - l.buf.Len(); room > 0 {
		if len(p) > room {
			l.buf.Write(p[:room])
		} else {
			l.buf.Write(p)
		}
	}
	return len(p), nil
}
