package plugincheck

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"berth/environment"
)

// run is the suite, in order; a step later ones depend on ends the run when it fails.
func (s *suite) run(ctx context.Context, cfg environment.Config) {
	if !s.step(ctx, "start and info", 30*time.Second, func(ctx context.Context) (string, error) {
		info, err := s.host.Info(ctx, cfg.Plugin)
		if err != nil {
			return "", err
		}
		if info.Name == "" || info.Version == "" {
			return "", errors.New("Info must name the plugin and its version")
		}
		return fmt.Sprintf("%s %s, protocol %d, capabilities %v", info.Name, info.Version, info.ProtocolVersion, info.Capabilities), nil
	}) {
		return
	}
	s.step(ctx, "probe", 3*time.Minute, func(ctx context.Context) (string, error) {
		r, err := s.drv.Probe(ctx)
		if err != nil {
			return "", err
		}
		if !r.OK {
			return "", fmt.Errorf("the probe failed: %s", r.Summary)
		}
		return r.Summary, nil
	})
	key := "plugin-test-" + randomHex() + ":1"
	var inst environment.Instance
	if !s.step(ctx, "acquire (idempotent)", 10*time.Minute, func(ctx context.Context) (string, error) {
		var err error
		if inst, err = s.drv.Acquire(ctx, environment.AcquireRequest{Key: key, Tag: "plugin-test"}); err != nil {
			return "", err
		}
		again, err := s.drv.Acquire(ctx, environment.AcquireRequest{Key: key, Tag: "plugin-test"})
		if err != nil {
			return "", fmt.Errorf("a second Acquire with the same key: %w", err)
		}
		if again.Ref != inst.Ref {
			return "", fmt.Errorf("the same key gave two instances: %s and %s", inst.Ref, again.Ref)
		}
		return inst.Ref, nil
	}) {
		return
	}
	defer s.step(context.WithoutCancel(ctx), "release (twice)", 3*time.Minute, func(ctx context.Context) (string, error) {
		if err := s.drv.Release(ctx, inst); err != nil {
			return "", err
		}
		if err := s.drv.Release(ctx, inst); err != nil {
			return "", fmt.Errorf("releasing a released instance must succeed: %w", err)
		}
		return "", nil
	})
	host := filepath.Join(s.work, "workspace")
	var root string
	if !s.step(ctx, "realize", 5*time.Minute, func(ctx context.Context) (string, error) {
		if err := writeWorkspace(host); err != nil {
			return "", err
		}
		r, err := s.drv.Realize(ctx, environment.RealizeRequest{Instance: inst, WorkspaceRef: "ws-plugintest", HostPath: host})
		if err != nil {
			return "", err
		}
		root = r.Root
		return "workspace at " + root, nil
	}) {
		return
	}
	s.execSteps(ctx, root)
	s.step(ctx, "sync (verified capsule)", 5*time.Minute, func(ctx context.Context) (string, error) {
		res, out, err := s.exec(ctx, root, "echo changed > a.txt && rm delete-me.txt && mkdir -p new && echo n > new/n.txt", 0)
		if err != nil || res.ExitCode != 0 {
			return "", fmt.Errorf("changing the workspace: exit %d %v: %s", res.ExitCode, err, out)
		}
		if err := s.drv.Sync(ctx, environment.SyncRequest{Instance: inst, Root: root, HostPath: host}); err != nil {
			return "", err
		}
		return "", checkSynced(host)
	})
	s.step(ctx, "restart after a crash", 2*time.Minute, func(ctx context.Context) (string, error) {
		s.host.Kill(cfg.Plugin)
		if _, err := s.drv.Probe(ctx); err != nil {
			return "", err
		}
		info, err := s.host.Info(ctx, cfg.Plugin)
		if err != nil {
			return "", fmt.Errorf("not restarted: %w", err)
		}
		return "answering again: " + info.Name, nil
	})
}

// execSteps checks Exec: output and exit code, environment and directory, timeout, cancel, and
// that nothing a command started outlives it.
func (s *suite) execSteps(ctx context.Context, root string) {
	s.step(ctx, "exec: output and exit code", 2*time.Minute, func(ctx context.Context) (string, error) {
		res, out, err := s.exec(ctx, root, "echo to-stdout; echo to-stderr >&2; exit 3", 0)
		switch {
		case err != nil:
			return "", err
		case res.Started.IsZero():
			return "", errors.New("no started event")
		case res.ExitCode != 3:
			return "", fmt.Errorf("exit code %d, want 3", res.ExitCode)
		case !contains(out, "to-stdout\n", "to-stderr\n"):
			return "", fmt.Errorf("output %q lacks stdout or stderr", out)
		}
		return "", nil
	})
	s.step(ctx, "exec: environment and dir", 2*time.Minute, func(ctx context.Context) (string, error) {
		res, out, err := s.exec(ctx, root, `echo "$PLUGIN_TEST_VAR|$BERTH_RUN_ID|$(pwd)"`, 0)
		if err != nil {
			return "", err
		}
		if want := "value with spaces|" + s.lastTag + "|" + root + "\n"; out != want || res.ExitCode != 0 {
			return "", fmt.Errorf("got %q (exit %d), want %q", out, res.ExitCode, want)
		}
		return "", nil
	})
	s.step(ctx, "exec: timeout", 2*time.Minute, func(ctx context.Context) (string, error) {
		t0 := time.Now()
		res, _, err := s.exec(ctx, root, "while :; do :; done", time.Second)
		if err != nil {
			return "", err
		}
		if !res.TimedOut {
			return "", fmt.Errorf("a 1 s timeout did not end the command as timed out (exit %d)", res.ExitCode)
		}
		return fmt.Sprintf("stopped after %s", time.Since(t0).Round(10*time.Millisecond)), nil
	})
	s.step(ctx, "exec: cancel", 2*time.Minute, func(ctx context.Context) (string, error) {
		cctx, cancel := context.WithCancel(ctx)
		started := make(chan struct{})
		go func() {
			select {
			case <-started:
				time.Sleep(300 * time.Millisecond)
			case <-ctx.Done():
			}
			cancel()
		}()
		res, err := s.drv.Exec(cctx, environment.ExecRequest{Command: "while :; do :; done", Dir: root, Tag: s.tag(),
			OnStart: func(int) { close(started) }})
		if err != nil {
			return "", err
		}
		if !res.Cancelled {
			return "", fmt.Errorf("a cancelled command did not end as cancelled (exit %d)", res.ExitCode)
		}
		return "", nil
	})
	s.step(ctx, "exec: nothing outlives it", 2*time.Minute, func(ctx context.Context) (string, error) {
		if res, out, err := s.exec(ctx, root, "echo 0 > .bg; (i=0; while :; do i=$((i+1)); echo $i > .bg; done) >/dev/null 2>&1 & echo started", 0); err != nil || res.ExitCode != 0 {
			return "", fmt.Errorf("exit %d %v: %s", res.ExitCode, err, out)
		}
		res, out, err := s.exec(ctx, root, `read a < .bg; i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; read b < .bg; rm -f .bg; [ "$a" = "$b" ] && echo gone || echo "still running: $a $b"`, 0)
		if err != nil {
			return "", err
		}
		if res.ExitCode != 0 || !strings.HasSuffix(out, "gone\n") {
			return "", fmt.Errorf("a background process of an ended command kept running (%q)", strings.TrimSpace(out))
		}
		return "", nil
	})
}

// exec runs one command and returns its result and output.
func (s *suite) exec(ctx context.Context, root, command string, timeout time.Duration) (environment.ExecResult, string, error) {
	var out bytes.Buffer
	res, err := s.drv.Exec(ctx, environment.ExecRequest{Command: command, Dir: root, Log: &out, Tag: s.tag(), Timeout: timeout,
		Env: map[string]string{"PLUGIN_TEST_VAR": "value with spaces"}})
	return res, out.String(), err
}

// tag makes the next command's tag.
func (s *suite) tag() string {
	s.lastTag = "plugin-test-" + randomHex()
	return s.lastTag
}

func randomHex() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// writeWorkspace makes the small tree the suite realizes.
func writeWorkspace(dir string) error {
	files := map[string]string{"a.txt": "original\n", "delete-me.txt": "x\n", "sub/dir/b.txt": "b\n", "bin/tool.sh": "#!/bin/sh\necho tool\n"}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			return err
		}
	}
	return nil
}

// checkSynced checks that the host copy shows the changes the command made, and nothing else.
func checkSynced(dir string) error {
	if b, _ := os.ReadFile(filepath.Join(dir, "a.txt")); string(b) != "changed\n" {
		return fmt.Errorf("a.txt is %q on the host, want the changed content", b)
	}
	if _, err := os.Stat(filepath.Join(dir, "delete-me.txt")); !errors.Is(err, os.ErrNotExist) {
		return errors.New("a file removed on the instance is still on the host")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "new/n.txt")); string(b) != "n\n" {
		return errors.New("a file added on the instance did not reach the host")
	}
	if fi, err := os.Stat(filepath.Join(dir, "bin/tool.sh")); err != nil || fi.Mode().Perm()&0o100 == 0 {
		return errors.New("an executable lost its execute bit on the way")
	}
	return nil
}
