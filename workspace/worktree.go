package workspace

import (
	"bufio"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// DefaultBranchTemplate names task branches when a project sets no template.
const DefaultBranchTemplate = "berth/{task_key}"

// GitWorktreeSpec says where a git worktree comes from and which task it serves.
type GitWorktreeSpec struct {
	// Source is an absolute path to a local repository, or a git URL (https, ssh, git, file).
	Source string
	// DefaultRef is the branch, tag or full commit id to start from; empty means the source's
	// default branch.
	DefaultRef string
	// TaskKey fills {task_key} in the branch template (for example "PRJ-12").
	TaskKey string
	// BranchTemplate is the task branch pattern; empty means DefaultBranchTemplate.
	BranchTemplate string
}

// RenderBranch renders a branch template with the task key and validates the result with
// `git check-ref-format --branch`; {task_key} is the only placeholder.
func (m *Manager) RenderBranch(ctx context.Context, template, taskKey string) (string, error) {
	if template == "" {
		template = DefaultBranchTemplate
	}
	if strings.TrimSpace(taskKey) == "" {
		return "", fmt.Errorf("render branch: empty task key: %w", ErrBadBranch)
	}
	b := strings.ReplaceAll(template, "{task_key}", taskKey)
	if strings.ContainsAny(b, "{}") || strings.HasPrefix(b, "-") || strings.Contains(b, "@{") || b == "HEAD" || b == "@" {
		return "", fmt.Errorf("render branch %q: %w", b, ErrBadBranch)
	}
	if plainRefName(b) {
		return b, nil // what git accepts anyway: no git process on the way to every run
	}
	out, _, err := m.git.exec(ctx, gitCall{}, "check-ref-format", "--branch", b)
	if err != nil {
		return "", fmt.Errorf("render branch: %w", err)
	}
	if strings.TrimSpace(string(out.stdout)) != b {
		return "", fmt.Errorf("render branch %q: %w", b, ErrBadBranch)
	}
	return b, nil
}

// RealizeGitWorktree prepares a task worktree under the managed base with
// `git worktree add -b <branch> <root> <base commit>`. For a local source the branch is created in
// that repository; for a URL, in Berth's bare cache (cloned once, fetched on each preparation).
// Nothing is ever pushed. When the task branch already exists:
//   - checked out in a clean managed worktree with no commits beyond the base: that worktree is
//     reused (Result.Reused), fast-forwarded if the base moved on;
//   - not checked out anywhere and descending from the base (or an ancestor of it, i.e. unstarted):
//     a new worktree checks it out (an unstarted branch is first fast-forwarded to the base);
//   - checked out elsewhere, or started work in a dirty or foreign worktree: ErrBranchInUse;
//   - history that neither descends from the base nor is an ancestor of it: ErrBranchConflict.
func (m *Manager) RealizeGitWorktree(ctx context.Context, spec GitWorktreeSpec) (Result, error) {
	res, err := m.realizeGitWorktree(ctx, spec)
	if err != nil {
		return Result{}, fmt.Errorf("realize git_worktree: %w", err)
	}
	return res, nil
}

func (m *Manager) realizeGitWorktree(ctx context.Context, spec GitWorktreeSpec) (Result, error) {
	branch, err := m.RenderBranch(ctx, spec.BranchTemplate, spec.TaskKey)
	if err != nil {
		return Result{}, err
	}
	src, unlock, err := m.resolveSource(ctx, spec.Source)
	if err != nil {
		return Result{}, err
	}
	defer unlock()
	gd := "--git-dir=" + src.gitDir
	// The base, its tree and the task branch in one git process: this is on the way to every run.
	baseRef, baseCommit, task, err := m.resolveStart(ctx, src, spec.DefaultRef, "refs/heads/"+branch)
	if err != nil {
		return Result{}, err
	}
	base := baseCommit.id
	res := Result{Strategy: StrategyGitWorktree, Branch: branch, BaseRef: baseRef, BaseCommit: base, TreeDigest: "git:" + baseCommit.tree}
	if !task.ok {
		// A new branch at a fresh root: no stale worktree entry can stand in its way, so no prune.
		// `worktree add -b` creates the branch at base or fails, so its tip is base.
		return m.addWorktree(ctx, src, res, base, "--no-track", "-b", branch, "{root}", base)
	}
	if _, err := m.git.run(ctx, gitCall{}, gd, "worktree", "prune"); err != nil {
		return Result{}, err
	}
	tip := task.id

	descends, err := m.git.test(ctx, gitCall{}, gd, "merge-base", "--is-ancestor", base, tip)
	if err != nil {
		return Result{}, err
	}
	unstarted, err := m.git.test(ctx, gitCall{}, gd, "merge-base", "--is-ancestor", tip, base)
	if err != nil {
		return Result{}, err
	}
	if !descends && !unstarted {
		return Result{}, fmt.Errorf("branch %s at %.12s does not descend from base %.12s: %w", branch, tip, base, ErrBranchConflict)
	}
	wt, err := m.worktreeOf(ctx, src.gitDir, branch)
	if err != nil {
		return Result{}, err
	}
	if wt == "" {
		if unstarted && tip != base {
			// No own commits: move the branch to the new base (refusing if it moved meanwhile).
			if _, err := m.git.run(ctx, gitCall{}, gd, "update-ref", "refs/heads/"+branch, base, tip); err != nil {
				return Result{}, err
			}
		}
		return m.addWorktree(ctx, src, res, "", "{root}", branch)
	}
	ref, ok := m.managedWorktree(wt, src.gitDir)
	if !ok || !unstarted {
		return Result{}, fmt.Errorf("branch %s is checked out in another worktree: %w", branch, ErrBranchInUse)
	}
	// The managed worktree's files are what a run left there: git reads them in the jail only.
	st, err := m.GitState(ctx, ref, base)
	if err != nil {
		return Result{}, err
	}
	if !st.Readable || st.Dirty != 0 || st.Untracked != 0 {
		return Result{}, fmt.Errorf("branch %s is checked out in a dirty worktree: %w", branch, ErrBranchInUse)
	}
	if tip != base {
		if err := m.fastForward(ctx, ref, tip, base); err != nil {
			return Result{}, err
		}
	}
	res.Ref, res.Cwd, res.Reused = ref, ref, true
	return res, nil
}

// fastForward moves a clean managed worktree's branch from tip to base: its files and private
// index in Berth's git jail (a two-tree read-tree, which applies .gitattributes there), then the
// source's branch by compare-and-swap (bringHome).
func (m *Manager) fastForward(ctx context.Context, ref, tip, base string) error {
	rec, err := m.owned(ref)
	if err != nil {
		return err
	}
	if rec, err = m.ensureStore(ctx, rec); err != nil {
		return err
	}
	s := m.store(rec)
	if _, err := m.runJailedGit(ctx, m.storeJail(rec, s, false, nil, `set -e
git update-ref "$BERTH_BRANCH_REF" "$BERTH_NEW" "$BERTH_OLD"
git read-tree -m -u "$BERTH_OLD" "$BERTH_NEW"`, map[string]string{"BERTH_OLD": tip, "BERTH_NEW": base})); err != nil {
		return err
	}
	return m.bringHome(ctx, rec)
}

// addWorktree creates a managed root and runs `git worktree add --no-checkout` with args, where
// "{root}" stands for the new root; the files are then checked out in Berth's git jail, as the run
// user (checkout applies .gitattributes, and the branch may hold a run's commits). tip is the task
// branch's commit once git has added the worktree when args say so (a branch git creates at a
// commit), else "" (git resolves it after). On failure the root is removed again.
//
// Each step is a process or a few file writes on the way to every run, so what does not depend
// on git's output overlaps it: with the tip known, the private store's skeleton is made while git
// adds the worktree, and the record naming the admin dir is written (and fsynced) while the
// checkout runs. Both are done before addWorktree returns, or removes anything.
func (m *Manager) addWorktree(ctx context.Context, src gitSource, res Result, tip string, args ...string) (Result, error) {
	rec, root, err := m.createRoot(record{Strategy: StrategyGitWorktree, GitDir: src.gitDir, Branch: res.Branch})
	if err != nil {
		return Result{}, err
	}
	full := []string{"--git-dir=" + src.gitDir, "worktree", "add", "--quiet", "--no-checkout"}
	for _, a := range args {
		if a == "{root}" {
			a = root
		}
		full = append(full, a)
	}
	var (
		writes             sync.WaitGroup // the store's skeleton and the record, under way
		skelErr, recordErr error
		skeleton           = make(chan struct{}) // closed once the skeleton is made (or failed)
	)
	fail := func(err error) (Result, error) {
		writes.Wait() // nothing is removed while it is being written
		// The caller holds the source lock.
		_ = m.removeRootLocking(context.WithoutCancel(ctx), rec, false)
		return Result{}, err
	}
	if tip != "" {
		writes.Add(1)
		go func(rec record, tip string) { // copies: rec gains its admin dir meanwhile
			defer writes.Done()
			defer close(skeleton)
			skelErr = m.storeSkeleton(rec, tip)
		}(rec, tip)
	}
	if _, err := m.git.run(ctx, gitCall{}, full...); err != nil {
		return fail(err)
	}
	// git wrote the .git file and the admin dir just now: the admin dir is recorded before any run
	// can touch the tree, and from then on only the record names it.
	if rec.AdminDir, err = m.findAdminDir(src.gitDir, root); err != nil {
		return fail(err)
	}
	writes.Add(1)
	go func(rec record) {
		defer writes.Done()
		recordErr = m.writeRecord(rec)
	}(rec)
	if tip == "" {
		t, ok, err := m.revParse(ctx, src.gitDir, "refs/heads/"+res.Branch)
		if err != nil || !ok {
			close(skeleton)
			return fail(fmt.Errorf("task branch %s after worktree add: %v: %w", res.Branch, err, ErrGit))
		}
		tip = t
		skelErr = m.storeSkeleton(rec, tip)
		close(skeleton)
	}
	<-skeleton
	if skelErr != nil {
		return fail(skelErr)
	}
	if err := m.storeAdmin(rec, true); err != nil {
		return fail(err)
	}
	if _, err := m.runJailedGit(ctx, m.storeJail(rec, m.store(rec), false, nil, `exec git reset -q --hard`, nil)); err != nil {
		return fail(err)
	}
	writes.Wait()
	if recordErr != nil {
		return fail(recordErr)
	}
	res.Ref, res.Cwd = rec.Ref, rec.Ref
	return res, nil
}

// managedWorktree maps a worktree path to the ref of a root this Manager owns for the same repository.
func (m *Manager) managedWorktree(wt, gitDir string) (string, bool) {
	if filepath.Dir(wt) != m.base {
		return "", false
	}
	ref := filepath.Base(wt)
	rec, err := m.owned(ref)
	if err != nil || rec.Strategy != StrategyGitWorktree || rec.GitDir != gitDir {
		return "", false
	}
	return ref, true
}

// worktreeOf returns the path of the worktree that has branch checked out, or "".
func (m *Manager) worktreeOf(ctx context.Context, gitDir, branch string) (string, error) {
	out, err := m.git.run(ctx, gitCall{}, "--git-dir="+gitDir, "worktree", "list", "--porcelain")
	if err != nil {
		return "", err
	}
	var cur string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "worktree "); ok {
			cur = p
		} else if b, ok := strings.CutPrefix(line, "branch "); ok && b == "refs/heads/"+branch {
			return cur, nil
		}
	}
	return "", nil
}

// revParse resolves rev to a commit id; ok is false when it does not exist.
func (m *Manager) revParse(ctx context.Context, gitDir, rev string) (string, bool, error) {
	out, code, err := m.git.exec(ctx, gitCall{}, "--git-dir="+gitDir, "rev-parse", "--verify", "--quiet", "--end-of-options", rev+"^{commit}")
	if err != nil {
		return "", false, err
	}
	if code != 0 {
		return "", false, nil
	}
	return strings.TrimSpace(string(out.stdout)), true, nil
}

// resolveBase turns the requested default ref into a fully qualified ref that resolves in the
// repository holding the worktree, and its commit.
func (m *Manager) resolveBase(ctx context.Context, src gitSource, want string) (string, string, error) {
	ref, base, _, err := m.resolveStart(ctx, src, want, "")
	return ref, base.id, err
}

// resolveStart is resolveBase with the base commit's tree and, when other is not "", what other
// names (peeled to a commit), all from one `git cat-file --batch`.
func (m *Manager) resolveStart(ctx context.Context, src gitSource, want, other string) (string, commitObject, commitObject, error) {
	candidates, err := m.baseCandidates(ctx, src, want)
	if err != nil {
		return "", commitObject{}, commitObject{}, err
	}
	revs := candidates
	if other != "" {
		revs = append(slices.Clone(candidates), other)
	}
	found, err := m.lookupCommits(ctx, src.gitDir, revs...)
	if err != nil {
		return "", commitObject{}, commitObject{}, err
	}
	var o commitObject
	if other != "" {
		o = found[len(found)-1]
	}
	for i, c := range candidates {
		if found[i].ok {
			return c, found[i], o, nil
		}
	}
	return "", commitObject{}, commitObject{}, fmt.Errorf("default ref %q not found: %w", want, ErrNotFound)
}

// baseCandidates are the refs the requested default ref may name, most specific first.
func (m *Manager) baseCandidates(ctx context.Context, src gitSource, want string) ([]string, error) {
	gd := "--git-dir=" + src.gitDir
	var candidates []string
	switch {
	case want == "" && src.remote:
		head, err := m.git.run(ctx, gitCall{}, gd, "symbolic-ref", "refs/remotes/origin/HEAD")
		if err != nil {
			return nil, err
		}
		candidates = []string{head}
	case want == "":
		head, err := m.git.run(ctx, gitCall{}, gd, "symbolic-ref", "-q", "HEAD")
		if err != nil {
			head = "HEAD" // detached HEAD: start from its commit
		}
		candidates = []string{head}
	default:
		if err := m.checkRefName(ctx, want); err != nil {
			return nil, err
		}
		if src.remote {
			candidates = []string{"refs/remotes/origin/" + want, "refs/tags/" + want}
		} else {
			candidates = []string{"refs/heads/" + want, "refs/tags/" + want, "refs/remotes/" + want}
		}
		if strings.HasPrefix(want, "refs/") {
			candidates = append([]string{want}, candidates...)
		}
		if isFullCommitID(want) {
			candidates = append(candidates, want)
		}
	}
	return candidates, nil
}

// checkRefName accepts full commit ids and names that git's ref-format rules allow.
func (m *Manager) checkRefName(ctx context.Context, name string) error {
	if isFullCommitID(name) {
		return nil
	}
	if strings.HasPrefix(name, "-") || strings.Contains(name, "@{") {
		return fmt.Errorf("ref %q: %w", name, ErrBadBranch)
	}
	if plainRefName(name) {
		return nil
	}
	ok, err := m.git.test(ctx, gitCall{}, "check-ref-format", "--allow-onelevel", name)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("ref %q: %w", name, ErrBadBranch)
	}
	return nil
}

func isFullCommitID(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	return strings.Trim(s, "0123456789abcdef") == ""
}
