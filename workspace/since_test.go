package workspace

import (
	"path/filepath"
	"testing"
)

// TestCommitsSinceAfterMerge is the newcomer's case on real git: the task branch has one commit,
// the base branch merges it. Against the base branch the worktree is then 0 ahead (and merged);
// against the recorded base commit it is still 1 ahead, which is what the page must also say.
func TestCommitsSinceAfterMerge(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	repo := newRepo(t, map[string]string{"README.md": "hi\n"})
	res, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: repo, TaskKey: "PRJ-8"})
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(m.Base(), res.Cwd)
	if n, err := m.CommitsSince(ctx, res.Ref, res.BaseCommit); err != nil || n != 0 {
		t.Fatalf("fresh worktree: %d commits since base (%v), want 0", n, err)
	}
	writeFiles(t, root, map[string]string{"work.txt": "done\n"})
	if _, err := m.Commit(ctx, res.Ref, CommitSpec{Branch: res.Branch, TaskKey: "PRJ-8", RunID: "run-1"}); err != nil {
		t.Fatal(err)
	}
	gitT(t, repo, "merge", "-q", "--no-ff", "-m", "merge the task", res.Branch)
	commitFile(t, repo, "later.txt", "x", "later")

	st, err := m.GitState(ctx, res.Ref, res.BaseRef)
	if err != nil || !st.Readable || st.Ahead != 0 || !st.Merged || st.Behind != 2 {
		t.Fatalf("against the base branch after the merge: %+v %v", st, err)
	}
	if n, err := m.CommitsSince(ctx, res.Ref, res.BaseCommit); err != nil || n != 1 {
		t.Fatalf("against the recorded base commit: %d (%v), want 1", n, err)
	}
	for _, bad := range []string{"", "HEAD", "main", "--all", res.BaseCommit[:12], res.BaseCommit + "x"} {
		if _, err := m.CommitsSince(ctx, res.Ref, bad); err == nil {
			t.Errorf("CommitsSince(%q) accepted", bad)
		}
	}
}
