package workspace_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"berth/workspace"
)

// sourceGitCmd runs git for a test fixture with a fixed identity and no user config.
func sourceGitCmd(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=T", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=T", "GIT_COMMITTER_EMAIL=t@example.com"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// sourceRepo makes a work tree on branch main with one commit and a tag v1.
func sourceRepo(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	sourceGitCmd(t, dir, "init", "-q", "-b", "main")
	if err := os.WriteFile(filepath.Join(dir, "README"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sourceGitCmd(t, dir, "add", "README")
	sourceGitCmd(t, dir, "commit", "-q", "-m", "first")
	sourceGitCmd(t, dir, "tag", "v1")
	return dir
}

func TestValidateSourceLocal(t *testing.T) {
	t.Parallel()
	repo := sourceRepo(t)
	head := sourceGitCmd(t, repo, "rev-parse", "HEAD")
	bare := filepath.Join(t.TempDir(), "bare.git")
	sourceGitCmd(t, repo, "clone", "-q", "--bare", repo, bare)
	detached := filepath.Join(t.TempDir(), "detached")
	sourceGitCmd(t, repo, "clone", "-q", repo, detached)
	sourceGitCmd(t, detached, "checkout", "-q", "--detach")
	empty := t.TempDir()
	sourceGitCmd(t, empty, "init", "-q", "-b", "trunk")
	if err := os.Mkdir(filepath.Join(repo, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	plain := t.TempDir()
	file := filepath.Join(plain, "file.txt")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(repo, link); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name, typ, source, ref string
		wantField, wantMsg     string // a problem expected on this field, its message containing wantMsg
		wantRef                string
		wantBare               bool
	}{
		{name: "ok with branch", typ: "git", source: repo, ref: "main", wantRef: "main"},
		{name: "ok with tag", typ: "git", source: repo, ref: "v1", wantRef: "v1"},
		{name: "ok with commit", typ: "git", source: repo, ref: head, wantRef: head},
		{name: "empty ref resolves HEAD branch", typ: "git", source: repo, wantRef: "main"},
		{name: "trailing slash cleaned", typ: "git", source: repo + "/", wantRef: "main"},
		{name: "bare repository", typ: "git", source: bare, ref: "main", wantRef: "main", wantBare: true},
		{name: "bare repository HEAD", typ: "git", source: bare, wantRef: "main", wantBare: true},
		{name: "missing path", typ: "git", source: filepath.Join(plain, "nope"), wantField: "source", wantMsg: "does not exist"},
		{name: "not a repo", typ: "git", source: plain, wantField: "source", wantMsg: "not a git repository"},
		{name: "subdirectory of a repo", typ: "git", source: filepath.Join(repo, "sub"), wantField: "source", wantMsg: "not a git repository"},
		{name: "the .git directory", typ: "git", source: filepath.Join(repo, ".git"), wantField: "source", wantMsg: ".git directory"},
		{name: "a file", typ: "git", source: file, wantField: "source", wantMsg: "not a directory"},
		{name: "a symlink", typ: "git", source: link, wantField: "source", wantMsg: "symbolic link"},
		{name: "missing ref", typ: "git", source: repo, ref: "develop", wantField: "default_ref", wantMsg: `"develop" does not name a commit`},
		{name: "detached HEAD without ref", typ: "git", source: detached, wantField: "default_ref", wantMsg: "detached"},
		{name: "detached HEAD with ref", typ: "git", source: detached, ref: "main", wantRef: "main"},
		{name: "empty repository", typ: "git", source: empty, wantField: "default_ref", wantMsg: `"trunk" has no commits`},
		{name: "directory ok", typ: "directory", source: plain},
		{name: "directory missing", typ: "directory", source: filepath.Join(plain, "nope"), wantField: "source", wantMsg: "does not exist"},
		{name: "directory is a file", typ: "directory", source: file, wantField: "source", wantMsg: "not a directory"},
		{name: "directory with a ref", typ: "directory", source: plain, ref: "main", wantField: "default_ref", wantMsg: "only git sources"},
		{name: "relative path", typ: "directory", source: "repo", wantField: "source", wantMsg: "absolute"},
		{name: "dot-dot component", typ: "git", source: repo + "/../x", wantField: "source", wantMsg: ".."},
		{name: "root", typ: "directory", source: "/", wantField: "source", wantMsg: "/ itself"},
		{name: "root with dots", typ: "directory", source: "//./", wantField: "source", wantMsg: "/ itself"},
		{name: "NUL byte", typ: "directory", source: plain + "\x00x", wantField: "source", wantMsg: "NUL"},
		{name: "bad type", typ: "svn", source: plain, wantField: "source_type", wantMsg: "git"},
		{name: "option-like ref", typ: "git", source: repo, ref: "--output=/tmp/x", wantField: "default_ref", wantMsg: "start with -"},
		{name: "revision syntax ref", typ: "git", source: repo, ref: "main~1", wantField: "default_ref", wantMsg: "branch, tag or commit"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := workspace.ValidateSource(context.Background(), tc.typ, tc.source, tc.ref)
			var prob *workspace.SourceProblem
			if tc.wantField != "" {
				if !errors.As(err, &prob) {
					t.Fatalf("ValidateSource = %+v, %v; want a problem on %s", got, err, tc.wantField)
				}
				if prob.Field != tc.wantField || !strings.Contains(prob.Message, tc.wantMsg) {
					t.Fatalf("problem = %s %q; want %s containing %q", prob.Field, prob.Message, tc.wantField, tc.wantMsg)
				}
				return
			}
			if err != nil {
				t.Fatalf("ValidateSource: %v", err)
			}
			if got.DefaultRef != tc.wantRef || got.Bare != tc.wantBare || got.Remote {
				t.Fatalf("check = %+v; want ref %q bare %v", got, tc.wantRef, tc.wantBare)
			}
			if got.Source != filepath.Clean(tc.source) {
				t.Fatalf("source = %q, want %q", got.Source, filepath.Clean(tc.source))
			}
			if tc.typ == "git" && got.Commit != head {
				t.Fatalf("commit = %q, want %q", got.Commit, head)
			}
		})
	}
}

func TestValidateSourceURL(t *testing.T) {
	t.Parallel()
	cases := []struct {
		source, ref string
		wantField   string
		wantMsg     string
	}{
		{source: "https://github.com/acme/app.git", ref: "main"},
		{source: "https://git.example.com:8443/acme/app", ref: "v1.2"},
		{source: "ssh://git@github.com/acme/app.git", ref: "main"},
		{source: "git@github.com:acme/app.git", ref: "main"},
		{source: "file:///srv/git/app.git", ref: "main"},
		{source: "https://github.com/acme/app.git", wantField: "default_ref", wantMsg: "required"},
		{source: "https://user:secret@github.com/acme/app.git", ref: "main", wantField: "source", wantMsg: "credentials"},
		{source: "https://ghp_token@github.com/acme/app.git", ref: "main", wantField: "source", wantMsg: "credentials"},
		{source: "ssh://git:secret@github.com/acme/app.git", ref: "main", wantField: "source", wantMsg: "credentials"},
		{source: "git:secret@github.com:acme/app.git", ref: "main", wantField: "source", wantMsg: "credentials"},
		{source: "http://github.com/acme/app.git", ref: "main", wantField: "source", wantMsg: "https://"},
		{source: "ftp://example.com/app.git", ref: "main", wantField: "source", wantMsg: "https://"},
		{source: "https:///acme/app.git", ref: "main", wantField: "source", wantMsg: "host"},
		{source: "https://github.com/", ref: "main", wantField: "source", wantMsg: "repository path"},
		{source: "https://github.com/a/b?x=1", ref: "main", wantField: "source", wantMsg: "query"},
		{source: "file://server/srv/app.git", ref: "main", wantField: "source", wantMsg: "host"},
		{source: "file:///srv/../etc", ref: "main", wantField: "source", wantMsg: ".."},
		{source: "-uhttps://x/y", ref: "main", wantField: "source", wantMsg: "start with -"},
		{source: "git@host:-oProxyCommand=x", ref: "main", wantField: "source", wantMsg: "absolute path"},
		{source: "relative/repo", ref: "main", wantField: "source", wantMsg: "absolute path"},
		{source: "~/repo", ref: "main", wantField: "source", wantMsg: "absolute path"},
		{source: "https://github.com/a b", ref: "main", wantField: "source", wantMsg: "spaces"},
	}
	for _, tc := range cases {
		got, err := workspace.ValidateSource(context.Background(), "git", tc.source, tc.ref)
		if tc.wantField == "" {
			if err != nil || !got.Remote || got.Source != tc.source || got.DefaultRef != tc.ref {
				t.Errorf("%s: = %+v, %v; want a remote source", tc.source, got, err)
			}
			continue
		}
		var prob *workspace.SourceProblem
		if !errors.As(err, &prob) || prob.Field != tc.wantField || !strings.Contains(prob.Message, tc.wantMsg) {
			t.Errorf("%s: err = %v; want a problem on %s containing %q", tc.source, err, tc.wantField, tc.wantMsg)
		}
	}
}

func TestCheckSourceSyntaxReportsEveryField(t *testing.T) {
	t.Parallel()
	probs := workspace.CheckSourceSyntax("git", "https://u:p@example.com/x", "")
	fields := map[string]bool{}
	for _, p := range probs {
		fields[p.Field] = true
	}
	if len(probs) != 2 || !fields["source"] || !fields["default_ref"] {
		t.Fatalf("problems = %+v; want one on source and one on default_ref", probs)
	}
}

func TestValidateSourceCallerCancel(t *testing.T) {
	t.Parallel()
	repo := sourceRepo(t)
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	_, err := workspace.ValidateSource(ctx, "git", repo, "main")
	var prob *workspace.SourceProblem
	if err == nil || errors.As(err, &prob) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v; want the caller's deadline, not a source problem", err)
	}
}

// TestValidateSourceIgnoresUserConfig proves git runs without the caller's environment: a
// GIT_DIR pointing elsewhere must not make a plain directory pass as a repository.
func TestValidateSourceIgnoresUserConfig(t *testing.T) {
	repo := sourceRepo(t)
	t.Setenv("GIT_DIR", filepath.Join(repo, ".git"))
	_, err := workspace.ValidateSource(context.Background(), "git", t.TempDir(), "main")
	var prob *workspace.SourceProblem
	if !errors.As(err, &prob) || prob.Field != "source" {
		t.Fatalf("err = %v; want the plain directory refused", err)
	}
}
