package workspace

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
)

// Realizing a worktree is on the way to every run, and every git process there costs a fork and
// an exec (milliseconds on a loaded machine). What git would say anyway is answered here: plain
// ref names need no `check-ref-format`, and the base, its tree and the task branch come from one
// `cat-file --batch`.

// plainRefName reports whether git's ref-name rules accept name for certain (check-ref-format,
// also with --branch and --allow-onelevel): ASCII letters, digits, '-', '_', '.' and '/' only, not
// starting with '-' or ending with '.', no "..", not HEAD, and slash-separated components none of
// which is empty, starts with '.' or ends with ".lock". Any other name is for git itself to judge.
func plainRefName(name string) bool {
	if name == "" || name == "HEAD" || name[0] == '-' || strings.HasSuffix(name, ".") || strings.Contains(name, "..") {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.' || c == '/') {
			return false
		}
	}
	for _, comp := range strings.Split(name, "/") {
		if comp == "" || comp[0] == '.' || strings.HasSuffix(comp, ".lock") {
			return false
		}
	}
	return true
}

// commitObject is the commit a revision names, with its tree; ok is false when it names none.
type commitObject struct {
	id, tree string
	ok       bool
}

// lookupCommits resolves each of revs, peeled to a commit, in the repository at gitDir with one
// `git cat-file --batch`, and reads each commit's tree from that commit object itself, so a
// commit and its tree always belong together. A revision git cannot resolve to a commit (missing,
// ambiguous, another kind of object) is not ok, as for revParse.
func (m *Manager) lookupCommits(ctx context.Context, gitDir string, revs ...string) ([]commitObject, error) {
	var in strings.Builder
	for _, r := range revs {
		if r == "" || strings.ContainsAny(r, " \t\r\n") {
			return nil, fmt.Errorf("look up revision %q: %w", r, ErrBadBranch)
		}
		in.WriteString(r + "^{commit}\n")
	}
	args := []string{"--git-dir=" + gitDir, "cat-file", "--batch"}
	out, code, err := m.git.exec(ctx, gitCall{stdin: strings.NewReader(in.String())}, args...)
	if err != nil {
		return nil, err
	}
	if code != 0 {
		return nil, m.git.failure(args, code, out)
	}
	found := make([]commitObject, len(revs))
	rest := out.stdout
	for i := range revs {
		line, after, ok := bytes.Cut(rest, []byte("\n"))
		if !ok {
			return nil, fmt.Errorf("git cat-file: %d answers for %d revisions: %w", i, len(revs), ErrGit)
		}
		rest = after
		f := strings.Fields(string(line))
		if len(f) == 2 && (f[1] == "missing" || f[1] == "ambiguous") {
			continue
		}
		size := -1
		if len(f) == 3 && isHexID(f[0]) && f[1] == "commit" {
			size, _ = strconv.Atoi(f[2])
		}
		if size < 0 || size >= len(rest) || rest[size] != '\n' {
			return nil, fmt.Errorf("git cat-file: malformed answer %q: %w", line, ErrGit)
		}
		body := rest[:size]
		rest = rest[size+1:]
		first, _, _ := bytes.Cut(body, []byte("\n"))
		tree, ok := bytes.CutPrefix(first, []byte("tree "))
		if !ok || !isHexID(string(tree)) {
			return nil, fmt.Errorf("git cat-file: commit %.12s has no tree line: %w", f[0], ErrGit)
		}
		found[i] = commitObject{id: f[0], tree: string(tree), ok: true}
	}
	return found, nil
}
