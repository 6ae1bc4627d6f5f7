package workspace

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Artifacts is a content-addressed store at <data dir>/artifacts/<sha256>. It lives outside every
// workspace, so closing a workspace never deletes what it produced. Stored files are immutable.
type Artifacts struct {
	dir string
	// step, when set (tests only), is called at each publish step of Put ("synced": the
	// temporary file is complete and fsynced, "renamed": it is in place, its directory not yet
	// fsynced), so a fault test can fail or kill the process there (docs/runs.md "Durability").
	step func(string)
}

// NewArtifacts prepares <dataDir>/artifacts (mode 0700) and returns the store over it.
func NewArtifacts(dataDir string) (*Artifacts, error) {
	if !filepath.IsAbs(dataDir) {
		return nil, fmt.Errorf("new artifacts: data dir must be absolute: %w", ErrUnsafePath)
	}
	dir := filepath.Join(dataDir, "artifacts")
	if err := ensurePrivateDir(dir); err != nil {
		return nil, fmt.Errorf("new artifacts: %w", err)
	}
	removeStalePuts(dir)
	return &Artifacts{dir: dir}, nil
}

// stalePutAge: a Put's temporary file this old belongs to a process that died between write and
// rename (a Put that still runs writes to it continuously).
const stalePutAge = time.Hour

// removeStalePuts removes what killed Puts left behind; their content, never renamed into place,
// is nobody's.
func removeStalePuts(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".put-") {
			continue
		}
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() && time.Since(fi.ModTime()) > stalePutAge {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// Put stores the content of r and returns its digest (64 lowercase hex) and size. When want is not
// empty the content must hash to it, or nothing is stored and ErrDigest is returned. The write is
// atomic (temporary file, fsync, rename, directory fsync) and idempotent: storing existing content
// again succeeds without rewriting it.
func (a *Artifacts) Put(ctx context.Context, r io.Reader, want string) (string, int64, error) {
	if want != "" && !validHexDigest(want) {
		return "", 0, fmt.Errorf("put artifact: %q: %w", want, ErrDigest)
	}
	tmp, err := os.CreateTemp(a.dir, ".put-")
	if err != nil {
		return "", 0, fmt.Errorf("put artifact: %w", err)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	n, err := io.CopyBuffer(io.MultiWriter(tmp, h), &ctxReader{ctx: ctx, r: r}, make([]byte, 256<<10))
	if err != nil {
		return "", 0, fmt.Errorf("put artifact: %w", err)
	}
	got := hex.EncodeToString(h.Sum(nil))
	if want != "" && got != want {
		return "", 0, fmt.Errorf("put artifact: content hashes to %s, want %s: %w", got, want, ErrDigest)
	}
	if err := tmp.Chmod(0o444); err != nil {
		return "", 0, fmt.Errorf("put artifact: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return "", 0, fmt.Errorf("put artifact: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", 0, fmt.Errorf("put artifact: %w", err)
	}
	a.at("synced")
	final := filepath.Join(a.dir, got)
	if fi, err := os.Lstat(final); err == nil && fi.Mode().IsRegular() && fi.Size() == n {
		os.Remove(tmp.Name())
		done = true
		return got, n, nil
	}
	if err := os.Rename(tmp.Name(), final); err != nil {
		return "", 0, fmt.Errorf("put artifact: %w", err)
	}
	done = true
	a.at("renamed")
	if err := syncDir(a.dir); err != nil {
		return "", 0, fmt.Errorf("put artifact: %w", err)
	}
	return got, n, nil
}

// at reports reaching a publish step to the test hook.
func (a *Artifacts) at(step string) {
	if a.step != nil {
		a.step(step)
	}
}

// Open returns the stored content for digest, which must be 64 lowercase hex (anything else is
// ErrDigest, so a digest can never name another path). A missing artifact is ErrNotFound.
func (a *Artifacts) Open(digest string) (*os.File, error) {
	if !validHexDigest(digest) {
		return nil, fmt.Errorf("open artifact: %q: %w", digest, ErrDigest)
	}
	f, err := os.OpenFile(filepath.Join(a.dir, digest), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("open artifact %s: %w", digest, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("open artifact %s: %w", digest, err)
	}
	return f, nil
}

// Verify re-hashes a stored artifact and fails with ErrDigest if its content no longer matches.
func (a *Artifacts) Verify(ctx context.Context, digest string) error {
	f, err := a.Open(digest)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, &ctxReader{ctx: ctx, r: f}); err != nil {
		return fmt.Errorf("verify artifact %s: %w", digest, err)
	}
	if hex.EncodeToString(h.Sum(nil)) != digest {
		return fmt.Errorf("verify artifact %s: %w", digest, ErrDigest)
	}
	return nil
}
