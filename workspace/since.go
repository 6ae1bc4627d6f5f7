package workspace

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// CommitsSince counts the commits on HEAD of the worktree at root that are not reachable from
// commit, the base commit recorded when the workspace was made: the work done in this
// workspace, whatever happened to the base branch since. GitState's Ahead compares against the
// base branch as it is now, so after a merge it says 0 although the task branch still carries
// its commit; pages show both, each named for what it compares.
func (m *Manager) CommitsSince(ctx context.Context, root, commit string) (int, error) {
	if !commitID(commit) {
		return 0, fmt.Errorf("commits since: %q is not a full commit id", printable(commit))
	}
	out, err := m.git.run(ctx, gitCall{dir: root}, "rev-list", "--count", "--end-of-options", commit+"..HEAD")
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
