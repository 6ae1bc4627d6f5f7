package workspace

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// scpLikeRE matches git's scp-like ssh syntax, user@host:path or host:path.
var scpLikeRE = regexp.MustCompile(`^(?:[A-Za-z0-9._~-]+@)?([A-Za-z0-9.-]+):([^/].*|/.+)$`)

// gitSource is a resolved repository: the git directory that holds the task branches, and whether
// it is Berth's bare cache of a remote.
type gitSource struct {
	gitDir string
	remote bool
	url    string
}

// NormalizeGitURL returns the canonical form of a remote git source used to key the clone cache:
// lower-case scheme and host, no credentials, no trailing slash or ".git". scp-like addresses become
// ssh:// URLs. Local paths, relative paths, other transports and strings that could pass for options
// are refused with ErrUnsafePath.
func NormalizeGitURL(s string) (string, error) {
	if s == "" || strings.HasPrefix(s, "-") || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return "", fmt.Errorf("normalize git url: %w", ErrUnsafePath)
	}
	if !strings.Contains(s, "://") {
		m := scpLikeRE.FindStringSubmatch(s)
		if m == nil || len(m[1]) == 1 { // a one-letter "host" is a drive letter
			return "", fmt.Errorf("normalize git url: not a URL: %w", ErrUnsafePath)
		}
		s = "ssh://" + m[1] + "/" + strings.TrimPrefix(m[2], "/")
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("normalize git url: %v: %w", err, ErrUnsafePath)
	}
	switch strings.ToLower(u.Scheme) {
	case "https", "http", "ssh", "git", "file":
	default:
		return "", fmt.Errorf("normalize git url: scheme %q not allowed: %w", u.Scheme, ErrUnsafePath)
	}
	p := path.Clean("/" + u.Path)
	p = strings.TrimSuffix(strings.TrimSuffix(p, "/"), ".git")
	n := url.URL{Scheme: strings.ToLower(u.Scheme), Host: strings.ToLower(u.Host), Path: p}
	return n.String(), nil
}

// isRemoteSource tells a git URL from a local repository path.
func isRemoteSource(s string) bool { return !filepath.IsAbs(s) }

// resolveSource locates the repository for a source: the common git dir of a local repository, or
// Berth's bare cache of a URL, cloned on first use and fetched on every later preparation. The caller
// holds no lock; resolveSource returns with the source's lock held (unlock must be called).
func (m *Manager) resolveSource(ctx context.Context, source string) (gitSource, func(), error) {
	if !isRemoteSource(source) {
		out, err := m.git.run(ctx, gitCall{dir: source}, "rev-parse", "--path-format=absolute", "--git-common-dir")
		if err != nil {
			return gitSource{}, nil, err
		}
		gitDir := filepath.Clean(out)
		lock := m.sourceLock(gitDir)
		lock.Lock()
		return gitSource{gitDir: gitDir}, lock.Unlock, nil
	}
	norm, err := NormalizeGitURL(source)
	if err != nil {
		return gitSource{}, nil, err
	}
	sum := sha256.Sum256([]byte(norm))
	dir := filepath.Join(m.cache, hex.EncodeToString(sum[:]))
	lock := m.sourceLock(dir)
	lock.Lock()
	if err := m.ensureCache(ctx, source, dir); err != nil {
		lock.Unlock()
		return gitSource{}, nil, err
	}
	return gitSource{gitDir: dir, remote: true, url: source}, lock.Unlock, nil
}

// ensureCache clones url into the bare cache dir on first use (into a temporary directory renamed
// into place, so a half clone is never used) and fetches it otherwise. Remote branches land in
// refs/remotes/origin/*, so fetching never touches the task branches kept in refs/heads/*.
func (m *Manager) ensureCache(ctx context.Context, rawURL, dir string) error {
	fi, err := os.Lstat(dir)
	switch {
	case err == nil && fi.IsDir():
		if fi.Mode().Perm() != 0o755 { // made before the cache was readable by the run user
			if err := os.Chmod(dir, 0o755); err != nil {
				return err
			}
		}
		return m.fetchCache(ctx, rawURL, dir)
	case err == nil:
		return fmt.Errorf("git cache entry is not a directory: %w", ErrUnsafePath)
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	tmp, err := os.MkdirTemp(m.cache, ".clone-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp) // a no-op after the rename
	g := gitCall{}
	if _, err := m.git.run(ctx, g, "init", "--bare", "--quiet", tmp); err != nil {
		return err
	}
	if _, err := m.git.run(ctx, g, "--git-dir="+tmp, "config", "remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*"); err != nil {
		return err
	}
	if err := m.fetchCache(ctx, rawURL, tmp); err != nil {
		return err
	}
	// Readable by the run user: a jailed run reads the cache's objects (its worktree's common
	// dir); the data dir around it is private.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

func (m *Manager) fetchCache(ctx context.Context, rawURL, dir string) error {
	g := gitCall{}
	if _, err := m.git.run(ctx, g, "--git-dir="+dir, "config", "remote.origin.url", rawURL); err != nil {
		return err
	}
	if _, err := m.git.run(ctx, g, "--git-dir="+dir, "fetch", "--quiet", "--prune", "--tags", "origin"); err != nil {
		return err
	}
	_, err := m.git.run(ctx, g, "--git-dir="+dir, "remote", "set-head", "origin", "--auto")
	return err
}
