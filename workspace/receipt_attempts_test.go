package workspace

import (
	"strings"
	"testing"
	"time"
)

// TestSelectAttemptAndDiff: the diff shown for an attempt leaves protected names out; selecting
// moves the task branch (keeping its own commits under a replaced ref) and moves the discarded
// branch to its rescue ref; a retry changes nothing; a checked-out task branch is refused.
func TestSelectAttemptAndDiff(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	repo := newRepo(t, nil)
	base := gitT(t, repo, "rev-parse", "HEAD")
	gitDir := repo + "/.git"
	for _, b := range []string{"berth/K-1-a1", "berth/K-1-a2", "berth/K-1"} {
		gitT(t, repo, "checkout", "-q", "-b", b, base)
		commitFile(t, repo, "f-"+strings.ReplaceAll(b, "/", "_"), b+"\n", b)
	}
	writeFiles(t, repo, map[string]string{".env": "SECRET=1\n"})
	gitT(t, repo, "checkout", "-q", "berth/K-1-a2")
	writeFiles(t, repo, map[string]string{".env": "SECRET=1\n"})
	gitT(t, repo, "add", "-A")
	gitT(t, repo, "commit", "-qm", "env")
	gitT(t, repo, "checkout", "-q", "main")
	a2 := gitT(t, repo, "rev-parse", "berth/K-1-a2")

	text, cut, hidden, err := m.DiffText(ctx, gitDir, base, a2, 1<<20)
	if err != nil || cut || hidden != 1 || strings.Contains(text, "SECRET") || !strings.Contains(text, "berth/K-1-a2") {
		t.Fatalf("DiffText = %q, cut %v, hidden %d, %v", text, cut, hidden, err)
	}
	if st, err := m.DiffStatOf(ctx, gitDir, base, a2); err != nil || st.Files != 2 || st.Insertions != 2 {
		t.Fatalf("DiffStatOf = %+v, %v", st, err)
	}

	sel := Selection{GitDir: gitDir, TaskBranch: "berth/K-1", ChosenBranch: "berth/K-1-a2", Now: time.Unix(100, 0),
		Discard: []Discard{{Ref: "ws-00000000000000000000000000000000", Branch: "berth/K-1-a1", RescueRef: "refs/berth/discarded/K-1-a1"}}}
	oldTask := gitT(t, repo, "rev-parse", "berth/K-1")
	a1 := gitT(t, repo, "rev-parse", "berth/K-1-a1")
	res, err := m.SelectAttempt(ctx, sel)
	if err != nil || res.Head != a2 || res.Replaced != "refs/berth/replaced/berth/K-1" || res.Rescue["berth/K-1-a1"] != "refs/berth/discarded/K-1-a1" {
		t.Fatalf("SelectAttempt = %+v, %v", res, err)
	}
	if got := gitT(t, repo, "rev-parse", "berth/K-1"); got != a2 {
		t.Fatalf("task branch at %s, want %s", got, a2)
	}
	if got := gitT(t, repo, "rev-parse", "refs/berth/replaced/berth/K-1"); got != oldTask {
		t.Fatal("the task branch's own commit was not kept")
	}
	if got := gitT(t, repo, "rev-parse", "refs/berth/discarded/K-1-a1"); got != a1 {
		t.Fatal("the discarded head was not kept")
	}
	if out := gitT(t, repo, "branch", "--list", "berth/K-1-a1"); out != "" {
		t.Fatalf("the discarded branch still exists: %q", out)
	}
	if got := gitT(t, repo, "rev-parse", "main"); got != base {
		t.Fatal("the base moved")
	}
	if _, err := m.SelectAttempt(ctx, sel); err != nil { // a retry
		t.Fatalf("retry: %v", err)
	}
	gitT(t, repo, "checkout", "-q", "berth/K-1")
	if _, err := m.SelectAttempt(ctx, sel); err == nil || !strings.Contains(err.Error(), "checked out") {
		t.Fatalf("select with the task branch checked out = %v", err)
	}
}
