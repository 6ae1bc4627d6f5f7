package workspace

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHostileSymlinks (DESIGN §14): a run plants symlinks in its workspace to a secret file and a
// directory outside it. The file browser refuses them, a capsule and a tree digest record the
// links and never their targets' bytes, and destroying the workspace deletes the links, not what
// they name. The negative control reads the secret through the same link with a plain path read.
func TestHostileSymlinks(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	src := t.TempDir()
	writeFiles(t, src, map[string]string{"README.md": "hi\n"})
	res, err := m.RealizeCopy(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(m.Base(), res.Ref)
	victim := t.TempDir()
	const secret = "the-victims-secret"
	writeFiles(t, victim, map[string]string{"secret.key": secret, "keep/data.txt": "keep"})
	for link, target := range map[string]string{"shadow": filepath.Join(victim, "secret.key"), "outside": victim, "sub/up": "../../../.."} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, link)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	// Negative control: the link does lead to the secret for anything that follows it.
	if b, err := os.ReadFile(filepath.Join(root, "shadow")); err != nil || string(b) != secret {
		t.Fatalf("control: the planted link does not reach the secret (%q, %v)", b, err)
	}

	files, err := NewFiles(FileLimits{}, FileRoot{Name: "w", Dir: root})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"shadow", "outside/secret.key", "sub/up/etc/passwd"} {
		if c, err := files.Read(ctx, "w", p); err == nil {
			t.Errorf("file browser read %s through a link: %q", p, c.Content)
		}
	}

	var tarball bytes.Buffer
	capsule, err := Pack(ctx, root, &tarball)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(tarball.Bytes(), []byte(secret)) || bytes.Contains(tarball.Bytes(), []byte("keep")) {
		t.Fatal("the capsule carries bytes from outside the workspace")
	}
	if len(capsule.Skipped) < 3 {
		t.Errorf("capsule skipped %+v, want the three links reported", capsule.Skipped)
	}

	d1, err := TreeDigest(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	writeFiles(t, victim, map[string]string{"secret.key": "changed outside"})
	if d2, err := TreeDigest(ctx, root); err != nil || d2 != d1 {
		t.Fatalf("the tree digest depends on a link's target (%s then %s, %v)", d1, d2, err)
	}

	if err := m.Destroy(ctx, res.Ref); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(root); !os.IsNotExist(err) {
		t.Fatalf("workspace still there: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(victim, "keep", "data.txt")); err != nil || !strings.Contains(string(b), "keep") {
		t.Fatalf("destroy reached through a link: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(victim, "secret.key")); err != nil {
		t.Fatalf("destroy removed the link's target: %v", err)
	}
}
