package workspace

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
// source contains it. A source over the copy quota (Options.CopyMaxBytes, CopyMaxFiles) is refused
// with ErrSourceTooLarge before anything is written. The tree digest and base manifest are recorded
// for FinalizeCopy.
func (m *Manager) RealizeCopy(ctx context.Context, source string) (Result, error) {
	real, err := m.sourceDir(source)
	if err != nil {
		return Result{}, fmt.Errorf("realize copy: %w", err)
	}
	dataID, err := dirIdentity(m.dataDir)
	if err != nil {
		return Result{}, fmt.Errorf("realize copy: %w", err)
	}
	// Scan and check the quota before the root exists: an oversized source costs no disk at all.
	entries, skipped, err := scanTree(ctx, real, dataID)
	if err != nil {
		return Result{}, fmt.Errorf("realize copy: %w", err)
	}
	if err := m.copyQuota.check(entries); err != nil {
		return Result{}, fmt.Errorf("realize copy: %w", err)
	}
	rec, root, err := m.createRoot(record{Strategy: StrategyCopy})
	if err != nil {
		return Result{}, fmt.Errorf("realize copy: %w", err)
	}
	man, skipped, err := copyTree(ctx, real, root, entries, skipped)
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
