package workspace

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestCommitAndGitState(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	repo := newRepo(t, map[string]string{"README.md": "hi\n", ".gitignore": "*.log\n"})
	res, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: repo, TaskKey: "PRJ-7"})
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(m.Base(), res.Cwd)

	st, err := m.GitState(ctx, res.Ref, res.BaseRef)
	if err != nil || !st.Readable || st.Dirty != 0 || st.Untracked != 0 || st.Ahead != 0 || !st.Merged {
		t.Fatalf("fresh state %+v %v", st, err)
	}
	// Nothing to commit: no commit, no error.
	if c, err := m.Commit(ctx, res.Ref, CommitSpec{Branch: res.Branch, TaskKey: "PRJ-7", RunID: "run-1"}); err != nil || c.Changed || c.Commit != "" {
		t.Fatalf("empty commit = %+v, %v", c, err)
	}

	writeFiles(t, root, map[string]string{"README.md": "changed\n", "new.go": "package x\n", "debug.log": "ignored"})
	st, _ = m.GitState(ctx, res.Ref, res.BaseRef)
	if st.Dirty != 1 || st.Untracked != 1 {
		t.Fatalf("dirty state %+v", st)
	}
	author := Identity{Name: "Agent Smith", Email: "smith@example.com"}
	c, err := m.Commit(ctx, res.Ref, CommitSpec{Branch: res.Branch, TaskKey: "PRJ-7", RunID: "run-1", Author: author})
	if err != nil || !c.Changed || len(c.Commit) != 40 {
		t.Fatalf("commit = %+v, %v", c, err)
	}
	msg := gitT(t, repo, "log", "-1", "--format=%an <%ae>%n%B", res.Branch)
	if !strings.Contains(msg, "Agent Smith <smith@example.com>") || !strings.Contains(msg, "PRJ-7") || !strings.Contains(msg, "run-1") {
		t.Fatalf("commit message:\n%s", msg)
	}
	files := gitT(t, repo, "show", "--name-only", "--format=", res.Branch)
	if strings.Contains(files, "debug.log") || !strings.Contains(files, "new.go") {
		t.Fatalf(".gitignore not applied: %s", files)
	}
	// The commit is on the task branch in the source repository; nothing else moved.
	if got := gitT(t, repo, "rev-parse", "refs/heads/"+res.Branch); got != c.Commit {
		t.Fatalf("branch at %s, want %s", got, c.Commit)
	}
	st, _ = m.GitState(ctx, res.Ref, res.BaseRef)
	if st.Ahead != 1 || st.Behind != 0 || st.Merged || st.Dirty != 0 || st.Untracked != 0 {
		t.Fatalf("after commit %+v", st)
	}
	// Merging into the base makes it merged; a new base commit makes it behind.
	gitT(t, repo, "merge", "-q", "--ff-only", res.Branch)
	commitFile(t, repo, "later.txt", "x", "later")
	st, _ = m.GitState(ctx, res.Ref, res.BaseRef)
	if !st.Merged || st.Behind != 1 || st.Ahead != 0 {
		t.Fatalf("after merge %+v", st)
	}

	// A run that detached HEAD still has its work committed on the task branch; another branch
	// than the workspace's is refused; unreadable states.
	runGit(t, m, res.Ref, "checkout", "-q", "--detach")
	writeFiles(t, root, map[string]string{"after-detach.txt": "x\n"})
	if c, err := m.Commit(ctx, res.Ref, CommitSpec{Branch: res.Branch, TaskKey: "PRJ-7", RunID: "run-2"}); err != nil || !c.Changed ||
		gitT(t, repo, "rev-parse", "refs/heads/"+res.Branch) != c.Commit {
		t.Fatalf("detached commit: %+v %v", c, err)
	}
	if _, err := m.Commit(ctx, res.Ref, CommitSpec{Branch: "berth/OTHER-1", TaskKey: "PRJ-7", RunID: "run-2"}); !errors.Is(err, ErrWrongBranch) {
		t.Fatalf("commit for another branch: %v", err)
	}
	if st, err := m.GitState(ctx, "ws-"+strings.Repeat("0", 32), "main"); err != nil || st.Readable {
		t.Fatalf("non-repo state %+v %v", st, err)
	}
	if st, err := m.GitState(ctx, res.Ref, "refs/heads/does-not-exist"); err != nil || st.Readable {
		t.Fatalf("missing base state %+v %v", st, err)
	}
}

func TestRescueKeepsWorktreeUntouched(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	repo := newRepo(t, map[string]string{"a.txt": "a", ".gitignore": "tmp/\n"})
	res, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: repo, TaskKey: "PRJ-8"})
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(m.Base(), res.Cwd)
	writeFiles(t, root, map[string]string{"a.txt": "changed", "untracked.txt": "u", "tmp/x": "ignored"})
	runGit(t, m, res.Ref, "add", "a.txt") // a staged change must survive untouched
	statusBefore := runGit(t, m, res.Ref, "status", "--porcelain")

	now := time.Unix(1_700_000_000, 0)
	rr, err := m.Rescue(ctx, res.Ref, now)
	if err != nil {
		t.Fatal(err)
	}
	if rr.Name != "refs/berth/rescue/"+res.Ref+"-1700000000" {
		t.Fatalf("rescue ref %q", rr.Name)
	}
	if got := gitT(t, repo, "rev-parse", rr.Name); got != rr.Commit {
		t.Fatalf("rescue ref at %s", got)
	}
	files := gitT(t, repo, "ls-tree", "-r", "--name-only", rr.Commit)
	if !strings.Contains(files, "untracked.txt") || strings.Contains(files, "tmp/x") {
		t.Fatalf("rescue tree: %s", files)
	}
	if gitT(t, repo, "show", rr.Commit+":a.txt") != "changed" {
		t.Fatal("rescue lacks the modification")
	}
	if statusBefore != runGit(t, m, res.Ref, "status", "--porcelain") || runGit(t, m, res.Ref, "rev-parse", "HEAD") != res.BaseCommit {
		t.Fatal("rescue changed the worktree, index or branch")
	}
	if _, err := m.Rescue(ctx, res.Ref, now); !errors.Is(err, ErrGit) {
		t.Fatalf("second rescue with the same name overwrote: %v", err)
	}
	// The rescue ref survives destroying the workspace.
	if err := m.Destroy(ctx, res.Ref); err != nil {
		t.Fatal(err)
	}
	gitT(t, repo, "rev-parse", "--verify", rr.Name)
}

func TestFinalizeCopyChanges(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	src := t.TempDir()
	writeFiles(t, src, map[string]string{"keep.txt": "k", "edit.txt": "v1", "gone.txt": "g", "dir/x.txt": "x"})
	res, err := m.RealizeCopy(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(m.Base(), res.Cwd)
	writeFiles(t, root, map[string]string{"edit.txt": "v2", "added.txt": "a"})
	if err := os.Remove(filepath.Join(root, "gone.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, "keep.txt"), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	fin, err := m.FinalizeCopy(ctx, res.Ref, &buf)
	if err != nil {
		t.Fatal(err)
	}
	c := fin.Changes
	if !slices.Equal(c.Added, []string{"added.txt"}) || !slices.Equal(c.Modified, []string{"edit.txt", "keep.txt"}) || !slices.Equal(c.Removed, []string{"gone.txt"}) {
		t.Fatalf("changes %+v", c)
	}
	if int64(buf.Len()) != fin.Capsule.TarBytes || fin.Capsule.TreeDigest == res.TreeDigest {
		t.Fatalf("capsule %+v (%d bytes)", fin.Capsule, buf.Len())
	}
	// The capsule imports back into an identical tree.
	dst := filepath.Join(t.TempDir(), "out")
	if err := Import(ctx, &buf, fin.Capsule.Manifest, dst, Limits{}); err != nil {
		t.Fatal(err)
	}
	if mustRead(t, filepath.Join(dst, "edit.txt")) != "v2" {
		t.Fatal("imported content")
	}
	if _, err := m.BaseManifest(newRef()); !errors.Is(err, ErrNotManaged) {
		t.Fatalf("unknown base manifest: %v", err)
	}
}

// TestCommitWithoutJail: on a host without bubblewrap Berth's git scripts run on the host (only
// uncontained environments run there); finalize still commits the run's work onto the task
// branch in the source, and a second finalize builds on the first.
func TestCommitWithoutJail(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m, err := NewManager(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	repo := newRepo(t, map[string]string{"README.md": "hi\n"})
	res, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: repo, TaskKey: "PRJ-8"})
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(m.Base(), res.Cwd)
	for i, body := range []string{"one\n", "two\n"} {
		writeFiles(t, root, map[string]string{"README.md": body})
		c, err := m.Commit(ctx, res.Ref, CommitSpec{Branch: res.Branch, TaskKey: "PRJ-8", RunID: fmt.Sprint("run-", i)})
		if err != nil || !c.Changed {
			t.Fatalf("commit %d = %+v, %v", i, c, err)
		}
		if got := gitT(t, repo, "rev-parse", "refs/heads/"+res.Branch); got != c.Commit {
			t.Fatalf("commit %d: branch at %s, want %s", i, got, c.Commit)
		}
	}
	if st, _ := m.GitState(ctx, res.Ref, res.BaseRef); st.Ahead != 2 || st.Dirty != 0 {
		t.Fatalf("after two commits %+v", st)
	}
}
