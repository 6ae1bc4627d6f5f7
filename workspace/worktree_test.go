package workspace

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestGitWorktreeLocal(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	repo := newRepo(t, map[string]string{"README.md": "hi\n"})
	base := gitT(t, repo, "rev-parse", "HEAD")

	res, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: repo, TaskKey: "PRJ-1"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Branch != "berth/PRJ-1" || res.BaseCommit != base || res.BaseRef != "refs/heads/main" || res.Reused || res.Cwd != res.Ref {
		t.Fatalf("result %+v", res)
	}
	if want := "git:" + gitT(t, repo, "rev-parse", "HEAD^{tree}"); res.TreeDigest != want {
		t.Fatalf("tree digest %q, want %q", res.TreeDigest, want)
	}
	root := filepath.Join(m.Base(), res.Cwd)
	if mustRead(t, filepath.Join(root, "README.md")) != "hi\n" {
		t.Fatal("worktree content")
	}
	// The branch lives in the source repository itself.
	if got := gitT(t, repo, "rev-parse", "refs/heads/berth/PRJ-1"); got != base {
		t.Fatalf("branch at %s", got)
	}

	// Same task again while the worktree is clean and unstarted: reused, not failed.
	again, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: repo, TaskKey: "PRJ-1"})
	if err != nil {
		t.Fatal(err)
	}
	if !again.Reused || again.Ref != res.Ref {
		t.Fatalf("second realization %+v, want reuse of %s", again, res.Ref)
	}

	// Once work started (dirty), the worktree cannot be reused.
	writeFiles(t, root, map[string]string{"new.txt": "x"})
	if _, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: repo, TaskKey: "PRJ-1"}); !errors.Is(err, ErrBranchInUse) {
		t.Fatalf("dirty reuse: %v", err)
	}

	// Destroy unregisters the worktree and keeps the branch (a work product).
	if err := m.Destroy(ctx, res.Ref); err != nil {
		t.Fatal(err)
	}
	if out := gitT(t, repo, "worktree", "list"); strings.Contains(out, res.Ref) {
		t.Fatalf("worktree still registered:\n%s", out)
	}
	gitT(t, repo, "rev-parse", "--verify", "refs/heads/berth/PRJ-1")

	// Reopen: the existing branch is checked out in a fresh root.
	reopened, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: repo, TaskKey: "PRJ-1"})
	if err != nil {
		t.Fatal(err)
	}
	if reopened.Reused || reopened.Ref == res.Ref {
		t.Fatalf("reopen %+v", reopened)
	}
}

func TestGitWorktreeBranchRules(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	repo := newRepo(t, nil)

	// A branch with unrelated history is refused.
	gitT(t, repo, "checkout", "-q", "--orphan", "berth/PRJ-2")
	commitFile(t, repo, "other.txt", "x", "unrelated")
	gitT(t, repo, "checkout", "-q", "main")
	if _, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: repo, TaskKey: "PRJ-2"}); !errors.Is(err, ErrBranchConflict) {
		t.Fatalf("unrelated branch: %v", err)
	}

	// A branch checked out in a worktree Berth does not manage is refused.
	gitT(t, repo, "branch", "berth/PRJ-3", "main")
	gitT(t, repo, "worktree", "add", "-q", filepath.Join(t.TempDir(), "wt"), "berth/PRJ-3")
	if _, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: repo, TaskKey: "PRJ-3"}); !errors.Is(err, ErrBranchInUse) {
		t.Fatalf("foreign worktree: %v", err)
	}

	// An unstarted branch left behind by a moved base is fast-forwarded, not refused.
	gitT(t, repo, "branch", "berth/PRJ-4", "main")
	newBase := commitFile(t, repo, "b.txt", "b", "base moves")
	res, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: repo, TaskKey: "PRJ-4"})
	if err != nil {
		t.Fatal(err)
	}
	if got := runGit(t, m, res.Ref, "rev-parse", "HEAD"); got != newBase || res.BaseCommit != newBase {
		t.Fatalf("worktree at %s, base %s, want %s", got, res.BaseCommit, newBase)
	}

	// Branch templates: rendered, validated with check-ref-format.
	for _, tc := range []struct{ tmpl, key string }{
		{"", ""}, {"feature/{task_key}", "a..b"}, {"{task_key}", "-rf"}, {"x/{other}", "K-1"},
		{"x/{task_key}", "a b"}, {"x/{task_key}.lock", "K"}, {"x/{task_key}", "K@{1}"},
	} {
		if _, err := m.RenderBranch(ctx, tc.tmpl, tc.key); !errors.Is(err, ErrBadBranch) {
			t.Errorf("RenderBranch(%q, %q) = %v, want ErrBadBranch", tc.tmpl, tc.key, err)
		}
	}
	if b, err := m.RenderBranch(ctx, "tasks/{task_key}/work", "PRJ-9"); err != nil || b != "tasks/PRJ-9/work" {
		t.Fatalf("RenderBranch = %q, %v", b, err)
	}
	if _, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: repo, TaskKey: "PRJ-5", DefaultRef: "--upload-pack=evil"}); !errors.Is(err, ErrBadBranch) {
		t.Fatalf("option-looking default ref: %v", err)
	}
	if _, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: repo, TaskKey: "PRJ-5", DefaultRef: "nope"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing default ref: %v", err)
	}
	if _, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: "relative/repo", TaskKey: "PRJ-5"}); !errors.Is(err, ErrUnsafePath) {
		t.Fatalf("relative source: %v", err)
	}
}

func TestGitWorktreeRemoteCache(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	upstream := newRepo(t, map[string]string{"a.txt": "v1"})
	url := "file://" + upstream

	res, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: url, TaskKey: "R-1"})
	if err != nil {
		t.Fatal(err)
	}
	if res.BaseRef != "refs/remotes/origin/main" {
		t.Fatalf("base ref %q", res.BaseRef)
	}
	norm, err := NormalizeGitURL(url)
	if err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(filepath.Join(filepath.Dir(m.Base()), "git-cache"))
	if len(entries) != 1 {
		t.Fatalf("cache entries %v", entries)
	}
	// The task branch is in the cache, never in the upstream (nothing is pushed).
	if _, err := os.Stat(filepath.Join(upstream, ".git", "refs", "heads", "berth")); !os.IsNotExist(err) {
		t.Fatalf("upstream got a berth branch: %v", err)
	}

	// Later preparations fetch: a new upstream commit becomes the base of the next task.
	v2 := commitFile(t, upstream, "a.txt", "v2", "v2")
	res2, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: url + "/", TaskKey: "R-2"})
	if err != nil {
		t.Fatal(err)
	}
	if res2.BaseCommit != v2 {
		t.Fatalf("second task based on %s, want fetched %s (cache key %s)", res2.BaseCommit, v2, norm)
	}
	if mustRead(t, filepath.Join(m.Base(), res2.Cwd, "a.txt")) != "v2" {
		t.Fatal("stale content")
	}
	entries, _ = os.ReadDir(filepath.Join(filepath.Dir(m.Base()), "git-cache"))
	if len(entries) != 1 {
		t.Fatalf("cache not reused: %v", entries)
	}
	// Fetching never clobbers the task branches kept in the cache.
	st, err := m.GitState(ctx, res.Ref, "refs/remotes/origin/main")
	if err != nil || !st.Readable || st.Behind != 1 || st.Branch != "berth/R-1" {
		t.Fatalf("first worktree state %+v, %v", st, err)
	}
	if err := m.Destroy(ctx, res.Ref); err != nil {
		t.Fatal(err)
	}
}

func TestNormalizeGitURL(t *testing.T) {
	t.Parallel()
	same := []string{"https://Example.com/org/repo.git", "https://example.com/org/repo", "https://user:tok@example.com/org/repo/", "HTTPS://example.com/org/repo.git/"}
	want, err := NormalizeGitURL(same[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range same[1:] {
		if got, err := NormalizeGitURL(s); err != nil || got != want {
			t.Errorf("NormalizeGitURL(%q) = %q, %v; want %q", s, got, err, want)
		}
	}
	if got, _ := NormalizeGitURL("git@github.com:org/repo.git"); got != "ssh://github.com/org/repo" {
		t.Errorf("scp-like: %q", got)
	}
	for _, s := range []string{"", "-u evil", "ext::sh -c evil", "relative/path", "C:/repo", "ftp://x/y", "https://x/y z"} {
		if _, err := NormalizeGitURL(s); !errors.Is(err, ErrUnsafePath) {
			t.Errorf("NormalizeGitURL(%q) = %v, want ErrUnsafePath", s, err)
		}
	}
}

// TestGitCancelKillsProcessGroup proves that cancelling the context kills git and what it spawned.
func TestGitCancelKillsProcessGroup(t *testing.T) {
	t.Parallel()
	m := newTestManager(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() {
		_, err := m.git.run(ctx, gitCall{}, "-c", "alias.hang=!sleep 300 & echo $! > "+pidFile+"; wait", "hang")
		done <- err
	}()
	var pid int
	deadline := time.Now().Add(30 * time.Second)
	for pid == 0 {
		if time.Now().After(deadline) {
			t.Fatal("alias never started")
		}
		if b, err := os.ReadFile(pidFile); err == nil && strings.HasSuffix(string(b), "\n") {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("git did not return after cancel")
	}
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("grandchild %d survived cancellation", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestGitIgnoresUserConfigAndHooks(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	repo := newRepo(t, nil)
	marker := filepath.Join(t.TempDir(), "hook-ran")
	hook := filepath.Join(repo, ".git", "hooks", "post-checkout")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\ntouch "+marker+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	res, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: repo, TaskKey: "H-1"})
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(m.Base(), res.Cwd)
	if err := os.WriteFile(filepath.Join(repo, ".git", "hooks", "pre-commit"), []byte("#!/bin/sh\ntouch "+marker+"\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFiles(t, root, map[string]string{"x.txt": "x"})
	if _, err := m.Commit(ctx, res.Ref, CommitSpec{Branch: "berth/H-1", TaskKey: "H-1", RunID: "r1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatal("a repository hook ran")
	}
}

// TestGitWorktreeCheckoutFailureLeavesNothing: when the checkout in the git jail fails (here a
// base whose tree holds a ".git" entry, which git refuses to check out), realize fails and leaves
// no root, no record, no private store and no worktree registration behind, although the store
// and the record were being written beside git.
func TestGitWorktreeCheckoutFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	repo := newRepo(t, map[string]string{"README.md": "hi\n"})
	withStdin := func(in string, args ...string) string {
		out, err := m.git.run(ctx, gitCall{dir: repo, stdin: strings.NewReader(in)}, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	blob := withStdin("x\n", "hash-object", "-w", "--stdin")
	tree := withStdin("100644 blob "+blob+"\t.git\n", "mktree")
	gitT(t, repo, "update-ref", "refs/heads/evil", gitT(t, repo, "commit-tree", tree, "-p", "HEAD", "-m", "evil"))

	if _, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: repo, DefaultRef: "evil", TaskKey: "PRJ-1"}); !errors.Is(err, ErrGit) {
		t.Fatalf("realize = %v, want ErrGit", err)
	}
	for _, dir := range []string{m.Base(), m.runGit} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), refPrefix) {
				t.Errorf("%s left in %s", e.Name(), dir)
			}
		}
	}
	if out := gitT(t, repo, "worktree", "list", "--porcelain"); strings.Count(out, "worktree ") != 1 {
		t.Errorf("worktrees left registered:\n%s", out)
	}
}
