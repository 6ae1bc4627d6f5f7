package workspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"berth/environment/jail"
)

// Everything a run leaves behind is input, never instructions (docs/security.md, "What a run's
// output can do"). Git interprets a worktree's files: `.gitattributes` names filters, textconv
// and diff drivers, `.git` names a repository, and a repository's config runs fsmonitor, hooks and
// helpers. So Berth's own git commands that must read what a run wrote (stage and commit it,
// count its changes, snapshot it for a rescue, check a reused worktree out) run in the git
// profile of the jail, as the run user, with no network and only the workspace and its git paths
// visible; whatever they interpret cannot reach Berth. The host side runs git only on objects and
// refs, always with an explicit git dir from Berth's records: it imports the packs those jails
// produce (index-pack --strict, a connectivity check) and moves refs with compare-and-swap.

// jailGitTimeout bounds one of Berth's jailed git commands.
const jailGitTimeout = 10 * time.Minute

// maxJailOutput caps what Berth keeps of a jailed git command's stdout and stderr.
const maxJailOutput = 8 << 20

// jailedGit is one of Berth's git scripts to run over a workspace.
type jailedGit struct {
	workspace string // the work tree, at its real path
	readOnly  bool   // bind the work tree read-only
	ro, rw    []jail.Bind
	env       map[string]string
	owned     []string // trees below the data dir handed to the run user first (the store)
	script    string
}

// gitJailEnv is the environment of Berth's jailed git: no system or global config, no prompts,
// and command-line config that turns off what could run code or write elsewhere.
func gitJailEnv(author Identity) map[string]string {
	a := author.orDefault()
	env := map[string]string{
		"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TERMINAL_PROMPT": "0",
		"LC_ALL": "C", "LANG": "C", "HOME": "/tmp",
		"GIT_AUTHOR_NAME": a.Name, "GIT_AUTHOR_EMAIL": a.Email, "GIT_COMMITTER_NAME": a.Name, "GIT_COMMITTER_EMAIL": a.Email,
	}
	cfg := [][2]string{{"safe.directory", "*"}, {"core.hooksPath", "/dev/null"}, {"core.fsmonitor", "false"},
		{"commit.gpgSign", "false"}, {"gc.auto", "0"}, {"maintenance.auto", "false"}, {"core.logAllRefUpdates", "false"},
		{"protocol.allow", "never"}, {"credential.helper", ""}}
	env["GIT_CONFIG_COUNT"] = fmt.Sprint(len(cfg))
	for i, kv := range cfg {
		env[fmt.Sprintf("GIT_CONFIG_KEY_%d", i)] = kv[0]
		env[fmt.Sprintf("GIT_CONFIG_VALUE_%d", i)] = kv[1]
	}
	return env
}

// runJailedGit runs j's script and returns its stdout. Without a jail on this host (bubblewrap
// missing: only uncontained environments run then, whose runs already have the host) the script
// runs on the host with the same environment and explicit git dirs.
func (m *Manager) runJailedGit(ctx context.Context, j jailedGit) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, jailGitTimeout)
	defer cancel()
	var cmd *exec.Cmd
	done := func() {}
	if m.jail == nil {
		env := make([]string, 0, len(j.env)+1)
		for _, k := range slices.Sorted(maps.Keys(j.env)) {
			env = append(env, k+"="+j.env[k])
		}
		env = append(env, "PATH="+m.git.path)
		cmd = &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", j.script}, Dir: j.workspace, Env: env,
			SysProcAttr: &syscall.SysProcAttr{Setpgid: true}}
	} else {
		spec := jail.Spec{Profile: jail.Git, Workspace: j.workspace, WorkspaceReadOnly: j.readOnly, ReadOnly: j.ro,
			ReadWrite: j.rw, Env: j.env, Command: j.script}
		if err := m.jail.Prepare(spec, m.dataDir, j.owned...); err != nil {
			return nil, fmt.Errorf("git jail: %w", err)
		}
		c, err := m.jail.Build(spec)
		if err != nil {
			return nil, fmt.Errorf("git jail: %w", err)
		}
		if cmd, done, err = m.jail.Command(c); err != nil {
			return nil, fmt.Errorf("git jail: %w", err)
		}
	}
	defer done()
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &limitedBuffer{max: maxJailOutput, buf: &stdout}
	cmd.Stderr = &limitedBuffer{max: 8 << 10, buf: &stderr}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("git jail: %v: %w", err, ErrGit)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var err error
	select {
	case err = <-waited:
	case <-ctx.Done():
		// The jail's own process group: its pid namespace ends with it.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-waited
		return nil, fmt.Errorf("git jail: %w", ctx.Err())
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = fmt.Sprintf("exit status %d", exit.ExitCode())
		}
		return stdout.Bytes(), fmt.Errorf("git: %s: %w", redactURLs(lastLines(msg, 6)), ErrGit)
	}
	if err != nil {
		return nil, fmt.Errorf("git jail: %v: %w", err, ErrGit)
	}
	return stdout.Bytes(), nil
}

// lastLines keeps the last n lines of s (git's last words say what failed).
func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// scriptValue reads the value of a "key value" line a jailed script printed ("" when absent).
func scriptValue(out []byte, key string) string {
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
