package terminal

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"berth/environment"
	"berth/environment/jail"
)

// jailedShell starts the setup shell exactly as a setup session does (environment.StartSetupShell:
// the setup jail profile over a scratch layer at /opt/image, bash right on the pty), for the
// benchmarks' "jailed" figures. The scratch layer holds the throughput file as
// /opt/image/cat-me.txt when one is given.
type jailedShell struct {
	start func() (Pty, error)
}

// newJailedShell is nil (and says why in the log) when this machine has no jail.
func newJailedShell(b *testing.B, file string) *jailedShell {
	b.Helper()
	h, err := jail.Detect(context.Background())
	if err != nil {
		b.Logf("jailed figures skipped: %v", err)
		return nil
	}
	// Outside /tmp (the jail has its own) and traversable by the run user when Berth is root.
	data, err := os.MkdirTemp("/var/tmp", "berth-termbench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(data) })
	if err := os.Chmod(data, 0o755); err != nil {
		b.Fatal(err)
	}
	layer := filepath.Join(data, "images", "env", "scratch-bench")
	ws := filepath.Join(data, "setup-sessions", "bench", "workspace")
	for _, d := range []string{layer, ws} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	if file != "" {
		if err := copyFile(file, filepath.Join(layer, "cat-me.txt")); err != nil {
			b.Fatal(err)
		}
	}
	cfg := environment.SandboxConfig{PidsMax: 256}
	return &jailedShell{start: func() (Pty, error) {
		t, err := environment.StartSetupShell(environment.SetupShell{Jail: h, DataDir: data,
			Layer: layer, Workspace: ws, Config: cfg}, 80, 24)
		if err != nil {
			return nil, err
		}
		return t, nil
	}}
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
