package jail

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestHandOverFollowsNoLink (DESIGN §14): a run plants symlinks in its workspace to a file and a
// directory outside it, and a hard link to a file outside it; handing the tree over changes the
// links themselves, never what they name. The negative control changes the owner through the
// link with a path-based chown, as a naive hand-over would, and the victim does change.
func TestHandOverFollowsNoLink(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("changing owners needs root")
	}
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	ws := filepath.Join(dir, "ws")
	for _, d := range []string{filepath.Join(victim, "sub"), filepath.Join(ws, "a")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(victim, "secret"), filepath.Join(victim, "sub", "inner"), filepath.Join(victim, "hard")} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink(filepath.Join(victim, "secret"), filepath.Join(ws, "a", "file-link")))
	must(os.Symlink(victim, filepath.Join(ws, "dir-link")))
	must(os.Link(filepath.Join(victim, "hard"), filepath.Join(ws, "hard")))
	owner := func(p string) uint32 {
		t.Helper()
		var st syscall.Stat_t
		must(syscall.Lstat(p, &st))
		return st.Uid
	}
	const uid, gid = 4242, 4242
	must(chownTree(ws, uid, gid))
	for _, p := range []string{filepath.Join(victim, "secret"), filepath.Join(victim, "sub", "inner"), filepath.Join(victim, "hard"), victim} {
		if owner(p) != 0 {
			t.Errorf("%s changed hands through a link (uid %d)", p, owner(p))
		}
	}
	if owner(filepath.Join(ws, "a", "file-link")) != uid || owner(filepath.Join(ws, "a")) != uid || owner(ws) != uid {
		t.Errorf("the workspace itself was not handed over")
	}
	// Negative control: a chown that follows the planted link reaches the victim.
	must(os.Chown(filepath.Join(ws, "a", "file-link"), uid, gid))
	if owner(filepath.Join(victim, "secret")) != uid {
		t.Fatal("control: chown through the link did not reach the victim; the probe proves nothing")
	}
}
