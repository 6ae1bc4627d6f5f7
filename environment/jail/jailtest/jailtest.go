// Package jailtest gives tests the directories a user would give Berth: fresh directories under
// the default temp dir (/tmp, mode 0700, below /tmp's sticky bit), where a jailed run's private
// /tmp, a root-owned 0700 parent and bubblewrap's own mount order all get in the way unless the
// jail is built right. Tests that check what a mask hides use Outside, which is outside /tmp (a
// private /tmp would hide a directory there by accident and prove nothing) and still below a
// 0700 directory.
package jailtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// RootVar names a directory to make Dir's directories in instead of the default temp dir (a
// benchmark puts them on a tmpfs such as /dev/shm).
const RootVar = "BERTH_JAIL_TEST_ROOT"

// Dir is a fresh, empty directory (mode 0755, like a user's checkout) inside a directory of
// mode 0700 of its own, under the default temp dir unless RootVar names another; both are
// removed when the test ends. Use it for data dirs and source repositories of tests whose
// commands run in the jail.
func Dir(t testing.TB) string {
	t.Helper()
	parent := mkdir(t, os.Getenv(RootVar))
	base := filepath.Base(parent)
	d := filepath.Join(parent, "d"+base[len(base)-6:]) // names stay unique, paths short (socket paths)
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// Outside is a fresh, empty directory outside /tmp, below a 0700 directory of its own: a data dir
// whose masks a test checks (under /tmp the jail's private /tmp would hide it anyway).
func Outside(t testing.TB) string {
	t.Helper()
	parent := mkdir(t, "/var/tmp")
	d := filepath.Join(parent, "data")
	if err := os.Mkdir(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

func mkdir(t testing.TB, root string) string {
	name := strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	if len(name) > 24 {
		name = name[:24]
	}
	d, err := os.MkdirTemp(root, "berth-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	d, err = filepath.EvalSymlinks(d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return filepath.Clean(d)
}

// Visible is a fresh directory a jailed run can see and enter: outside /tmp (which a jail has
// its own of) and mode 0755 down from /var/tmp. For markers a test shares with a command in the
// jail on purpose; never for a data dir.
func Visible(t testing.TB) string {
	t.Helper()
	d := mkdir(t, "/var/tmp")
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}
