package workspace

import (
	"bytes"
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
// nothing to commit. Tip is the task branch after the finalize (its commit or the run's own).
type CommitResult struct {
	Commit  string // the new commit id
	Changed bool   // false when the worktree had nothing to commit
	Tip     string // the task branch's commit once the work is home
}

// Commit finalizes the git worktree workspace ref: in Berth's git jail, as the run user, it
// stages everything with `git add -A` (so .gitignore applies, and whatever .gitattributes names
// runs there, never on the host) and commits on the task branch with a message naming the task
// key and run id; then the branch's new commits (the run's own and this one) come home as a
// verified pack (see BringHome). Hooks never run and nothing is pushed. A worktree whose HEAD the
// run moved elsewhere is put back on the task branch first: finalize commits there.
func (m *Manager) Commit(ctx context.Context, ref string, spec CommitSpec) (CommitResult, error) {
	res, err := m.commit(ctx, ref, spec)
	if err != nil {
		return CommitResult{}, fmt.Errorf("finalize commit: %w", err)
	}
	return res, nil
}

func (m *Manager) commit(ctx context.Context, ref string, spec CommitSpec) (CommitResult, error) {
	rec, err := m.owned(ref)
	if err != nil {
		return CommitResult{}, err
	}
	if rec.Strategy != StrategyGitWorktree || rec.Branch == "" {
		return CommitResult{}, fmt.Errorf("%s is not a git worktree: %w", ref, ErrNotManaged)
	}
	if spec.Branch != "" && spec.Branch != rec.Branch {
		return CommitResult{}, fmt.Errorf("worktree is on %q, want %q: %w", rec.Branch, spec.Branch, ErrWrongBranch)
	}
	if rec, err = m.ensureStore(ctx, rec); err != nil {
		return CommitResult{}, err
	}
	s := m.store(rec)
	base, err := s.base()
	if err != nil {
		return CommitResult{}, err
	}
	msg := fmt.Sprintf("%s: work from run %s\n\nBerth-Task: %s\nBerth-Run: %s\n", spec.TaskKey, spec.RunID, spec.TaskKey, spec.RunID)
	out, err := m.runJailedGit(ctx, m.storeJail(rec, s, false, &spec.Author, `set -e
git rev-parse --verify -q "$BERTH_BRANCH_REF" >/dev/null || git update-ref "$BERTH_BRANCH_REF" "$BERTH_BASE"
git symbolic-ref HEAD "$BERTH_BRANCH_REF"
git add -A
if git diff --cached --quiet; then echo "changed 0"; else printf '%s' "$BERTH_MESSAGE" | git commit -q --no-verify -F -; echo "changed 1"; fi
tip=$(git rev-parse --verify "$BERTH_BRANCH_REF^{commit}")
echo "tip $tip"
if [ "$tip" != "$BERTH_BASE" ]; then
  printf '%s\n^%s\n' "$tip" "$BERTH_BASE" | git pack-objects --revs --thin --stdout -q > "$BERTH_OUT/home.pack"
fi`, map[string]string{"BERTH_BASE": base, "BERTH_MESSAGE": msg}))
	if err != nil {
		return CommitResult{}, err
	}
	tip := scriptValue(out, "tip")
	if !isHexID(tip) {
		return CommitResult{}, fmt.Errorf("the commit left no readable task branch: %w", ErrGit)
	}
	if tip != base {
		if err := m.importPack(ctx, rec, s, "home.pack", tip, base); err != nil {
			return CommitResult{}, err
		}
		if err := m.moveHome(ctx, rec, s, tip, base, "berth: finalize"); err != nil {
			return CommitResult{}, err
		}
		if err := os.WriteFile(filepath.Join(s.dir, "base"), []byte(tip+"\n"), 0o600); err != nil {
			return CommitResult{}, err
		}
	}
	res := CommitResult{Tip: tip}
	if scriptValue(out, "changed") == "1" {
		res.Commit, res.Changed = tip, true
	}
	return res, nil
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
	// GitDir is the repository holding a worktree's branch (its source's common git dir, from
	// Berth's records) and AdminName the name of its registration there (worktrees/<name>);
	// both empty for a shared workspace.
	GitDir, AdminName string
}

// gitStateScript prints what GitState reads, in Berth's git jail (the work tree read-only): git
// status interprets the run's files. A private index the run broke is replaced by one read from
// HEAD, so a broken index makes the state slower to read, not unreadable.
const gitStateScript = `t=$(mktemp -d) || exit 1
trap 'rm -rf "$t"' EXIT
export GIT_OPTIONAL_LOCKS=0
head=$(git rev-parse --verify -q "HEAD^{commit}") || { echo "unreadable HEAD does not name a commit"; exit 0; }
echo "head $head"
echo "branch $(git symbolic-ref -q --short HEAD)"
counts=$(git rev-list --left-right --count --end-of-options "$BERTH_BASE_REF...HEAD") || { echo "unreadable the base ref $BERTH_BASE_REF cannot be compared"; exit 0; }
echo "counts $counts"
git merge-base --is-ancestor HEAD "$BERTH_BASE_REF"
echo "merged $?"
if ! git status --porcelain=v1 -z --untracked-files=all >"$t/status" 2>"$t/err"; then
  GIT_INDEX_FILE="$t/index" git read-tree HEAD &&
  GIT_INDEX_FILE="$t/index" git status --porcelain=v1 -z --untracked-files=all >"$t/status" ||
  { echo "unreadable git status failed: $(tail -n 1 "$t/err")"; exit 0; }
fi
echo "status"
cat "$t/status"`

// GitState reads the state of the worktree of workspace ref relative to baseRef: dirty and
// untracked counts, ahead/behind counts and whether HEAD is merged into baseRef (every commit of
// HEAD is reachable from it). It runs in Berth's git jail with the work tree read-only, for a
// worktree and for a shared workspace alike (a shared workspace's own .git is what git finds
// there). Git failures make the state unreadable rather than an error; only context errors are
// returned.
func (m *Manager) GitState(ctx context.Context, ref, baseRef string) (GitState, error) {
	fail := func(reason string) (GitState, error) {
		if ctx.Err() != nil {
			return GitState{}, fmt.Errorf("git state: %w", ctx.Err())
		}
		return GitState{Reason: reason}, nil
	}
	if err := m.checkRefName(ctx, baseRef); err != nil && baseRef != "HEAD" {
		return fail(err.Error())
	}
	j, err := m.stateJail(ctx, ref)
	if err != nil {
		return fail(err.Error())
	}
	j.env["BERTH_BASE_REF"] = baseRef
	j.script = gitStateScript
	out, err := m.runJailedGit(ctx, j)
	if err != nil {
		return fail(err.Error())
	}
	st, err := parseGitState(out)
	if rec, rerr := m.owned(ref); rerr == nil && rec.Strategy == StrategyGitWorktree {
		st.GitDir, st.AdminName = rec.GitDir, filepath.Base(rec.AdminDir)
	}
	return st, err
}

// stateJail is a read-only jail over workspace ref in which git sees it as a run does.
func (m *Manager) stateJail(ctx context.Context, ref string) (jailedGit, error) {
	rec, err := m.owned(ref)
	if err != nil {
		return jailedGit{}, err
	}
	switch rec.Strategy {
	case StrategyGitWorktree:
		if rec, err = m.ensureStore(ctx, rec); err != nil {
			return jailedGit{}, err
		}
		return m.storeJail(rec, m.store(rec), true, nil, "", nil), nil
	case StrategyShared:
		env := gitJailEnv(m.git.author)
		env["GIT_CEILING_DIRECTORIES"] = filepath.Dir(rec.SharedRoot)
		return jailedGit{workspace: rec.SharedRoot, readOnly: true, env: env}, nil
	}
	return jailedGit{}, fmt.Errorf("%s is not a git workspace: %w", ref, ErrNotManaged)
}

// parseGitState reads gitStateScript's output.
func parseGitState(out []byte) (GitState, error) {
	head, status, _ := bytes.Cut(out, []byte("\nstatus\n"))
	if r := scriptValue(head, "unreadable"); r != "" {
		return GitState{Reason: r}, nil
	}
	st := GitState{Head: scriptValue(head, "head"), Branch: scriptValue(head, "branch")}
	f := strings.Fields(scriptValue(head, "counts"))
	if !isHexID(st.Head) || len(f) != 2 || !bytes.Contains(out, []byte("\nstatus\n")) {
		return GitState{Reason: "git's answer could not be read"}, nil
	}
	st.Behind, _ = strconv.Atoi(f[0])
	st.Ahead, _ = strconv.Atoi(f[1])
	switch scriptValue(head, "merged") {
	case "0":
		st.Merged = true
	case "1":
	default:
		return GitState{Reason: "git could not tell whether HEAD is merged"}, nil
	}
	recs := strings.Split(string(status), "\x00")
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
	st.Readable = true
	return st, nil
}

// RescueRef names a rescue commit made before a destructive close.
type RescueRef struct {
	Name   string // refs/berth/rescue/<ref>-<unix seconds>
	Commit string // the snapshot commit (its parent is HEAD)
}

// Rescue snapshots everything in the worktree of workspace ref that `git add -A` would stage
// (tracked changes and untracked, non-ignored files) into a commit whose parent is HEAD, and
// points refs/berth/rescue/<ref>-<unix> at it. The snapshot is made in Berth's git jail with a
// private index and the work tree read-only (the worktree, its index and its branch are left
// untouched), and comes home as a verified pack; the rescue ref is only ever created, never
// moved. It is safe to run before a destructive close.
func (m *Manager) Rescue(ctx context.Context, ref string, now time.Time) (RescueRef, error) {
	if !ValidRef(ref) {
		return RescueRef{}, fmt.Errorf("rescue: %w", ErrBadRef)
	}
	r, err := m.rescue(ctx, ref, now)
	if err != nil {
		return RescueRef{}, fmt.Errorf("rescue %s: %w", ref, err)
	}
	return r, nil
}

func (m *Manager) rescue(ctx context.Context, ref string, now time.Time) (RescueRef, error) {
	rec, err := m.owned(ref)
	if err != nil {
		return RescueRef{}, err
	}
	if rec.Strategy != StrategyGitWorktree {
		return RescueRef{}, fmt.Errorf("not a git worktree: %w", ErrNotManaged)
	}
	if rec, err = m.ensureStore(ctx, rec); err != nil {
		return RescueRef{}, err
	}
	s := m.store(rec)
	base, err := s.base()
	if err != nil {
		return RescueRef{}, err
	}
	out, err := m.runJailedGit(ctx, m.storeJail(rec, s, true, nil, `set -e
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
export GIT_INDEX_FILE="$t/index"
head=$(git rev-parse --verify "HEAD^{commit}")
git read-tree "$head"
git add -A
tree=$(git write-tree)
commit=$(printf '%s\n' "$BERTH_MESSAGE" | git commit-tree "$tree" -p "$head")
echo "rescue $commit"
printf '%s\n^%s\n' "$commit" "$BERTH_BASE" | git pack-objects --revs --thin --stdout -q > "$BERTH_OUT/rescue.pack"`,
		map[string]string{"BERTH_BASE": base, "BERTH_MESSAGE": "berth rescue of " + ref + " before destructive close"}))
	if err != nil {
		return RescueRef{}, err
	}
	commit := scriptValue(out, "rescue")
	if !isHexID(commit) {
		return RescueRef{}, fmt.Errorf("the snapshot made no commit: %w", ErrGit)
	}
	if err := m.importPack(ctx, rec, s, "rescue.pack", commit, base); err != nil {
		return RescueRef{}, err
	}
	name := fmt.Sprintf("refs/berth/rescue/%s-%d", ref, now.Unix())
	// The empty old value makes update-ref refuse to overwrite an existing rescue ref.
	if _, err := m.git.run(ctx, gitCall{}, "--git-dir="+rec.GitDir, "update-ref", "-m", "berth rescue", name, commit, ""); err != nil {
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
