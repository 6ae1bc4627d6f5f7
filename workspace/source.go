package workspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Project workspace source types.
const (
	SourceGit       = "git"
	SourceDirectory = "directory"
)

// SourceTimeout bounds the git commands one source validation runs, so a wedged filesystem or
// repository cannot hold a request.
const SourceTimeout = 10 * time.Second

// errSourceTimeout is the cause of a validation's own deadline, told apart from the caller's.
var errSourceTimeout = errors.New("source validation timed out")

// maxSourceLen and maxSourceRefLen match the database's limits on project_workspaces.
const (
	maxSourceLen    = 4096
	maxSourceRefLen = 255
)

// SourceProblem is one thing wrong with a project workspace's source, phrased for the person who
// entered it and keyed by the input field it concerns: "source" or "default_ref".
type SourceProblem struct {
	Field   string
	Message string
}

// Error implements error.
func (p *SourceProblem) Error() string { return "source problem: " + p.Field + ": " + p.Message }

// SourceCheck is what a successful validation learned about a source.
type SourceCheck struct {
	Source     string // the path cleaned (no trailing slash, no "." components), or the URL as given
	DefaultRef string // the ref given, or the local repository's HEAD branch when none was
	Commit     string // the commit DefaultRef resolves to (local repositories only)
	Remote     bool   // the source is a URL: only its syntax was checked
	Bare       bool   // the source is a bare local repository
}

// SourceIsURL reports whether a git source names a remote (anything not starting with "/"); a
// relative path is therefore judged as a URL and refused as one.
func SourceIsURL(source string) bool { return !strings.HasPrefix(source, "/") }

// CheckSourceSyntax returns every problem visible without touching the disk or the network:
// the source type, the shape of the path or URL, and the shape of the default ref. An empty
// result means ValidateSource may look at the source itself.
func CheckSourceSyntax(sourceType, source, defaultRef string) []SourceProblem {
	var out []SourceProblem
	add := func(field, msg string) {
		if msg != "" {
			out = append(out, SourceProblem{Field: field, Message: msg})
		}
	}
	switch sourceType {
	case SourceDirectory:
		add("source", SourcePathProblem(source))
		if defaultRef != "" {
			add("default_ref", "only git sources have a default ref; leave it empty for a directory")
		}
	case SourceGit:
		if SourceIsURL(source) {
			add("source", SourceURLProblem(source))
			if defaultRef == "" {
				add("default_ref", "is required for a repository URL (Berth does not contact the remote to find its HEAD)")
			}
		} else {
			add("source", SourcePathProblem(source))
		}
		if defaultRef != "" {
			add("default_ref", SourceRefProblem(defaultRef))
		}
	default:
		add("source_type", `must be "git" or "directory"`)
	}
	return out
}

// SourcePathProblem says why a local source path is unusable, or returns "" when its shape is
// fine: it must be absolute, free of NUL and control characters and ".." components, and not "/".
func SourcePathProblem(p string) string {
	switch {
	case p == "":
		return "is required"
	case len(p) > maxSourceLen:
		return fmt.Sprintf("must be at most %d bytes", maxSourceLen)
	case strings.ContainsRune(p, 0):
		return "must not contain NUL bytes"
	case strings.ContainsFunc(p, isSourceControl):
		return "must not contain control characters"
	case !strings.HasPrefix(p, "/"):
		return "must be an absolute path (starting with /)"
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return "must not contain .. components"
		}
	}
	if filepath.Clean(p) == "/" {
		return "must not be / itself"
	}
	return ""
}

// scpSourceRE is git's scp-like ssh address, user@host:path.
var scpSourceRE = regexp.MustCompile(`^([A-Za-z0-9._~-]+)@([A-Za-z0-9.-]+):(.+)$`)

const sourceURLForms = "must be an absolute path to a local repository or a URL: https://host/path, ssh://host/path, git@host:path or file:///path"

// SourceURLProblem says why a repository URL is unusable, or returns "" when its shape is fine.
// Accepted: https://, ssh://, scp-like user@host:path and file:// URLs. Credentials in a URL are
// refused (https and file URLs may carry no user at all; ssh URLs a user name but no password):
// they would be stored and shown in clear.
func SourceURLProblem(s string) string {
	switch {
	case s == "":
		return "is required"
	case len(s) > maxSourceLen:
		return fmt.Sprintf("must be at most %d bytes", maxSourceLen)
	case strings.ContainsFunc(s, func(r rune) bool { return r == ' ' || isSourceControl(r) }):
		return "must not contain spaces or control characters"
	case strings.HasPrefix(s, "-"):
		return "must not start with -"
	}
	if !strings.Contains(s, "://") {
		if at := strings.IndexByte(s, '@'); at >= 0 && strings.Contains(s[:at], ":") {
			return "must not embed credentials (user:password@); use an SSH key or a credential helper on the host"
		}
		if m := scpSourceRE.FindStringSubmatch(s); m != nil && !strings.HasPrefix(m[3], "-") {
			return ""
		}
		return sourceURLForms
	}
	u, err := url.Parse(s)
	if err != nil {
		return "is not a valid URL"
	}
	if u.User != nil {
		if _, hasPassword := u.User.Password(); hasPassword || u.Scheme != "ssh" {
			return "must not embed credentials (user:password@ or a token); use an SSH key or a credential helper on the host"
		}
	}
	if u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return "must not have a query (?) or a fragment (#)"
	}
	switch u.Scheme {
	case "https", "ssh":
		if u.Hostname() == "" {
			return "must name a host"
		}
		if strings.Trim(u.Path, "/") == "" {
			return "must name a repository path on the host"
		}
		return ""
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return "a file:// URL must not name a host"
		}
		if msg := SourcePathProblem(u.Path); msg != "" {
			return "the path of the file:// URL " + msg
		}
		return ""
	default:
		return sourceURLForms
	}
}

// SourceRefProblem says why a default ref (a branch, tag or commit) is unusable, or returns ""
// when its shape is fine. Revision syntax (ranges, ~, ^, @{…}) is refused: a default ref names
// one commit to start from.
func SourceRefProblem(ref string) string {
	switch {
	case len(ref) > maxSourceRefLen:
		return fmt.Sprintf("must be at most %d characters", maxSourceRefLen)
	case strings.ContainsFunc(ref, func(r rune) bool { return r == ' ' || isSourceControl(r) }):
		return "must not contain spaces or control characters"
	case strings.HasPrefix(ref, "-"):
		return "must not start with -"
	case strings.ContainsAny(ref, "~^:?*[\\") || strings.Contains(ref, "..") || strings.Contains(ref, "@{"):
		return "must be a branch, tag or commit name (no ~ ^ : ? * [ \\ .. or @{)"
	case strings.HasPrefix(ref, "/") || strings.HasSuffix(ref, "/") || strings.HasSuffix(ref, ".") ||
		strings.HasSuffix(ref, ".lock") || strings.Contains(ref, "//"):
		return "is not a valid git ref name"
	}
	return ""
}

func isSourceControl(r rune) bool { return r < 0x20 || r == 0x7f }

// ValidateSource checks a project workspace source on this host and reports the first thing
// wrong as a *SourceProblem. A directory must exist. A local git source must be a repository's
// top-level directory (a work tree) or a bare repository, and its default ref (the HEAD branch
// when none is given) must resolve to a commit. A URL is checked for syntax only: no network.
// Git runs with a clean environment (no user or system config, no prompts) under SourceTimeout.
// Other errors (git missing, the caller's context ending) are returned wrapped.
func ValidateSource(ctx context.Context, sourceType, source, defaultRef string) (SourceCheck, error) {
	if probs := CheckSourceSyntax(sourceType, source, defaultRef); len(probs) > 0 {
		return SourceCheck{}, &probs[0]
	}
	if sourceType == SourceGit && SourceIsURL(source) {
		return SourceCheck{Source: source, DefaultRef: defaultRef, Remote: true}, nil
	}
	dir := filepath.Clean(source)
	if p := checkSourceDir(dir); p != nil {
		return SourceCheck{}, p
	}
	if sourceType == SourceDirectory {
		return SourceCheck{Source: dir}, nil
	}
	ctx, cancel := context.WithTimeoutCause(ctx, SourceTimeout, errSourceTimeout)
	defer cancel()
	check, err := inspectSourceRepo(ctx, dir, defaultRef)
	if err != nil {
		return SourceCheck{}, fmt.Errorf("validate source: %w", err)
	}
	return check, nil
}

// checkSourceDir reports a path that does not exist, is a symbolic link, is not a directory or
// cannot be listed.
func checkSourceDir(dir string) *SourceProblem {
	fi, err := os.Lstat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &SourceProblem{Field: "source", Message: "does not exist on this host"}
	case errors.Is(err, fs.ErrPermission):
		return &SourceProblem{Field: "source", Message: "cannot be read by Berth (permission denied)"}
	case err != nil:
		return &SourceProblem{Field: "source", Message: "cannot be inspected: " + pathErrText(err)}
	case fi.Mode()&fs.ModeSymlink != 0:
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			return &SourceProblem{Field: "source", Message: "is a symbolic link; enter the path it points to: " + real}
		}
		return &SourceProblem{Field: "source", Message: "is a symbolic link that does not resolve"}
	case !fi.IsDir():
		return &SourceProblem{Field: "source", Message: "is not a directory"}
	}
	f, err := os.Open(dir)
	if err == nil {
		_, err = f.Readdirnames(1)
		f.Close()
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return &SourceProblem{Field: "source", Message: "cannot be listed by Berth: " + pathErrText(err)}
	}
	return nil
}

// pathErrText is the reason of a path error without the path (the user already knows it).
func pathErrText(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// inspectSourceRepo checks that dir is a repository (discovery stops at dir: a subdirectory of a
// repository does not count) and resolves the default ref to a commit.
func inspectSourceRepo(ctx context.Context, dir, ref string) (SourceCheck, error) {
	out, err := sourceGit(ctx, dir, "rev-parse", "--is-bare-repository", "--is-inside-work-tree")
	if err != nil {
		return SourceCheck{}, err
	}
	if out.code != 0 {
		return SourceCheck{}, repoProblem(out.stderr)
	}
	lines := strings.Fields(out.stdout)
	bare := len(lines) > 0 && lines[0] == "true"
	workTree := len(lines) > 1 && lines[1] == "true"
	if !bare && !workTree {
		return SourceCheck{}, &SourceProblem{Field: "source", Message: "is a repository's .git directory, not its top-level directory"}
	}
	check := SourceCheck{Source: dir, Bare: bare}

	fromHead := ref == ""
	if fromHead {
		out, err := sourceGit(ctx, dir, "symbolic-ref", "--quiet", "--short", "HEAD")
		if err != nil {
			return SourceCheck{}, err
		}
		if out.code != 0 || strings.TrimSpace(out.stdout) == "" {
			return SourceCheck{}, &SourceProblem{Field: "default_ref", Message: "the repository's HEAD is detached, so there is no branch to default to; enter the branch or commit to start from"}
		}
		ref = strings.TrimSpace(out.stdout)
	}
	out, err = sourceGit(ctx, dir, "rev-parse", "--verify", "--quiet", ref+"^{commit}")
	if err != nil {
		return SourceCheck{}, err
	}
	if out.code != 0 {
		if fromHead {
			return SourceCheck{}, &SourceProblem{Field: "default_ref", Message: fmt.Sprintf("the repository's HEAD branch %q has no commits yet; commit something or enter another ref", ref)}
		}
		return SourceCheck{}, &SourceProblem{Field: "default_ref", Message: fmt.Sprintf("%q does not name a commit in this repository", ref)}
	}
	check.DefaultRef = ref
	check.Commit = strings.TrimSpace(out.stdout)
	return check, nil
}

// repoProblem phrases git's refusal to open a directory as a repository.
func repoProblem(stderr string) *SourceProblem {
	switch {
	case strings.Contains(stderr, "dubious ownership"):
		return &SourceProblem{Field: "source", Message: "is owned by another user, so git refuses to use it (see git's safe.directory)"}
	case strings.Contains(stderr, "not a git repository"):
		return &SourceProblem{Field: "source", Message: "is not a git repository (enter a repository's top-level directory or a bare repository)"}
	}
	msg := strings.TrimSpace(strings.TrimPrefix(firstLine(stderr), "fatal: "))
	if msg == "" {
		msg = "git could not open it"
	}
	return &SourceProblem{Field: "source", Message: "is not a usable git repository: " + msg}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// sourceGitResult is one git command's outcome: its exit code and what it printed.
type sourceGitResult struct {
	stdout, stderr string
	code           int
}

// sourceGit runs one read-only git command in dir with a clean environment: no system or
// global config, no prompts, repository discovery stopped at dir's parent. Only a failure to
// run git at all is an error; a non-zero exit is in the result. Hitting the validation's own
// deadline (errSourceTimeout) is a SourceProblem; the caller's cancellation is an error.
func sourceGit(ctx context.Context, dir string, args ...string) (sourceGitResult, error) {
	full := append([]string{"-C", dir, "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null"}, args...)
	cmd := exec.CommandContext(ctx, "git", full...)
	cmd.Env = sourceGitEnv(dir)
	cmd.Dir = "/"
	cmd.WaitDelay = time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.Is(context.Cause(ctx), errSourceTimeout):
		return sourceGitResult{}, &SourceProblem{Field: "source", Message: fmt.Sprintf("git did not answer within %s; is the path on a slow or stuck filesystem?", SourceTimeout)}
	case ctx.Err() != nil:
		return sourceGitResult{}, fmt.Errorf("git %s: %w", args[0], ctx.Err())
	case errors.As(err, &exit):
		return sourceGitResult{stdout: stdout.String(), stderr: stderr.String(), code: exit.ExitCode()}, nil
	case err != nil:
		return sourceGitResult{}, fmt.Errorf("git %s: %w", args[0], err)
	}
	return sourceGitResult{stdout: stdout.String(), stderr: stderr.String()}, nil
}

// sourceGitEnv is the whole environment a validation's git sees.
func sourceGitEnv(dir string) []string {
	path := os.Getenv("PATH")
	if path == "" {
		path = "/usr/local/bin:/usr/bin:/bin"
	}
	return []string{
		"PATH=" + path,
		"HOME=/nonexistent",
		"XDG_CONFIG_HOME=/nonexistent",
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_TERMINAL_PROMPT=0",
		"GIT_CEILING_DIRECTORIES=" + filepath.Dir(dir),
		"LC_ALL=C",
	}
}

// SourceIsLocal reports whether a project workspace source names this host's filesystem: a
// directory, a git repository by absolute path, or a file:// URL.
func SourceIsLocal(sourceType, source string) bool {
	return sourceType == "directory" || strings.HasPrefix(source, "/") || strings.HasPrefix(source, "file://")
}

// SourceWithin reports whether a local source lies inside one of roots, judged on the real path
// (symlinks resolved), so a link inside an allowed root cannot point a source at the rest of the
// host. A source that does not resolve is outside.
func SourceWithin(source string, roots []string) bool {
	p := strings.TrimPrefix(source, "file://")
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return false
	}
	for _, root := range roots {
		r, err := filepath.EvalSymlinks(root)
		if err != nil || !filepath.IsAbs(r) {
			continue
		}
		if rel, err := filepath.Rel(r, real); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return true
		}
	}
	return false
}
