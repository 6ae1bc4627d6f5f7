package workspace

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Git operations behind attempts and receipts (DESIGN §13): the one base commit a group forks
// from, the refs a selection moves, and where a receipt's branch can still be found. None of them
// merges anything or writes the base.

// ResolveBase returns the fully qualified base ref and commit a worktree of source would start
// from for defaultRef (as RealizeGitWorktree resolves it; a URL source's cache is fetched first).
func (m *Manager) ResolveBase(ctx context.Context, source, defaultRef string) (ref, commit string, err error) {
	src, unlock, err := m.resolveSource(ctx, source)
	if err != nil {
		return "", "", fmt.Errorf("resolve base: %w", err)
	}
	defer unlock()
	ref, commit, err = m.resolveBase(ctx, src, defaultRef)
	if err != nil {
		return "", "", fmt.Errorf("resolve base: %w", err)
	}
	return ref, commit, nil
}

// SourceGitDir is the repository that holds a source's task branches: a local repository's common
// git dir, or Berth's bare cache of a URL (never fetched here). ErrNotFound when there is none.
func (m *Manager) SourceGitDir(ctx context.Context, source string) (string, error) {
	if !isRemoteSource(source) {
		out, err := m.git.run(ctx, gitCall{dir: source}, "rev-parse", "--path-format=absolute", "--git-common-dir")
		if err != nil {
			return "", fmt.Errorf("source git dir: %v: %w", err, ErrNotFound)
		}
		return filepath.Clean(out), nil
	}
	norm, err := NormalizeGitURL(source)
	if err != nil {
		return "", fmt.Errorf("source git dir: %w", err)
	}
	sum := sha256.Sum256([]byte(norm))
	dir := filepath.Join(m.cache, hex.EncodeToString(sum[:]))
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("source git dir: no cache: %w", ErrNotFound)
	}
	return dir, nil
}

// ResolveRef returns the commit a ref names in gitDir; ok is false when it does not exist.
func (m *Manager) ResolveRef(ctx context.Context, gitDir, ref string) (commit string, ok bool, err error) {
	if strings.HasPrefix(ref, "-") {
		return "", false, ErrBadBranch
	}
	return m.revParse(ctx, gitDir, ref)
}

// IsAncestor reports whether commit a is an ancestor of (or equal to) commit b in gitDir.
func (m *Manager) IsAncestor(ctx context.Context, gitDir, a, b string) (bool, error) {
	return m.git.test(ctx, gitCall{}, "--git-dir="+gitDir, "merge-base", "--is-ancestor", "--end-of-options", a, b)
}

// Discard is one attempt a selection puts aside: its worktree (by ref, when still on this node),
// its branch, and the rescue ref its head moves to.
type Discard struct {
	Ref       string // the workspace's opaque ref
	Branch    string // e.g. berth/PRJ-1-a1
	RescueRef string // e.g. refs/berth/discarded/PRJ-1-a1
}

// Selection is what SelectAttempt does in one repository.
type Selection struct {
	GitDir       string
	TaskBranch   string // e.g. berth/PRJ-1: created or moved to the chosen head
	ChosenBranch string // e.g. berth/PRJ-1-a2: stays, checked out in the chosen workspace
	Discard      []Discard
	Now          time.Time
}

// Selected says where the refs ended.
type Selected struct {
	Head     string            // the task branch's new tip
	Replaced string            // when the task branch held commits the chosen head lacks: the rescue ref they stay under
	Rescue   map[string]string // discarded branch → the rescue ref that holds its head
}

// SelectAttempt points the task branch at the chosen attempt's head and moves every discarded
// attempt's branch to its rescue ref (its worktree's HEAD is detached at the same commit first,
// so the close that follows removes a clean worktree; a branch checked out in a worktree this
// node does not manage keeps existing, its head kept under the rescue ref all the same). It is idempotent: a retry finds the task
// branch already at the head and the discarded branches already moved. A task branch checked
// out in any worktree is ErrBranchInUse, and nothing is changed. A rescue ref that already holds
// another commit (an earlier group's) is kept and the new one gets a -<unix> suffix.
func (m *Manager) SelectAttempt(ctx context.Context, s Selection) (Selected, error) {
	lock := m.sourceLock(s.GitDir)
	lock.Lock()
	defer lock.Unlock()
	res, err := m.selectAttempt(ctx, s)
	if err != nil {
		return Selected{}, fmt.Errorf("select attempt: %w", err)
	}
	return res, nil
}

func (m *Manager) selectAttempt(ctx context.Context, s Selection) (Selected, error) {
	res := Selected{Rescue: map[string]string{}}
	if s.ChosenBranch != "" {
		if err := m.pointTaskBranch(ctx, s, &res); err != nil {
			return Selected{}, err
		}
	}
	return res, m.discardAttempts(ctx, s, &res)
}

// pointTaskBranch creates or moves the task branch to the chosen attempt's head.
func (m *Manager) pointTaskBranch(ctx context.Context, s Selection, res *Selected) error {
	gd := "--git-dir=" + s.GitDir
	for _, b := range []string{s.TaskBranch, s.ChosenBranch} {
		if err := m.checkRefName(ctx, b); err != nil {
			return err
		}
	}
	if wt, err := m.worktreeOf(ctx, s.GitDir, s.TaskBranch); err != nil {
		return err
	} else if wt != "" {
		return fmt.Errorf("branch %s is checked out in a worktree: %w", s.TaskBranch, ErrBranchInUse)
	}
	head, ok, err := m.revParse(ctx, s.GitDir, "refs/heads/"+s.ChosenBranch)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("branch %s: %w", s.ChosenBranch, ErrNotFound)
	}
	res.Head = head
	old, exists, err := m.revParse(ctx, s.GitDir, "refs/heads/"+s.TaskBranch)
	if err != nil {
		return err
	}
	switch {
	case !exists:
		if _, err := m.git.run(ctx, gitCall{}, gd, "update-ref", "-m", "berth select", "refs/heads/"+s.TaskBranch, head, ""); err != nil {
			return err
		}
	case old != head:
		kept, err := m.IsAncestor(ctx, s.GitDir, old, head)
		if err != nil {
			return err
		}
		if !kept { // the task branch had work of its own: it stays reachable
			res.Replaced, err = m.keepRef(ctx, s.GitDir, "refs/berth/replaced/"+s.TaskBranch, old, s.Now)
			if err != nil {
				return err
			}
		}
		if _, err := m.git.run(ctx, gitCall{}, gd, "update-ref", "-m", "berth select", "refs/heads/"+s.TaskBranch, head, old); err != nil {
			return err
		}
	}
	return nil
}

// discardAttempts moves each discarded attempt's branch to its rescue ref.
func (m *Manager) discardAttempts(ctx context.Context, s Selection, res *Selected) error {
	gd := "--git-dir=" + s.GitDir
	for _, d := range s.Discard {
		if err := m.checkRefName(ctx, d.Branch); err != nil {
			return err
		}
		tip, ok, err := m.revParse(ctx, s.GitDir, "refs/heads/"+d.Branch)
		if err != nil {
			return err
		}
		if !ok { // a retry: already moved
			res.Rescue[d.Branch] = d.RescueRef
			continue
		}
		name, err := m.keepRef(ctx, s.GitDir, d.RescueRef, tip, s.Now)
		if err != nil {
			return err
		}
		res.Rescue[d.Branch] = name
		if wt, err := m.worktreeOf(ctx, s.GitDir, d.Branch); err != nil {
			return err
		} else if wt != "" {
			root, err := m.Root(d.Ref)
			rec, rerr := m.owned(d.Ref)
			if err != nil || rerr != nil || filepath.Clean(wt) != root {
				continue // checked out where this node cannot detach it: the branch stays, its head is kept anyway
			}
			if rec, err = m.ensureAdminDir(ctx, rec); err != nil {
				return err
			}
			// The worktree's registration (its recorded admin dir), never its own .git.
			if _, err := m.git.run(ctx, gitCall{}, "--git-dir="+rec.AdminDir, "update-ref", "--no-deref", "-m", "berth discard", "HEAD", tip); err != nil {
				return err
			}
		}
		if _, err := m.git.run(ctx, gitCall{}, gd, "update-ref", "-m", "berth discard", "-d", "refs/heads/"+d.Branch, tip); err != nil {
			return err
		}
	}
	return nil
}

// keepRef points name at commit unless it already holds another commit, in which case
// name-<unix> is used; it returns the ref that holds commit.
func (m *Manager) keepRef(ctx context.Context, gitDir, name, commit string, now time.Time) (string, error) {
	cur, exists, err := m.revParse(ctx, gitDir, name)
	if err != nil {
		return "", err
	}
	if exists && cur == commit {
		return name, nil
	}
	if exists {
		name = fmt.Sprintf("%s-%d", name, now.Unix())
	}
	if _, err := m.git.run(ctx, gitCall{}, "--git-dir="+gitDir, "update-ref", "-m", "berth keep", name, commit, ""); err != nil {
		return "", err
	}
	return name, nil
}

// DiffStat is `git diff --shortstat` between two commits: files changed, insertions, deletions.
type DiffStat struct {
	Files, Insertions, Deletions int
}

// DiffStatOf compares commit head with base in gitDir (text diff, renames detected).
func (m *Manager) DiffStatOf(ctx context.Context, gitDir, base, head string) (DiffStat, error) {
	out, err := m.git.run(ctx, gitCall{}, "--git-dir="+gitDir, "diff", "--no-textconv", "--no-ext-diff", "--shortstat", "-M", "--end-of-options", base, head)
	if err != nil {
		return DiffStat{}, fmt.Errorf("diffstat: %w", err)
	}
	var d DiffStat
	for _, part := range strings.Split(out, ",") {
		var n int
		var word string
		if _, err := fmt.Sscanf(strings.TrimSpace(part), "%d %s", &n, &word); err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(word, "file"):
			d.Files = n
		case strings.HasPrefix(word, "insertion"):
			d.Insertions = n
		case strings.HasPrefix(word, "deletion"):
			d.Deletions = n
		}
	}
	return d, nil
}

// maxDiffPaths bounds the files DiffText shows.
const maxDiffPaths = 500

// DiffText is `git diff` between two commits for people to read, cut at max bytes (truncated
// says so). Files with a denied name in their path (DeniedName: secrets, keys, VCS metadata,
// dependency trees) are left out and counted in hidden, as the file browser hides them.
func (m *Manager) DiffText(ctx context.Context, gitDir, base, head string, max int) (text string, truncated bool, hidden int, err error) {
	names, err := m.git.run(ctx, gitCall{}, "--git-dir="+gitDir, "diff", "--no-textconv", "--no-ext-diff", "--name-only", "-z", "--no-renames", "--end-of-options", base, head)
	if err != nil {
		return "", false, 0, fmt.Errorf("diff: %w", err)
	}
	var paths []string
	for _, p := range strings.Split(names, "\x00") {
		if p == "" {
			continue
		}
		if deniedPath(p) {
			hidden++
			continue
		}
		paths = append(paths, ":(literal)"+p)
	}
	if len(paths) == 0 {
		return "", false, hidden, nil
	}
	if len(paths) > maxDiffPaths {
		paths, truncated = paths[:maxDiffPaths], true
	}
	var b []byte
	err = m.git.stream(ctx, gitCall{}, nil, func(r io.Reader) error {
		var rerr error
		b, rerr = io.ReadAll(io.LimitReader(r, int64(max)+1))
		return rerr
	}, append([]string{"--git-dir=" + gitDir, "diff", "--no-renames", "--no-color", "--no-ext-diff", "--no-textconv",
		"--end-of-options", base, head, "--"}, paths...)...)
	if err != nil {
		return "", false, 0, fmt.Errorf("diff: %w", err)
	}
	if len(b) > max {
		return string(b[:max]), true, hidden, nil
	}
	return string(b), truncated, hidden, nil
}

// deniedPath reports whether any component of a slash-separated path is a denied name.
func deniedPath(p string) bool {
	for _, c := range strings.Split(p, "/") {
		if DeniedName(c) {
			return true
		}
	}
	return false
}
