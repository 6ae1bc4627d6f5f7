package workspace

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestTreeDigestsAgree: the tree digest of a directory equals Pack's; a worktree's digest of what
// git would commit equals the digest of the commit's tree once it is committed; a capsule's tar
// gives back its digest; and one changed byte, a new file or an exec bit changes each of them.
func TestTreeDigestsAgree(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	repo := newRepo(t, map[string]string{"README.md": "hello\n", "src/a.go": "package a\n", "src/deep/b.txt": "b\n"})
	if err := os.WriteFile(filepath.Join(repo, ".gitignore"), []byte("ignored/\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	writeFiles(t, repo, map[string]string{"ignored/big.bin": "not committed\n"})
	if err := os.Symlink("README.md", filepath.Join(repo, "link")); err != nil {
		t.Fatal(err)
	}
	gitT(t, repo, "add", "-A")
	gitT(t, repo, "commit", "-qm", "files")

	var buf bytes.Buffer
	c, err := Pack(ctx, repo, &buf)
	if err != nil {
		t.Fatal(err)
	}
	fsd, err := TreeDigest(ctx, repo)
	if err != nil || fsd != c.TreeDigest {
		t.Fatalf("TreeDigest = %s, %v; Pack = %s", fsd, err, c.TreeDigest)
	}
	if cd, err := CapsuleTreeDigest(ctx, bytes.NewReader(buf.Bytes())); err != nil || cd != c.TreeDigest {
		t.Fatalf("CapsuleTreeDigest = %s, %v; want %s", cd, err, c.TreeDigest)
	}
	// The worktree digests of a workspace of this repository, against its commits' digests.
	gitDir := filepath.Join(repo, ".git")
	res, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: repo, TaskKey: "DIG-1"})
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(m.Base(), res.Cwd)
	writeFiles(t, root, map[string]string{"ignored/big.bin": "not committed\n"})
	wt, err := m.WorktreeDigest(ctx, res.Ref)
	if err != nil {
		t.Fatal(err)
	}
	gd, err := m.GitTreeDigest(ctx, gitDir, "HEAD")
	if err != nil || gd != wt {
		t.Fatalf("GitTreeDigest(HEAD) = %s, %v; WorktreeDigest = %s", gd, err, wt)
	}
	if wt == fsd {
		t.Fatal("the worktree digest counted the ignored file (it equals the whole directory's)")
	}

	// Each change moves the digests.
	writeFiles(t, root, map[string]string{"src/a.go": "package b\n"})
	wt2, _ := m.WorktreeDigest(ctx, res.Ref)
	writeFiles(t, repo, map[string]string{"src/a.go": "package b\n"})
	fsd2, _ := TreeDigest(ctx, repo)
	if wt2 == wt || fsd2 == fsd {
		t.Fatal("a changed byte left a digest unchanged")
	}
	if err := os.Chmod(filepath.Join(root, "src/deep/b.txt"), 0o755); err != nil {
		t.Fatal(err)
	}
	if wt3, _ := m.WorktreeDigest(ctx, res.Ref); wt3 == wt2 {
		t.Fatal("an exec bit left the worktree digest unchanged")
	}
	c2, err := m.Commit(ctx, res.Ref, CommitSpec{Branch: res.Branch, TaskKey: "DIG-1", RunID: "r1"})
	if err != nil || !c2.Changed {
		t.Fatalf("commit: %+v %v", c2, err)
	}
	wt4, _ := m.WorktreeDigest(ctx, res.Ref)
	if gd3, _ := m.GitTreeDigest(ctx, gitDir, c2.Tip); gd3 != wt4 || gd3 == gd {
		t.Fatalf("after commit: git %s, worktree %s, before %s", gd3, wt4, gd)
	}
	// By commit id (memoized, treedigest_cache.go): each commit keeps its own digest, twice over.
	for range 2 {
		if d, err := m.GitTreeDigest(ctx, gitDir, res.BaseCommit); err != nil || d != gd {
			t.Fatalf("GitTreeDigest(base id) = %s, %v; want %s", d, err, gd)
		}
		if d, err := m.GitTreeDigest(ctx, gitDir, c2.Tip); err != nil || d != wt4 {
			t.Fatalf("GitTreeDigest(tip id) = %s, %v; want %s", d, err, wt4)
		}
	}
}
