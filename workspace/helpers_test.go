package workspace

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"berth/environment/jail"
)

// testCtx returns a context that ends before the test's own deadline, so every wait is bounded.
func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// testJail is this machine's jail, detected once: the workspace tests run Berth's git scripts in
// it as the run user, as a server does (nil without bubblewrap: on the host).
var testJail = sync.OnceValue(func() *jail.Host {
	h, err := jail.Detect(context.Background())
	if err != nil {
		return nil
	}
	return &h
})

func newTestManager(t testing.TB) *Manager {
	t.Helper()
	m, err := NewManager(t.TempDir(), Options{Jail: testJail()})
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	return m
}

// gitT runs git in dir with a fixed identity and no user configuration, failing the test on error.
func gitT(t testing.TB, dir string, args ...string) string {
	t.Helper()
	// No background auto-gc or maintenance: it would outlive the test and race its cleanup.
	cmd := exec.Command("git", append([]string{"-c", "gc.auto=0", "-c", "maintenance.auto=false"}, args...)...)
	cmd.Dir = dir
	home := filepath.Join(os.TempDir(), "berth-test-git-home")
	_ = os.MkdirAll(home, 0o700)
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + home,
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=Test", "GIT_AUTHOR_EMAIL=test@example.com",
		"GIT_COMMITTER_NAME=Test", "GIT_COMMITTER_EMAIL=test@example.com",
		"GIT_AUTHOR_DATE=2024-01-01T00:00:00Z", "GIT_COMMITTER_DATE=2024-01-01T00:00:00Z",
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// newRepo makes a repository with one commit on main holding the given files.
func newRepo(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	gitT(t, dir, "init", "-q", "-b", "main")
	if len(files) == 0 {
		files = map[string]string{"README.md": "hello\n"}
	}
	writeFiles(t, dir, files)
	gitT(t, dir, "add", "-A")
	gitT(t, dir, "commit", "-q", "-m", "initial")
	return dir
}

func commitFile(t testing.TB, dir, name, content, msg string) string {
	t.Helper()
	writeFiles(t, dir, map[string]string{name: content})
	gitT(t, dir, "add", "-A")
	gitT(t, dir, "commit", "-q", "-m", msg)
	return gitT(t, dir, "rev-parse", "HEAD")
}

func writeFiles(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func mustRead(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// runGit runs git in workspace ref's worktree the way a jailed run does (its private store bound
// over the recorded admin dir, the source's objects as alternates), and returns its stdout.
func runGit(t testing.TB, m *Manager, ref string, args ...string) string {
	t.Helper()
	rec, err := m.owned(ref)
	if err != nil {
		t.Fatal(err)
	}
	if rec, err = m.ensureStore(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	out, err := m.runJailedGit(context.Background(), m.storeJail(rec, m.store(rec), false,
		&Identity{Name: "T", Email: "t@example.com"}, "git "+strings.Join(quoted, " "), nil))
	if err != nil {
		t.Fatalf("git %v in %s: %v", args, ref, err)
	}
	return strings.TrimSpace(string(out))
}
