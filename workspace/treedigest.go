package workspace

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Tree digests for receipts and sealed attempts (DESIGN §13): the capsule tree digest
// (Manifest.Digest) of a tree's ordinary files, computed without writing a capsule. TreeDigest
// reads a whole directory the way Pack would (so it equals Pack's TreeDigest); WorktreeDigest
// reads the files git would commit in a worktree (tracked plus untracked-not-ignored, from the
// disk); GitTreeDigest reads a commit's tree from git's objects. The last two agree for a
// worktree whose changes are committed: they list the same files, and directories are those the
// files imply. Symlinks and submodules are not ordinary files and are left out of all three.

// TreeDigest returns the capsule tree digest of the directory dir (.git and everything Pack
// skips left out), hashing files on several goroutines.
func TreeDigest(ctx context.Context, dir string) (string, error) {
	entries, _, err := scanTree(ctx, dir)
	if err != nil {
		return "", fmt.Errorf("tree digest: %w", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return "", fmt.Errorf("tree digest: %w", err)
	}
	defer root.Close()
	man := Manifest{Entries: make([]ManifestEntry, len(entries))}
	skip := make([]bool, len(entries))
	err = parallelEach(ctx, len(entries), func(i int, buf []byte) error {
		e := entries[i]
		if e.dir {
			man.Entries[i] = ManifestEntry{Path: e.rel, Type: TypeDir, Mode: 0o755}
			return nil
		}
		f, size, err := openScanned(root, e)
		if err == errChanged || os.IsNotExist(err) {
			skip[i] = true // Pack leaves a file that changed under it out too
			return nil
		}
		if err != nil {
			return fmt.Errorf("%q: %w", e.rel, err)
		}
		defer f.Close()
		sum, n, err := hashReader(io.LimitReader(f, size), buf)
		if err != nil {
			return fmt.Errorf("%q: %w", e.rel, err)
		}
		man.Entries[i] = ManifestEntry{Path: e.rel, Type: TypeFile, Size: n, Mode: normMode(e.perm, false), SHA256: sum}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("tree digest: %w", err)
	}
	kept := man.Entries[:0]
	for i, e := range man.Entries {
		if !skip[i] {
			kept = append(kept, e)
		}
	}
	man.Entries = kept
	return man.Digest(), nil
}

// WorktreeDigest returns the tree digest of what `git add -A` would commit in the worktree of
// workspace ref: tracked and untracked-but-not-ignored regular files, read from the disk, with the
// directories they imply. Right after finalize's commit it equals GitTreeDigest of the branch.
// git lists the files in Berth's git jail (it reads the run's .gitignore and index); the files
// are read here through an os.Root, never through a symlink.
func (m *Manager) WorktreeDigest(ctx context.Context, ref string) (string, error) {
	j, err := m.stateJail(ctx, ref)
	if err != nil {
		return "", fmt.Errorf("worktree digest: %w", err)
	}
	j.env["GIT_OPTIONAL_LOCKS"] = "0"
	j.script = `exec git ls-files -z --cached --others --exclude-standard --deduplicate`
	raw, err := m.runJailedGit(ctx, j)
	if err != nil {
		return "", fmt.Errorf("worktree digest: %w", err)
	}
	out, root := string(raw), j.workspace
	var files []string
	for _, p := range strings.Split(out, "\x00") {
		if p != "" {
			files = append(files, p)
		}
	}
	sort.Strings(files)
	r, err := os.OpenRoot(root)
	if err != nil {
		return "", fmt.Errorf("worktree digest: %w", err)
	}
	defer r.Close()
	ents := make([]ManifestEntry, len(files))
	err = parallelEach(ctx, len(files), func(i int, buf []byte) error {
		lfi, err := r.Lstat(files[i])
		if err != nil || !lfi.Mode().IsRegular() {
			return nil // deleted but still in the index, a symlink, a submodule: not an ordinary file
		}
		f, err := r.OpenFile(files[i], os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
		if err != nil {
			return nil
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil || !os.SameFile(fi, lfi) {
			return nil // replaced while being read
		}
		sum, n, err := hashReader(f, buf)
		if err != nil {
			return fmt.Errorf("%q: %w", files[i], err)
		}
		ents[i] = ManifestEntry{Path: files[i], Type: TypeFile, Size: n,
			Mode: normMode(uint32(fi.Sys().(*syscall.Stat_t).Mode), false), SHA256: sum}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("worktree digest: %w", err)
	}
	return withImpliedDirs(ents).Digest(), nil
}

// GitTreeDigest returns the tree digest of the commit rev in the git dir gitDir (never found
// from a work tree): its regular files (modes 100644/100755) read from git's objects, with the
// directories they imply.
func (m *Manager) GitTreeDigest(ctx context.Context, gitDir, rev string) (string, error) {
	if d, ok := m.digests.get(rev); ok && isCommitID(rev) {
		return d, nil
	}
	d, err := m.gitTreeDigest(ctx, gitCall{}, []string{"--git-dir=" + gitDir}, rev)
	if err != nil {
		return "", fmt.Errorf("git tree digest of %.40s: %w", rev, err)
	}
	if isCommitID(rev) {
		m.digests.put(rev, d)
	}
	return d, nil
}

func (m *Manager) gitTreeDigest(ctx context.Context, c gitCall, pre []string, rev string) (string, error) {
	if strings.HasPrefix(rev, "-") {
		return "", ErrBadBranch
	}
	list, err := m.git.run(ctx, c, append(pre, "ls-tree", "-r", "-z", "--full-tree", "--end-of-options", rev+"^{tree}")...)
	if err != nil {
		return "", err
	}
	var ents []ManifestEntry
	var ids []string
	for _, rec := range strings.Split(list, "\x00") {
		meta, p, ok := strings.Cut(rec, "\t")
		f := strings.Fields(meta)
		if !ok || len(f) != 3 || f[1] != "blob" || (f[0] != "100644" && f[0] != "100755") || !capsuleNameOK(p) {
			continue // symlinks, submodules, names a capsule cannot hold
		}
		mode := uint32(0o644)
		if f[0] == "100755" {
			mode = 0o755
		}
		ents = append(ents, ManifestEntry{Path: p, Type: TypeFile, Mode: mode})
		ids = append(ids, f[2])
	}
	if len(ids) > 0 {
		err := m.git.stream(ctx, c, strings.NewReader(strings.Join(ids, "\n")+"\n"), func(r io.Reader) error {
			br := bufio.NewReaderSize(r, 256<<10)
			buf := make([]byte, 256<<10)
			for i := range ents {
				hdr, err := br.ReadString('\n')
				if err != nil {
					return fmt.Errorf("cat-file: %w", err)
				}
				var id, typ string
				var size int64
				if _, err := fmt.Sscanf(hdr, "%s %s %d", &id, &typ, &size); err != nil || typ != "blob" || id != ids[i] {
					return fmt.Errorf("cat-file: unexpected header %q", strings.TrimSpace(hdr))
				}
				sum, n, err := hashReader(io.LimitReader(br, size), buf)
				if err != nil || n != size {
					return fmt.Errorf("cat-file: short blob %s", id)
				}
				if _, err := br.Discard(1); err != nil { // the newline after each object
					return fmt.Errorf("cat-file: %w", err)
				}
				ents[i].Size, ents[i].SHA256 = size, sum
			}
			return nil
		}, append(pre, "cat-file", "--batch")...)
		if err != nil {
			return "", err
		}
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Path < ents[j].Path })
	return withImpliedDirs(ents).Digest(), nil
}

// withImpliedDirs turns sorted file entries (zero entries are dropped) into a canonical manifest
// that lists every parent directory before its children.
func withImpliedDirs(files []ManifestEntry) Manifest {
	seen := map[string]bool{}
	var all []ManifestEntry
	for _, e := range files {
		if e.Path == "" {
			continue
		}
		for d := path.Dir(e.Path); d != "." && !seen[d]; d = path.Dir(d) {
			seen[d] = true
			all = append(all, ManifestEntry{Path: d, Type: TypeDir, Mode: 0o755})
		}
		all = append(all, e)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Path < all[j].Path })
	return Manifest{Entries: all}
}

// hashReader returns the hex SHA-256 of what r yields and its length.
func hashReader(r io.Reader, buf []byte) (string, int64, error) {
	h := sha256.New()
	n, err := io.CopyBuffer(h, r, buf)
	if err != nil {
		return "", n, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// parallelEach calls fn(i, buf) for i in [0, n) on a few goroutines (each with its own buffer)
// and returns the first error; it stops early when ctx ends.
func parallelEach(ctx context.Context, n int, fn func(i int, buf []byte) error) error {
	workers := min(max(2, 2*runtime.GOMAXPROCS(0)), 8, max(n, 1))
	var (
		mu    sync.Mutex
		next  int
		first error
		wg    sync.WaitGroup
	)
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if first != nil || next >= n {
			return 0, false
		}
		if err := ctx.Err(); err != nil {
			first = err
			return 0, false
		}
		next++
		return next - 1, true
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 128<<10)
			for i, ok := take(); ok; i, ok = take() {
				if err := fn(i, buf); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// CapsuleTreeDigest reads a capsule's tar stream (as Pack writes it) and returns the tree
// digest of what it holds, so a stored artifact can be checked against a receipt.
func CapsuleTreeDigest(ctx context.Context, r io.Reader) (string, error) {
	tr := tar.NewReader(r)
	var man Manifest
	buf := make([]byte, 256<<10)
	for {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", fmt.Errorf("capsule tree digest: %w", err)
		}
		name := strings.TrimSuffix(hdr.Name, "/")
		switch hdr.Typeflag {
		case tar.TypeDir:
			man.Entries = append(man.Entries, ManifestEntry{Path: name, Type: TypeDir, Mode: 0o755})
		case tar.TypeReg:
			sum, n, err := hashReader(tr, buf)
			if err != nil {
				return "", fmt.Errorf("capsule tree digest: %w", err)
			}
			man.Entries = append(man.Entries, ManifestEntry{Path: name, Type: TypeFile, Size: n,
				Mode: normMode(uint32(hdr.Mode), false), SHA256: sum})
		default:
			return "", fmt.Errorf("capsule tree digest: entry %.200q of type %q: %w", name, hdr.Typeflag, ErrCapsule)
		}
	}
	sort.Slice(man.Entries, func(i, j int) bool { return man.Entries[i].Path < man.Entries[j].Path })
	return man.Digest(), nil
}
