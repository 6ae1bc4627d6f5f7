// Package jailtest gives tests directories a jailed run can use: outside /tmp (every jail has a
// private /tmp, which would hide a directory there by accident and prove nothing) and traversable
// by the berth-run user when the tests run as root.
package jailtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// RootVar names a directory to make Dir's directories in instead of /var/tmp (a benchmark puts
// them on a tmpfs such as /dev/shm); it must be traversable by others.
const RootVar = "BERTH_JAIL_TEST_ROOT"

// Dir is a fresh, empty directory (mode 0755 down from /var/tmp) removed when the test ends. Use
// it for data dirs and source repositories of tests whose commands run in the jail.
func Dir(t testing.TB) string {
	t.Helper()
	name := strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	if len(name) > 40 {
		name = name[:40]
	}
	root := os.Getenv(RootVar)
	if root == "" {
		root = "/var/tmp"
	}
	d, err := os.MkdirTemp(root, "berth-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return filepath.Clean(d)
}
