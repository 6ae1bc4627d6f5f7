package workspace

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Result is what a realization produced, for the caller to record in its ledger.
type Result struct {
	// Ref is the opaque workspace ref (ws- + 32 hex), never a path.
	Ref string `json:"ref"`
	// Cwd is the working directory relative to Manager.Base; empty for a shared workspace.
	Cwd string `json:"cwd"`
	// Strategy is how the root was realized.
	Strategy Strategy `json:"strategy"`
	// Shared marks a workspace whose directory belongs to the project and is never deleted.
	Shared bool `json:"shared"`
	// Branch is the task branch of a worktree.
	Branch string `json:"branch,omitempty"`
	// BaseRef is the fully qualified ref the worktree started from, resolvable in the repository
	// that holds the branch (refs/heads/main locally, refs/remotes/origin/main in the cache).
	BaseRef string `json:"base_ref,omitempty"`
	// BaseCommit is the commit BaseRef pointed at.
	BaseCommit string `json:"base_commit,omitempty"`
	// TreeDigest is "sha256:…" (a manifest digest) for copies and capsules and "git:<tree id>" for
	// worktrees (the base commit's tree).
	TreeDigest string `json:"tree_digest,omitempty"`
	// Reused is true when an existing clean, unstarted worktree of the same task was returned.
	Reused bool `json:"reused"`
	// Skipped lists what a copy left out and why.
	Skipped []Skipped `json:"skipped,omitempty"`
}

// RealizeShared records a shared workspace: no copy, the result points at the project directory dir
// (absolute, an existing directory that neither lies inside the managed base nor contains it).
// Destroy refuses it with ErrNotManaged, so cleanup can never delete the project's files.
func (m *Manager) RealizeShared(ctx context.Context, dir string) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("realize shared: %w", err)
	}
	real, err := m.sourceDir(dir)
	if err != nil {
		return Result{}, fmt.Errorf("realize shared: %w", err)
	}
	if within(m.base, real) {
		// The project would expose every other workspace to this one's runs.
		return Result{}, fmt.Errorf("realize shared: project directory contains the managed base: %w", ErrUnsafePath)
	}
	rec := record{Ref: newRef(), Strategy: StrategyShared, SharedRoot: real}
	if err := m.writeRecord(rec); err != nil {
		return Result{}, fmt.Errorf("realize shared: %w", err)
	}
	return Result{Ref: rec.Ref, Strategy: StrategyShared, Shared: true}, nil
}

// sourceDir checks a project directory: absolute, an existing directory, not inside the managed base.
func (m *Manager) sourceDir(dir string) (string, error) {
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("source must be an absolute path: %w", ErrUnsafePath)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", fmt.Errorf("source: %w", ErrNotFound)
	}
	fi, err := os.Stat(real)
	if err != nil || !fi.IsDir() {
		return "", fmt.Errorf("source is not a directory: %w", ErrUnsafePath)
	}
	if within(real, m.base) {
		return "", fmt.Errorf("source is inside the managed base: %w", ErrUnsafePath)
	}
	return real, nil
}

// within reports whether p is dir or below it (both cleaned absolute paths).
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+string(filepath.Separator)) || dir == "/"
}

// RealizeCopy creates a managed root holding a copy of the directory source: regular files and
// directories only, modes kept without setuid/setgid/sticky, symlinks never followed. Symlinks,
// devices, FIFOs, sockets, hard-linked files (more than one link), .git and unportable names are
// skipped and listed in Result.Skipped with their reason; so is Berth's data directory when the
// source contains it. The tree digest and base manifest are recorded for FinalizeCopy.
func (m *Manager) RealizeCopy(ctx context.Context, source string) (Result, error) {
	real, err := m.sourceDir(source)
	if err != nil {
		return Result{}, fmt.Errorf("realize copy: %w", err)
	}
	rec, root, err := m.createRoot(record{Strategy: StrategyCopy})
	if err != nil {
		return Result{}, fmt.Errorf("realize copy: %w", err)
	}
	dataID, err := dirIdentity(m.dataDir)
	if err != nil {
		_ = m.removeRoot(context.WithoutCancel(ctx), rec)
		return Result{}, fmt.Errorf("realize copy: %w", err)
	}
	man, skipped, err := copyTree(ctx, real, root, dataID)
	if err == nil {
		err = m.writeManifest(rec.Ref, man)
	}
	if err != nil {
		_ = m.removeRoot(context.WithoutCancel(ctx), rec)
		return Result{}, fmt.Errorf("realize copy: %w", err)
	}
	return Result{Ref: rec.Ref, Cwd: rec.Ref, Strategy: StrategyCopy, TreeDigest: man.Digest(), Skipped: skipped}, nil
}

// RealizeCapsule creates a managed root from a capsule stream (see Import) and records it as a copy
// whose base manifest is m. This is how a workspace is realized on a machine that cannot see the
// source.
func (m *Manager) RealizeCapsule(ctx context.Context, r io.Reader, man Manifest, lim Limits) (Result, error) {
	ref := newRef()
	root := filepath.Join(m.base, ref)
	if err := Import(ctx, r, man, root, lim); err != nil {
		return Result{}, fmt.Errorf("realize capsule: %w", err)
	}
	rec := record{Ref: ref, Strategy: StrategyCopy}
	err := m.stampAndWrite(&rec, root)
	if err == nil {
		err = m.writeManifest(ref, man)
	}
	if err != nil {
		// Without a record the directory is not ours to delete; it stays visible in Unmanaged.
		return Result{}, fmt.Errorf("realize capsule: %w", err)
	}
	return Result{Ref: ref, Cwd: ref, Strategy: StrategyCopy, TreeDigest: man.Digest()}, nil
}

func (m *Manager) writeManifest(ref string, man Manifest) error {
	b, err := json.Marshal(man)
	if err != nil {
		return err
	}
	return writeFileAtomic(m.base, m.manifestPath(ref), b)
}

// BaseManifest returns the manifest a copy workspace started from.
func (m *Manager) BaseManifest(ref string) (Manifest, error) {
	var man Manifest
	rec, err := m.owned(ref)
	if err != nil {
		return man, fmt.Errorf("base manifest: %w", err)
	}
	if rec.Strategy != StrategyCopy {
		return man, fmt.Errorf("base manifest %s: %s workspace has none: %w", ref, rec.Strategy, ErrNotFound)
	}
	b, err := readFileNoFollow(m.manifestPath(ref), 1<<30)
	if err != nil {
		return man, fmt.Errorf("base manifest %s: %w", ref, err)
	}
	if err := json.Unmarshal(b, &man); err != nil {
		return man, fmt.Errorf("base manifest %s: %w", ref, err)
	}
	return man, nil
}

// copyTree copies the scanned regular files and directories of src into the empty directory dst and
// returns the manifest of what it wrote.
func copyTree(ctx context.Context, src, dst string, exclude ...identity) (Manifest, []Skipped, error) {
	entries, skipped, err := scanTree(ctx, src, exclude...)
	if err != nil {
		return Manifest{}, nil, err
	}
	srcRoot, err := os.OpenRoot(src)
	if err != nil {
		return Manifest{}, nil, err
	}
	defer srcRoot.Close()
	dstRoot, err := os.OpenRoot(dst)
	if err != nil {
		return Manifest{}, nil, err
	}
	defer dstRoot.Close()

	man := Manifest{Entries: make([]ManifestEntry, 0, len(entries))}
	buf := make([]byte, 1<<20)
	var dirs []scanEntry
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return Manifest{}, nil, err
		}
		if e.dir {
			if err := dstRoot.Mkdir(e.rel, 0o700); err != nil {
				return Manifest{}, nil, err
			}
			dirs = append(dirs, e)
			man.Entries = append(man.Entries, ManifestEntry{Path: e.rel, Type: TypeDir, Mode: 0o755})
			continue
		}
		me, err := copyFile(srcRoot, dstRoot, e, buf)
		if errors.Is(err, errChanged) || errors.Is(err, os.ErrNotExist) {
			skipped = append(skipped, Skipped{Path: e.rel, Reason: SkipChanged})
			continue
		}
		if err != nil {
			return Manifest{}, nil, fmt.Errorf("copy %q: %w", e.rel, err)
		}
		man.Entries = append(man.Entries, me)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := dstRoot.Chmod(dirs[i].rel, os.FileMode(dirs[i].perm)); err != nil {
			return Manifest{}, nil, err
		}
	}
	sort.Slice(skipped, func(i, j int) bool { return skipped[i].Path < skipped[j].Path })
	return man, skipped, nil
}

func copyFile(srcRoot, dstRoot *os.Root, e scanEntry, buf []byte) (ManifestEntry, error) {
	in, _, err := openScanned(srcRoot, e)
	if err != nil {
		return ManifestEntry{}, err
	}
	defer in.Close()
	out, err := dstRoot.OpenFile(e.rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return ManifestEntry{}, err
	}
	defer out.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(io.MultiWriter(out, h), onlyReader{in}, buf)
	if err != nil {
		return ManifestEntry{}, err
	}
	if err := out.Chmod(os.FileMode(e.perm)); err != nil {
		return ManifestEntry{}, err
	}
	if err := out.Close(); err != nil {
		return ManifestEntry{}, err
	}
	return ManifestEntry{Path: e.rel, Type: TypeFile, Size: n, Mode: normMode(e.perm, false), SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// onlyReader hides an *os.File's WriterTo so io.CopyBuffer uses the buffer (the hash must see every
// byte, so the kernel copy fast path does not apply).
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }
