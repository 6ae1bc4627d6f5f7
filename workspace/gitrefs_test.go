package workspace

import (
	"testing"
)

// TestPlainRefNameAgreesWithGit: every name the fast path accepts, git's check-ref-format accepts
// too (in both modes Berth asks it), and the names it leaves to git include the ones git refuses.
func TestPlainRefNameAgreesWithGit(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	names := []struct {
		name  string
		plain bool
	}{
		{"main", true}, {"berth/PRJ-1", true}, {"tasks/PRJ-9/work", true}, {"refs/heads/main", true},
		{"release-1.2", true}, {"a_b/c.d/e-f", true}, {"v1.0.0", true}, {"HEAD", false},
		{"", false}, {"-rf", false}, {"a..b", false}, {"x/K.lock", false}, {"x.lock/y", false},
		{".hidden", false}, {"a/.b", false}, {"a/", false}, {"/a", false}, {"a//b", false}, {"a.", false},
		{"a b", false}, {"a~1", false}, {"a^", false}, {"a:b", false}, {"a?", false}, {"a*", false},
		{"a[b", false}, {`a\b`, false}, {"K@{1}", false}, {"@", false}, {"a\x01b", false}, {"a\x7fb", false},
		{"ünï/côdé", false}, {"a@b", false}, {"a{b}", false},
	}
	for _, tc := range names {
		if got := plainRefName(tc.name); got != tc.plain {
			t.Errorf("plainRefName(%q) = %v, want %v", tc.name, got, tc.plain)
		}
		if !tc.plain || tc.name == "" {
			continue
		}
		for _, args := range [][]string{{"check-ref-format", "--branch", tc.name}, {"check-ref-format", "--allow-onelevel", tc.name}} {
			if _, code, err := m.git.exec(ctx, gitCall{}, args...); err != nil || code != 0 {
				t.Errorf("git %v = %d, %v; the fast path accepts it", args, code, err)
			}
		}
	}
}

// TestLookupCommits: one cat-file answers for every revision in order, with each commit's own
// tree; a missing ref, a non-commit and an unknown id are not ok, and a revision that could
// break the batch's lines is refused before git runs.
func TestLookupCommits(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	repo := newRepo(t, map[string]string{"README.md": "hi\n"})
	first := gitT(t, repo, "rev-parse", "HEAD")
	second := commitFile(t, repo, "b.txt", "b", "second")
	gitT(t, repo, "tag", "-a", "-m", "t", "v1", first)
	blob := gitT(t, repo, "rev-parse", "HEAD:b.txt")
	gitDir := repo + "/.git"

	got, err := m.lookupCommits(ctx, gitDir, "refs/heads/main", "refs/heads/nope", "refs/tags/v1", blob,
		"0000000000000000000000000000000000000000", first)
	if err != nil {
		t.Fatal(err)
	}
	want := []commitObject{
		{id: second, tree: gitT(t, repo, "rev-parse", second+"^{tree}"), ok: true},
		{}, // no such branch
		{id: first, tree: gitT(t, repo, "rev-parse", first+"^{tree}"), ok: true}, // an annotated tag, peeled
		{}, // a blob is no commit
		{}, // no such object
		{id: first, tree: gitT(t, repo, "rev-parse", first+"^{tree}"), ok: true},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d answers, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("answer %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	for _, bad := range []string{"", "main\nrefs/heads/main", "a b"} {
		if _, err := m.lookupCommits(ctx, gitDir, bad); err == nil {
			t.Errorf("lookupCommits(%q) ran", bad)
		}
	}
	if _, err := m.lookupCommits(ctx, t.TempDir(), "refs/heads/main"); err == nil {
		t.Error("lookupCommits in a directory that is no repository succeeded")
	}
}
