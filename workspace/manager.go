package workspace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"berth/environment/jail"
)

// Strategy names how a workspace root was realized; the values are the ones stored in the ledger.
type Strategy string

// The realization strategies.
const (
	// StrategyGitWorktree is a git worktree on a task branch.
	StrategyGitWorktree Strategy = "git_worktree"
	// StrategyCopy is a filtered copy of a directory (or an imported capsule).
	StrategyCopy Strategy = "copy"
	// StrategyShared is no copy at all: the project workspace root itself, never deleted by Berth.
	StrategyShared Strategy = "shared"
)

// Options configures a Manager; the zero value is usable.
type Options struct {
	// Author signs the commits Berth makes (finalize, rescue); zero means DefaultIdentity.
	Author Identity
	// CopyMaxBytes and CopyMaxFiles bound a copy realization's source (regular files and their
	// total size); zero means DefaultCopyMaxBytes and DefaultCopyMaxFiles.
	CopyMaxBytes int64
	CopyMaxFiles int
	// Jail is this host's jail (jail.Detect): Berth's own git commands that interpret what a run
	// wrote run in its git profile (gitjail.go). Nil runs them on the host, which is only right
	// where no jail exists (then only uncontained environments run at all).
	Jail *jail.Host
}

// Manager owns the managed base <data dir>/workspaces (mode 0700) and every root it creates there.
// It keeps an ownership record beside each root (outside it, so nothing running inside a workspace
// can forge or delete it) and never adopts or deletes a directory it did not create. Holders taken
// with Acquire are in-process only: they protect against this process destroying a root it is still
// using, not against other processes (cross-process exclusion is the caller's lease).
type Manager struct {
	dataDir string
	base    string // real path of <data dir>/workspaces
	cache   string // <data dir>/git-cache
	runGit  string // <data dir>/run-git: jailed runs' private git stores (rungit.go)
	git     gitRunner
	jail    *jail.Host // nil: Berth's git scripts run on the host (gitjail.go)
	// copyQuota bounds copy realizations (copy.go).
	copyQuota copyQuota
	// digests memoizes the tree digests of commit ids (treedigest_cache.go).
	digests digestCache

	mu       sync.Mutex
	holders  map[string]int
	closing  map[string]bool
	srcLocks map[string]*sync.Mutex
}

// record is the ownership marker written atomically to <base>/<ref>.record.
type record struct {
	Ref        string    `json:"ref"`
	Strategy   Strategy  `json:"strategy"`
	CreatedAt  time.Time `json:"created_at"`
	Dev        uint64    `json:"dev,omitempty"`
	Ino        uint64    `json:"ino,omitempty"`
	Birth      int64     `json:"birth_ns,omitempty"` // creation time where the file system keeps one
	GitDir     string    `json:"git_dir,omitempty"`
	AdminDir   string    `json:"admin_dir,omitempty"` // the worktree's admin dir, recorded when git made it
	Branch     string    `json:"branch,omitempty"`
	SharedRoot string    `json:"shared_root,omitempty"`
}

const (
	recordSuffix   = ".record"
	manifestSuffix = ".manifest"
)

// NewManager prepares <dataDir>/workspaces, <dataDir>/git-cache and a private git HOME, all mode
// 0700, and returns a Manager over them. dataDir must be absolute.
func NewManager(dataDir string, opts Options) (*Manager, error) {
	if !filepath.IsAbs(dataDir) {
		return nil, fmt.Errorf("new manager: data dir must be absolute: %w", ErrUnsafePath)
	}
	dirs := map[string]string{}
	for _, name := range []string{"workspaces", "git-cache", "git-home", "run-git"} {
		p := filepath.Join(dataDir, name)
		if err := ensurePrivateDir(p); err != nil {
			return nil, fmt.Errorf("new manager: %w", err)
		}
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return nil, fmt.Errorf("new manager: %w", err)
		}
		dirs[name] = real
	}
	realData, err := filepath.EvalSymlinks(dataDir)
	if err != nil {
		return nil, fmt.Errorf("new manager: %w", err)
	}
	return &Manager{
		dataDir:   realData,
		base:      dirs["workspaces"],
		cache:     dirs["git-cache"],
		runGit:    dirs["run-git"],
		git:       newGitRunner(dirs["git-home"], opts.Author),
		jail:      opts.Jail,
		copyQuota: newCopyQuota(opts.CopyMaxBytes, opts.CopyMaxFiles),
		holders:   map[string]int{},
		closing:   map[string]bool{},
		srcLocks:  map[string]*sync.Mutex{},
	}, nil
}

// ensurePrivateDir creates dir with mode 0700 (parents too) and tightens an existing one to 0700; it
// refuses a symlink or a non-directory in its place.
func ensurePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory: %w", filepath.Base(dir), ErrUnsafePath)
	}
	if fi.Mode().Perm() != 0o700 {
		return os.Chmod(dir, 0o700)
	}
	return nil
}

// Base returns the absolute path of the managed base; Result.Cwd values are relative to it.
func (m *Manager) Base() string { return m.base }

// Root returns the absolute directory of a workspace: the managed root, or for a shared workspace the
// project directory it points at. It fails with ErrNotManaged for refs without a valid record.
func (m *Manager) Root(ref string) (string, error) {
	rec, err := m.owned(ref)
	if err != nil {
		return "", fmt.Errorf("workspace root: %w", err)
	}
	if rec.Strategy == StrategyShared {
		return rec.SharedRoot, nil
	}
	return filepath.Join(m.base, ref), nil
}

// Acquire registers an in-process holder of ref; until release is called, Destroy refuses the ref
// with ErrBusy. release is idempotent. Acquire fails with ErrNotManaged for unknown refs and with
// ErrBusy while the ref is being destroyed.
func (m *Manager) Acquire(ref string) (release func(), err error) {
	if !ValidRef(ref) {
		return nil, fmt.Errorf("acquire: %w", ErrBadRef)
	}
	// Register first, verify second: a Destroy that starts after the registration sees the holder,
	// and one that finished before it makes the ownership check fail.
	m.mu.Lock()
	if m.closing[ref] {
		m.mu.Unlock()
		return nil, fmt.Errorf("acquire %s: %w", ref, ErrBusy)
	}
	m.holders[ref]++
	m.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			if m.holders[ref]--; m.holders[ref] <= 0 {
				delete(m.holders, ref)
			}
		})
	}
	if _, err := m.owned(ref); err != nil {
		release()
		return nil, fmt.Errorf("acquire: %w", err)
	}
	return release, nil
}

// beginExclusive marks ref as closing so that no holder can be taken; it fails with ErrBusy when a
// holder exists or another exclusive operation runs.
func (m *Manager) beginExclusive(ref string) (end func(), err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.holders[ref] > 0 || m.closing[ref] {
		return nil, ErrBusy
	}
	m.closing[ref] = true
	return func() {
		m.mu.Lock()
		delete(m.closing, ref)
		m.mu.Unlock()
	}, nil
}

// Destroy removes a managed root: for a git worktree it first unregisters the worktree from its
// repository (the task branch is kept), then deletes the directory, then the record. It refuses refs
// with a live holder (ErrBusy), refs it does not own, roots replaced since creation and shared
// workspaces (ErrNotManaged). It is safe to retry: a record whose directory is already gone is
// cleaned up.
func (m *Manager) Destroy(ctx context.Context, ref string) error {
	if !ValidRef(ref) {
		return fmt.Errorf("destroy: %w", ErrBadRef)
	}
	end, err := m.beginExclusive(ref)
	if err != nil {
		return fmt.Errorf("destroy %s: %w", ref, err)
	}
	defer end()
	// The jailed runs' git store goes first: close waits for finalize, which brought its commits home.
	if err := os.RemoveAll(m.runGitDir(ref)); err != nil {
		return fmt.Errorf("destroy %s: %w", ref, err)
	}
	rec, err := m.owned(ref)
	if err != nil {
		// A record whose directory is entirely gone (an interrupted Destroy, or a hand deletion) is
		// finished off: only bookkeeping remains, nothing on disk is adopted. A replaced directory
		// stays refused.
		stale, rerr := m.readRecord(ref)
		if _, lerr := os.Lstat(filepath.Join(m.base, ref)); rerr != nil || stale.Strategy == StrategyShared || !errors.Is(lerr, fs.ErrNotExist) {
			return fmt.Errorf("destroy: %w", err)
		}
		rec = stale
	}
	if rec.Strategy == StrategyShared {
		return fmt.Errorf("destroy %s: shared workspace: %w", ref, ErrNotManaged)
	}
	if err := m.removeRoot(ctx, rec); err != nil {
		return fmt.Errorf("destroy %s: %w", ref, err)
	}
	return nil
}

// Forget drops the record of a shared workspace; it never touches the project directory and refuses
// managed roots (use Destroy) with ErrNotManaged and held refs with ErrBusy.
func (m *Manager) Forget(ref string) error {
	if !ValidRef(ref) {
		return fmt.Errorf("forget: %w", ErrBadRef)
	}
	end, err := m.beginExclusive(ref)
	if err != nil {
		return fmt.Errorf("forget %s: %w", ref, err)
	}
	defer end()
	rec, err := m.owned(ref)
	if err != nil {
		return fmt.Errorf("forget: %w", err)
	}
	if rec.Strategy != StrategyShared {
		return fmt.Errorf("forget %s: managed root, use Destroy: %w", ref, ErrNotManaged)
	}
	if err := os.Remove(m.recordPath(ref)); err != nil {
		return fmt.Errorf("forget %s: %w", ref, err)
	}
	return syncDir(m.base)
}

// removeRoot deletes the root, then unregisters a worktree, then deletes its bookkeeping files.
// git's own `worktree remove` is not used: it reads the workspace's .git and walks the tree by
// path; the tree is deleted here without following anything, and the admin dir is the one Berth
// recorded.
func (m *Manager) removeRoot(ctx context.Context, rec record) error {
	return m.removeRootLocking(ctx, rec, true)
}

// removeRootLocking is removeRoot; lock false is for callers that already hold the source lock.
func (m *Manager) removeRootLocking(ctx context.Context, rec record, lock bool) error {
	root := filepath.Join(m.base, rec.Ref)
	if err := removeTree(root); err != nil {
		return err
	}
	if err := os.RemoveAll(m.runGitDir(rec.Ref)); err != nil {
		return err
	}
	if rec.GitDir != "" {
		if lock {
			l := m.sourceLock(rec.GitDir)
			l.Lock()
			defer l.Unlock()
		}
		if rec.AdminDir == "" {
			rec.AdminDir, _ = m.findAdminDir(rec.GitDir, root)
		}
		if rec.AdminDir != "" && filepath.Dir(rec.AdminDir) == filepath.Join(rec.GitDir, "worktrees") {
			if err := os.RemoveAll(rec.AdminDir); err != nil {
				return err
			}
		}
		if _, err := os.Stat(rec.GitDir); err == nil {
			_, _ = m.git.run(ctx, gitCall{}, "--git-dir="+rec.GitDir, "worktree", "prune")
		}
	}
	for _, p := range []string{m.recordPath(rec.Ref), m.manifestPath(rec.Ref)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return syncDir(m.base)
}

// removeTree deletes dir and everything below it without following symlinks (os.RemoveAll works
// on descriptors); when permissions block it (a run left read-only directories and Berth is not
// root), it makes the directories writable on descriptors too, and retries.
func removeTree(dir string) error {
	err := os.RemoveAll(dir)
	if err == nil {
		return nil
	}
	_ = jail.MakeRemovable(dir)
	return os.RemoveAll(dir)
}

// Listing describes one workspace ref known to the Manager.
type Listing struct {
	Ref      string   // the workspace ref
	Strategy Strategy // how it was realized
	// Missing is true when the record exists but its managed directory does not (or was replaced).
	Missing bool
}

func (m *Manager) recordPath(ref string) string   { return filepath.Join(m.base, ref+recordSuffix) }
func (m *Manager) manifestPath(ref string) string { return filepath.Join(m.base, ref+manifestSuffix) }

func (m *Manager) readRecord(ref string) (record, error) {
	var rec record
	b, err := readFileNoFollow(m.recordPath(ref), 1<<20)
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, err
	}
	if rec.Ref != ref {
		return rec, errors.New("record names another ref")
	}
	return rec, nil
}

// owned returns the record of ref if this Manager created it and, for managed roots, the directory
// is still the very one it created (same device, inode and birth time; not a symlink).
func (m *Manager) owned(ref string) (record, error) {
	if !ValidRef(ref) {
		return record{}, ErrBadRef
	}
	rec, err := m.readRecord(ref)
	if err != nil {
		return record{}, fmt.Errorf("%s: %w", ref, ErrNotManaged)
	}
	if rec.Strategy == StrategyShared {
		return rec, nil
	}
	id, err := dirIdentity(filepath.Join(m.base, ref))
	if err != nil {
		return record{}, fmt.Errorf("%s: directory missing or replaced: %w", ref, ErrNotManaged)
	}
	if id != (identity{rec.Dev, rec.Ino, rec.Birth}) {
		return record{}, fmt.Errorf("%s: directory replaced: %w", ref, ErrNotManaged)
	}
	return rec, nil
}

// identity tells one directory from another created later under the same name: device, inode and
// birth time (inode numbers are reused at once after a delete; birth times are not).
type identity struct {
	dev, ino uint64
	birth    int64
}

// dirIdentity returns the identity of a real directory at p, without following a symlink.
func dirIdentity(p string) (identity, error) {
	var stx unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE|unix.STATX_INO|unix.STATX_BTIME, &stx)
	if err != nil {
		return identity{}, err
	}
	if stx.Mode&unix.S_IFMT != unix.S_IFDIR {
		return identity{}, fmt.Errorf("not a directory: %w", ErrUnsafePath)
	}
	id := identity{dev: unix.Mkdev(stx.Dev_major, stx.Dev_minor), ino: stx.Ino}
	if stx.Mask&unix.STATX_BTIME != 0 {
		id.birth = stx.Btime.Sec*1e9 + int64(stx.Btime.Nsec)
	}
	return id, nil
}

// createRoot makes a new empty root under the base and records it; the ref is fresh from
// crypto/rand, never from input.
func (m *Manager) createRoot(rec record) (record, string, error) {
	for range 8 {
		ref := newRef()
		root := filepath.Join(m.base, ref)
		if err := os.Mkdir(root, 0o755); err != nil {
			if errors.Is(err, fs.ErrExist) {
				continue
			}
			return record{}, "", err
		}
		rec.Ref = ref
		rec.CreatedAt = time.Now().UTC()
		if err := m.stampAndWrite(&rec, root); err != nil {
			_ = os.Remove(root)
			return record{}, "", err
		}
		return rec, root, nil
	}
	return record{}, "", errors.New("could not allocate a fresh ref")
}

// stampAndWrite records the identity (device, inode, birth time) of root in rec and writes the record.
func (m *Manager) stampAndWrite(rec *record, root string) error {
	id, err := dirIdentity(root)
	if err != nil {
		return err
	}
	rec.Dev, rec.Ino, rec.Birth = id.dev, id.ino, id.birth
	return m.writeRecord(*rec)
}

func (m *Manager) writeRecord(rec record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return writeFileAtomic(m.base, m.recordPath(rec.Ref), b)
}

// sourceLock serializes operations on one git repository or cache inside this process.
func (m *Manager) sourceLock(key string) *sync.Mutex {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.srcLocks[key]
	if !ok {
		l = &sync.Mutex{}
		m.srcLocks[key] = l
	}
	return l
}
