package plugincheck

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"berth/environment"
)

// buildTestPlugin builds testplugin as dir/name (0755) in a directory the plugin user can reach.
func buildTestPlugin(t *testing.T, name string) string {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "berth-plugincheck-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, name)
	if b, err := exec.Command("go", "build", "-o", out, "./testplugin").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, b)
	}
	return out
}

// TestContractSuite runs the suite against the test plugin keeping the contract (it must pass:
// the negative control) and against plugins that lie about a digest, crash or hang: each must
// fail, at the step that catches it, with a message that says what happened.
func TestContractSuite(t *testing.T) {
	t.Parallel()
	runAs, err := environment.PluginRunAs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		ok     bool
		step   string
		detail string
	}{
		{name: "keeper", ok: true},
		{name: "tp-liar", step: "sync (verified capsule)", detail: "lied about the tree digest"},
		{name: "tp-crash", step: "exec: output and exit code", detail: "driver_unavailable: plugin tp-crash stopped"},
		{name: "tp-hang", step: "start and info", detail: "context deadline exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out strings.Builder
			rep, err := Run(context.Background(), Options{Path: buildTestPlugin(t, tc.name), RunAs: runAs, Out: &out})
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK != tc.ok {
				t.Fatalf("OK = %v, want %v; report:\n%s", rep.OK, tc.ok, out.String())
			}
			if tc.ok {
				if len(rep.Steps) != 12 {
					t.Fatalf("%d steps ran, want all 12:\n%s", len(rep.Steps), out.String())
				}
				return
			}
			for _, s := range rep.Steps {
				if s.Name == tc.step {
					if s.OK || !strings.Contains(s.Detail, tc.detail) {
						t.Fatalf("step %q: ok=%v detail %q, want a failure saying %q", s.Name, s.OK, s.Detail, tc.detail)
					}
					return
				}
			}
			t.Fatalf("no step %q ran:\n%s", tc.step, out.String())
		})
	}
}
