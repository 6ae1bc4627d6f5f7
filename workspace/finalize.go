package workspace

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// CommitSpec names the task branch and the run a finalize commit belongs to.
type CommitSpec struct {
	// Branch is the task branch the worktree must be on.
	Branch string
	// TaskKey and RunID are written into the commit message (and as trailers).
	TaskKey string
	// RunID identifies the run whose work is committed.
	RunID string
	// Author overrides the Manager's identity for this commit when set.
	Author Identity
}

// CommitResult reports a finalize commit; Changed is false (and Commit empty) when there was
// nothing to commit.
type CommitResult struct {
	Commit  string // the new commit id
	Changed bool   // false when the worktree had nothing to commit
}

// Commit finalizes a git worktree: it stages everything with `git add -A` (so .gitignore applies)
// and commits on the task branch with a message naming the task key and run id. Hooks never run and
// nothing is pushed. It fails with ErrWrongBranch if the worktree is not on spec.Branch.
func (m *Manager) Commit(ctx context.Context, root string, spec CommitSpec) (CommitResult, error) {
	res, err := m.commit(ctx, root, spec)
	if err != nil {
		return CommitResult{}, fmt.Errorf("finalize commit: %w", err)
	}
	return res, nil
}

func (m *Manager) commit(ctx context.Context, root string, spec CommitSpec) (CommitResult, error) {
	g := gitCall{dir: root, author: spec.Author}
	head, err := m.git.run(ctx, g, "symbolic-ref", "-q", "HEAD")
	if err != nil || head != "refs/heads/"+spec.Branch {
		return CommitResult{}, fmt.Errorf("worktree is on %q, want %q: %w", strings.TrimPrefix(head, "refs/heads/"), spec.Branch, ErrWrongBranch)
	}
	if _, err := m.git.run(ctx, g, "add", "-A"); err != nil {
		return CommitResult{}, err
	}
	same, err := m.git.test(ctx, g, "diff", "--cached", "--quiet")
	if err != nil {
		return CommitResult{}, err
	}
	if same {
		return CommitResult{}, nil
	}
	msg := fmt.Sprintf("%s: work from run %s\n\nBerth-Task: %s\nBerth-Run: %s\n", spec.TaskKey, spec.RunID, spec.TaskKey, spec.RunID)
	if _, err := m.git.run(ctx, gitCall{dir: root, author: spec.Author, stdin: []byte(msg)}, "commit", "--quiet", "--no-verify", "-F", "-"); err != nil {
		return CommitResult{}, err
	}
	sha, err := m.git.run(ctx, g, "rev-parse", "--verify", "HEAD")
	if err != nil {
		return CommitResult{}, err
	}
	return CommitResult{Commit: sha, Changed: true}, nil
}

// GitState is what close-readiness needs to know about a worktree.
type GitState struct {
	// Readable is false when git could not read the worktree (not a repository, corrupt, base ref
	// missing); the counts are then meaningless and Reason says why.
	Readable  bool
	Reason    string // why the state is unreadable
	Branch    string // current branch, empty when detached
	Head      string // commit id of HEAD
	Dirty     int    // tracked paths with staged or unstaged changes
	Untracked int    // untracked, not ignored files
	Ahead     int    // commits on HEAD not in the base ref
	Behind    int    // commits in the base ref not on HEAD
	Merged    bool   // every commit of HEAD is reachable from the base ref
}

// GitState reads the state of the worktree at root relative to baseRef: dirty and untracked counts,
// ahead/behind counts and whether HEAD is merged into baseRef (every commit of HEAD is reachable from
// it). Git failures make the state unreadable rather than an error; only context errors are returned.
func (m *Manager) GitState(ctx context.Context, root, baseRef string) (GitState, error) {
	var st GitState
	fail := func(err error) (GitState, error) {
		if ctx.Err() != nil {
			return GitState{}, fmt.Errorf("git state: %w", ctx.Err())
		}
		return GitState{Reason: err.Error()}, nil
	}
	g := gitCall{dir: root}
	if err := m.checkRefName(ctx, baseRef); err != nil && baseRef != "HEAD" {
		return fail(err)
	}
	head, err := m.git.run(ctx, g, "rev-parse", "--verify", "HEAD")
	if err != nil {
		return fail(err)
	}
	st.Head = head
	if b, err := m.git.run(ctx, g, "symbolic-ref", "-q", "--short", "HEAD"); err == nil {
		st.Branch = b
	}
	status, err := m.git.run(ctx, gitCall{dir: root, env: []string{"GIT_OPTIONAL_LOCKS=0"}}, "status", "--porcelain=v1", "-z", "--untracked-files=all")
	if err != nil {
		return fail(err)
	}
	recs := strings.Split(status, "\x00")
	for i := 0; i < len(recs); i++ {
		rec := recs[i]
		if len(rec) < 4 {
			continue
		}
		if rec[:2] == "??" {
			st.Untracked++
			continue
		}
		st.Dirty++
		if rec[0] == 'R' || rec[0] == 'C' {
			i++ // the next record is the rename or copy source
		}
	}
	counts, err := m.git.run(ctx, g, "rev-list", "--left-right", "--count", "--end-of-options", baseRef+"...HEAD")
	if err != nil {
		return fail(err)
	}
	f := strings.Fields(counts)
	if len(f) != 2 {
		return fail(fmt.Errorf("unexpected rev-list output %q", counts))
	}
	st.Behind, _ = strconv.Atoi(f[0])
	st.Ahead, _ = strconv.Atoi(f[1])
	merged, err := m.git.test(ctx, g, "merge-base", "--is-ancestor", "HEAD", baseRef)
	if err != nil {
		return fail(err)
	}
	st.Merged = merged
	st.Readable = true
	return st, nil
}

// RescueRef names a rescue commit made before a destructive close.
type RescueRef struct {
	Name   string // refs/berth/rescue/<ref>-<unix seconds>
	Commit string // the snapshot commit (its parent is HEAD)
}

// Rescue snapshots everything in the worktree at root that `git add -A` would stage (tracked changes
// and untracked, non-ignored files) into a commit whose parent is HEAD, and points
// refs/berth/rescue/<ref>-<unix> at it. The worktree, its index and its branch are left untouched (a
// private index file is used), so it is safe to run before a destructive close.
func (m *Manager) Rescue(ctx context.Context, root, ref string, now time.Time) (RescueRef, error) {
	if !ValidRef(ref) {
		return RescueRef{}, fmt.Errorf("rescue: %w", ErrBadRef)
	}
	r, err := m.rescue(ctx, root, ref, now)
	if err != nil {
		return RescueRef{}, fmt.Errorf("rescue %s: %w", ref, err)
	}
	return r, nil
}

func (m *Manager) rescue(ctx context.Context, root, ref string, now time.Time) (RescueRef, error) {
	tmp, err := os.MkdirTemp(m.git.home, "rescue-index-")
	if err != nil {
		return RescueRef{}, err
	}
	defer os.RemoveAll(tmp)
	g := gitCall{dir: root, env: []string{"GIT_INDEX_FILE=" + filepath.Join(tmp, "index")}}
	head, err := m.git.run(ctx, g, "rev-parse", "--verify", "HEAD")
	if err != nil {
		return RescueRef{}, err
	}
	if _, err := m.git.run(ctx, g, "read-tree", head); err != nil {
		return RescueRef{}, err
	}
	if _, err := m.git.run(ctx, g, "add", "-A"); err != nil {
		return RescueRef{}, err
	}
	tree, err := m.git.run(ctx, g, "write-tree")
	if err != nil {
		return RescueRef{}, err
	}
	msg := fmt.Sprintf("berth rescue of %s before destructive close\n", ref)
	commit, err := m.git.run(ctx, gitCall{dir: root, stdin: []byte(msg)}, "commit-tree", tree, "-p", head)
	if err != nil {
		return RescueRef{}, err
	}
	name := fmt.Sprintf("refs/berth/rescue/%s-%d", ref, now.Unix())
	// The empty old value makes update-ref refuse to overwrite an existing rescue ref.
	if _, err := m.git.run(ctx, gitCall{dir: root}, "update-ref", "-m", "berth rescue", name, commit, ""); err != nil {
		return RescueRef{}, err
	}
	return RescueRef{Name: name, Commit: commit}, nil
}

// CopyFinal is the finalize result of a copy workspace: a capsule of the result (already written to
// the caller's writer) and what changed against the base manifest.
type CopyFinal struct {
	Capsule Capsule // manifest and digest of the stream written to w
	Changes Changes // against the base manifest
}

// FinalizeCopy packs the copy workspace ref into w (see Pack) and lists the paths added, modified and
// removed relative to the manifest recorded when it was realized.
func (m *Manager) FinalizeCopy(ctx context.Context, ref string, w io.Writer) (CopyFinal, error) {
	base, err := m.BaseManifest(ref)
	if err != nil {
		return CopyFinal{}, fmt.Errorf("finalize copy: %w", err)
	}
	c, err := Pack(ctx, filepath.Join(m.base, ref), w)
	if err != nil {
		return CopyFinal{}, fmt.Errorf("finalize copy: %w", err)
	}
	return CopyFinal{Capsule: c, Changes: Diff(base, c.Manifest)}, nil
}
