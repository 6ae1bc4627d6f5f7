package workspace

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// CommitsSince counts the commits on the task branch of worktree workspace ref that are not
// reachable from commit, the base commit recorded when the workspace was made: the work done in
// this workspace, whatever happened to the base branch since. GitState's Ahead compares against
// the base branch as it is now, so after a merge it says 0 although the task branch still carries
// its commit; pages show both, each named for what it compares. It reads objects and refs of the
// source only (the branch as finalize left it), never the workspace.
func (m *Manager) CommitsSince(ctx context.Context, ref, commit string) (int, error) {
	if !commitID(commit) {
		return 0, fmt.Errorf("commits since: %q is not a full commit id", printable(commit))
	}
	rec, err := m.owned(ref)
	if err != nil {
		return 0, fmt.Errorf("commits since: %w", err)
	}
	if rec.Strategy != StrategyGitWorktree || rec.GitDir == "" || rec.Branch == "" {
		return 0, fmt.Errorf("commits since: %s is not a git worktree: %w", ref, ErrNotManaged)
	}
	out, err := m.git.run(ctx, gitCall{}, "--git-dir="+rec.GitDir, "rev-list", "--count", "--end-of-options",
		commit+"..refs/heads/"+rec.Branch)
	if err != nil {
		return 0, fmt.Errorf("commits since: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		return 0, fmt.Errorf("commits since: unexpected rev-list output %q", out)
	}
	return n, nil
}

// commitID reports whether s is a full SHA-1 or SHA-256 commit id in lowercase hex.
func commitID(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// GitDir is the repository that holds the task branch of worktree workspace ref, as Berth
// recorded it when it made the worktree (never found from the workspace's own .git).
func (m *Manager) GitDir(ref string) (string, error) {
	rec, err := m.owned(ref)
	if err != nil {
		return "", fmt.Errorf("git dir: %w", err)
	}
	if rec.Strategy != StrategyGitWorktree || rec.GitDir == "" {
		return "", fmt.Errorf("git dir: %s is not a git worktree: %w", ref, ErrNotManaged)
	}
	return rec.GitDir, nil
}
