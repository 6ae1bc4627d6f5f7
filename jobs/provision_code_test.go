package jobs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"berth/workspace"
)

// TestRealizeErrorCode realizes a copy over a real quota and checks the run's error_code.
func TestRealizeErrorCode(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "big.bin"), make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := workspace.NewManager(t.TempDir(), workspace.Options{CopyMaxBytes: 1024})
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.RealizeCopy(t.Context(), src)
	if got := realizeErrorCode(fmt.Errorf("provision: %w", err)); got != "source_too_large" {
		t.Fatalf("over quota (%v): code %q, want source_too_large", err, got)
	}
	if got := realizeErrorCode(errors.New("git failed")); got != "realize_failed" {
		t.Fatalf("other failure: code %q, want realize_failed", got)
	}
}
