package jobs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"berth/workspace"

	"berth/environment/datadir"
)

// TestSweepImageStaging: the sweep removes the staging directories that killed image imports
// left under images/<environment>/ (their process is gone) and keeps a live import's and the
// versions themselves.
func TestSweepImageStaging(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	env := filepath.Join(data, "images", "0b5e9d0c-7a0f-4e47-9d43-0000000000e1")
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	gone := strconv.Itoa(dead.Process.Pid)
	for _, d := range []string{"1", ".import.staging-" + gone + "-123", ".2.staging-" + gone + "-456", ".oci.staging-" + gone + "-789"} {
		if err := os.MkdirAll(filepath.Join(env, d, "tree"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	live, err := os.MkdirTemp(env, workspace.StagingPattern("import"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := SweepImageStaging(datadir.At(data))
	if err != nil || n != 3 {
		t.Fatalf("sweep = %d, %v; want 3 removed", n, err)
	}
	entries, _ := os.ReadDir(env)
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if len(left) != 2 || left[0] != filepath.Base(live) && left[1] != filepath.Base(live) {
		t.Fatalf("left %v, want version 1 and the live staging dir", left)
	}
}
