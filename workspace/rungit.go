package workspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"berth/environment/jail"
)

// A jailed run may commit on its task branch and nowhere else, and it never writes the source
// repository (docs/security.md, "Git inside the jail"). Everything git writes for a worktree
// workspace goes to a private store kept beside it, <data dir>/run-git/<ref>:
//
//	admin/        the worktree's working admin dir (HEAD, index, logs): bound over the admin dir
//	              Berth recorded when it made the worktree (<common>/worktrees/<id>)
//	repo/objects/ the run's objects, with the source's objects as alternates
//	repo/<refs>/  the directory of the task branch's ref, bound over the same one of the common dir
//	logs/         bound over the branch's reflog directory, so nothing is appended to the source's
//	repo/config, repo/HEAD, base, out/
//	              Berth's own: never bound into a run (base is the branch tip at the last sync; out/
//	              takes the packs Berth's own git jails make)
//
// The rest of the common dir is read-only in the jail. What comes home is objects, never files:
// Berth's git jail packs the branch's new commits (pack-objects), the host imports the pack into
// the source (index-pack --strict, a connectivity check) and moves the task branch only if it
// still points where it did at the last sync. No host-side git ever reads the store's admin dir,
// refs or objects, and no `.git` in the workspace ever names what Berth reads, copies or binds.

// runGitDir is the private store of a workspace's jailed runs.
func (m *Manager) runGitDir(ref string) string { return filepath.Join(m.runGit, ref) }

// gitStore is one workspace's private store.
type gitStore struct {
	dir    string
	branch string
	rec    record
}

func (m *Manager) store(rec record) gitStore {
	return gitStore{dir: m.runGitDir(rec.Ref), branch: rec.Branch, rec: rec}
}

func (s gitStore) admin() string   { return filepath.Join(s.dir, "admin") }
func (s gitStore) repo() string    { return filepath.Join(s.dir, "repo") }
func (s gitStore) objects() string { return filepath.Join(s.dir, "repo", "objects") }
func (s gitStore) out() string     { return filepath.Join(s.dir, "out") }
func (s gitStore) branchRef() string {
	return "refs/heads/" + s.branch
}

// refDir is the directory of the task branch's ref: refs/heads, or refs/heads/berth for
// berth/KEY.
func (s gitStore) refDir() string { return filepath.Dir(s.branchRef()) }

// RunGit prepares the private git store of a worktree workspace for one jailed command and says
// what the jail must bind and set. Commits a previous command left there (a crash before
// BringHome) are brought home first. For a shared workspace it is its .git, read-only: a run
// there edits files, never the repository's config, hooks or refs. Other workspaces need nothing.
func (m *Manager) RunGit(ctx context.Context, ref string) (jail.GitAccess, error) {
	acc, err := m.runGitAccess(ctx, ref)
	if err != nil {
		return jail.GitAccess{}, fmt.Errorf("run git: %w", err)
	}
	return acc, nil
}

func (m *Manager) runGitAccess(ctx context.Context, ref string) (jail.GitAccess, error) {
	rec, err := m.owned(ref)
	if err != nil {
		return jail.GitAccess{}, err
	}
	if rec.Strategy == StrategyShared {
		if _, err := os.Lstat(filepath.Join(rec.SharedRoot, ".git")); err == nil {
			return jail.GitAccess{ReadOnly: []jail.Bind{{Src: filepath.Join(rec.SharedRoot, ".git")}}}, nil
		}
		return jail.GitAccess{}, nil
	}
	if rec.Strategy != StrategyGitWorktree || rec.GitDir == "" || rec.Branch == "" {
		return jail.GitAccess{}, nil
	}
	if rec, err = m.ensureStore(ctx, rec); err != nil {
		return jail.GitAccess{}, err
	}
	if err := m.bringHome(ctx, rec); err != nil {
		return jail.GitAccess{}, err
	}
	if err := m.restoreGitFile(rec); err != nil {
		return jail.GitAccess{}, err
	}
	s := m.store(rec)
	return jail.GitAccess{Store: s.dir, ReadOnly: []jail.Bind{{Src: rec.GitDir}}, ReadWrite: s.binds(false),
		Env: map[string]string{
			"GIT_OBJECT_DIRECTORY": s.objects(),
			// Command-line scope: git honours safe.directory here for a tree another uid owns.
			"GIT_CONFIG_COUNT": "3",
			"GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*",
			"GIT_CONFIG_KEY_1": "core.logAllRefUpdates", "GIT_CONFIG_VALUE_1": "false",
			"GIT_CONFIG_KEY_2": "gc.auto", "GIT_CONFIG_VALUE_2": "0",
		}}, nil
}

// binds are the store's read-write binds in a jail; withOut adds out/ (Berth's own git jails).
func (s gitStore) binds(withOut bool) []jail.Bind {
	b := []jail.Bind{{Src: s.admin(), Dst: s.rec.AdminDir},
		{Src: filepath.Join(s.repo(), s.refDir()), Dst: filepath.Join(s.rec.GitDir, s.refDir())},
		{Src: s.objects()}}
	if fi, err := os.Stat(filepath.Join(s.rec.GitDir, "logs", s.refDir())); err == nil && fi.IsDir() {
		b = append(b, jail.Bind{Src: filepath.Join(s.dir, "logs"), Dst: filepath.Join(s.rec.GitDir, "logs", s.refDir())})
	}
	if withOut {
		b = append(b, jail.Bind{Src: s.out()})
	}
	return b
}

// ensureStore makes the store of a worktree workspace when it has none (a new worktree, or one
// made before the store was persistent), from the admin dir Berth recorded and the branch's tip.
func (m *Manager) ensureStore(ctx context.Context, rec record) (record, error) {
	rec, err := m.ensureAdminDir(ctx, rec)
	if err != nil {
		return rec, err
	}
	s := m.store(rec)
	if _, err := os.Lstat(filepath.Join(s.dir, "base")); err == nil {
		return rec, nil
	}
	tip, ok, err := m.revParse(ctx, rec.GitDir, s.branchRef())
	if err != nil {
		return rec, err
	}
	if !ok {
		return rec, fmt.Errorf("task branch %s is gone: %w", rec.Branch, ErrGit)
	}
	return rec, m.initStore(rec, tip, true)
}

// initStore (re)creates the store with the branch at tip: its skeleton, then its admin dir.
func (m *Manager) initStore(rec record, tip string, copyAdmin bool) error {
	if err := m.storeSkeleton(rec, tip); err != nil {
		return err
	}
	return m.storeAdmin(rec, copyAdmin)
}

// storeSkeleton (re)creates the store's directories and its own files with the branch at tip:
// everything but the admin dir's files, and nothing in the source.
func (m *Manager) storeSkeleton(rec record, tip string) error {
	s := m.store(rec)
	if err := os.RemoveAll(s.dir); err != nil {
		return err
	}
	for _, d := range []string{s.admin(), filepath.Join(s.objects(), "info"), filepath.Join(s.repo(), s.refDir()), s.out(),
		filepath.Join(s.dir, "logs")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	files := map[string]string{
		filepath.Join(s.repo(), "HEAD"):                  "ref: " + s.branchRef() + "\n",
		filepath.Join(s.repo(), "config"):                "[core]\n\trepositoryformatversion = 0\n\tbare = true\n",
		filepath.Join(s.objects(), "info", "alternates"): filepath.Join(rec.GitDir, "objects") + "\n",
		filepath.Join(s.repo(), s.branchRef()):           tip + "\n",
		filepath.Join(s.dir, "base"):                     tip + "\n",
	}
	for p, body := range files {
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// storeAdmin fills the store's admin dir, made by storeSkeleton: copyAdmin takes HEAD, index and
// the rest of the admin dir's top files from the recorded admin dir (Berth's own, in the source's
// common dir, which no run can write), else only commondir and gitdir; HEAD then names the task
// branch. The directory the private refs are bound over is made in the common dir too.
func (m *Manager) storeAdmin(rec record, copyAdmin bool) error {
	s := m.store(rec)
	if copyAdmin {
		if err := copyTopFiles(rec.AdminDir, s.admin()); err != nil {
			return err
		}
	} else {
		for _, name := range []string{"commondir", "gitdir"} {
			if err := copyFileNoFollow(filepath.Join(rec.AdminDir, name), filepath.Join(s.admin(), name)); err != nil {
				return err
			}
		}
	}
	if err := os.WriteFile(filepath.Join(s.admin(), "HEAD"), []byte("ref: "+s.branchRef()+"\n"), 0o600); err != nil {
		return err
	}
	// The directory the private refs are bound over must exist in the common dir (a packed task
	// branch leaves none); an empty ref directory changes nothing for git.
	return os.MkdirAll(filepath.Join(rec.GitDir, s.refDir()), 0o755)
}

// BringHome moves the task branch of a worktree workspace to where its last jailed command left
// it: the run's new commits are packed in Berth's git jail and imported into the source, and the
// branch is updated only if it still points where it did at the last sync. Nothing to do when the
// command made no commit, or for other workspaces.
func (m *Manager) BringHome(ctx context.Context, ref string) error {
	rec, err := m.owned(ref)
	if err != nil {
		return fmt.Errorf("bring home: %w", err)
	}
	if rec.Strategy != StrategyGitWorktree || rec.GitDir == "" || rec.Branch == "" {
		return nil
	}
	if rec, err = m.ensureStore(ctx, rec); err != nil {
		return fmt.Errorf("bring home: %w", err)
	}
	if err := m.bringHome(ctx, rec); err != nil {
		return fmt.Errorf("bring home: %w", err)
	}
	return nil
}

// bringHome packs the private branch's commits since the last sync (a jailed script) and
// imports them (importPack).
func (m *Manager) bringHome(ctx context.Context, rec record) error {
	s := m.store(rec)
	base, err := s.base()
	if errors.Is(err, fs.ErrNotExist) {
		return nil // no store yet: nothing ran
	}
	if err != nil {
		return err
	}
	if s.branchUnmoved(base) {
		return nil // the common case: no jail needed to see that nothing is to be brought home
	}
	out, err := m.runJailedGit(ctx, m.storeJail(rec, s, true, nil, `set -e
tip=$(git rev-parse --verify -q "$BERTH_BRANCH_REF^{commit}") || tip=
echo "tip $tip"
if [ -n "$tip" ] && [ "$tip" != "$BERTH_BASE" ]; then
  printf '%s\n^%s\n' "$tip" "$BERTH_BASE" | git pack-objects --revs --thin --stdout -q > "$BERTH_OUT/home.pack"
fi`, map[string]string{"BERTH_BASE": base}))
	if err != nil {
		return err
	}
	tip := scriptValue(out, "tip")
	if tip == "" || tip == base {
		return nil // the run made no commit, or deleted its branch: nothing to bring
	}
	if !isHexID(tip) {
		return fmt.Errorf("the run left a malformed task branch: %w", ErrGit)
	}
	if err := m.importPack(ctx, rec, s, "home.pack", tip, base); err != nil {
		return err
	}
	if err := m.moveHome(ctx, rec, s, tip, base, "berth: run commits"); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(s.dir, "base"), []byte(tip+"\n"), 0o600)
}

// moveHome moves the task branch in the source from base to tip, compare-and-swap. Without a jail
// (gitjail.go) Berth's git scripts ran on the source itself and git moved the branch under its
// own lock already; the source must then be at tip.
func (m *Manager) moveHome(ctx context.Context, rec record, s gitStore, tip, base, msg string) error {
	if m.jail == nil {
		if cur, err := m.git.run(ctx, gitCall{}, "--git-dir="+rec.GitDir, "rev-parse", "--verify", "-q", "--end-of-options", s.branchRef()); err == nil && strings.TrimSpace(cur) == tip {
			return nil
		}
	}
	_, err := m.git.run(ctx, gitCall{}, "--git-dir="+rec.GitDir, "update-ref", "-m", msg, s.branchRef(), tip, base)
	return err
}

// storeJail is a jailed git script over the worktree with the store bound as a run sees it, plus
// out/, and git pointed at the recorded admin dir.
func (m *Manager) storeJail(rec record, s gitStore, readOnly bool, author *Identity, script string, extra map[string]string) jailedGit {
	id := m.git.author
	if author != nil && *author != (Identity{}) {
		id = *author
	}
	env := gitJailEnv(id)
	env["GIT_DIR"] = rec.AdminDir
	env["GIT_WORK_TREE"] = filepath.Join(m.base, rec.Ref)
	env["GIT_OBJECT_DIRECTORY"] = s.objects()
	env["BERTH_BRANCH_REF"] = s.branchRef()
	env["BERTH_OUT"] = s.out()
	for k, v := range extra {
		env[k] = v
	}
	return jailedGit{workspace: filepath.Join(m.base, rec.Ref), readOnly: readOnly, ro: []jail.Bind{{Src: rec.GitDir}},
		rw: s.binds(true), env: env, owned: []string{s.dir}, script: script}
}

// importPack imports out/name (a pack a jailed script made) into the source: index-pack checks
// every object (--strict: fsck, .gitmodules included) and completes a thin pack from the source's
// own objects; then every object tip reaches beyond base must be there. The pack is read as a
// regular file in Berth's store, never through a symlink.
func (m *Manager) importPack(ctx context.Context, rec record, s gitStore, name, tip, base string) error {
	root, err := os.OpenRoot(s.out())
	if err != nil {
		return err
	}
	defer root.Close()
	f, err := root.OpenFile(name, os.O_RDONLY|noFollow, 0)
	if errors.Is(err, fs.ErrNotExist) {
		f = nil // no new objects (the branch moved back to an older commit)
	} else if err != nil {
		return fmt.Errorf("the pack of the run's commits: %w", err)
	}
	if f != nil {
		defer root.Remove(name) //nolint:errcheck // a leftover pack is replaced next time
		defer f.Close()
		if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
			return fmt.Errorf("the pack of the run's commits is not a regular file: %w", ErrGit)
		}
		if fi, _ := f.Stat(); fi.Size() > 0 {
			if _, err := m.git.run(ctx, gitCall{stdin: f}, "--git-dir="+rec.GitDir, "index-pack", "--stdin", "--fix-thin", "--strict"); err != nil {
				return err
			}
		}
	}
	// Connectivity: the new history is complete in the source (what fetch checks after a pack).
	if _, err := m.git.run(ctx, gitCall{}, "--git-dir="+rec.GitDir, "rev-list", "--objects", "--quiet", tip, "--not", base); err != nil {
		return fmt.Errorf("the run's commits are incomplete: %w", err)
	}
	return nil
}

// branchUnmoved reports whether the private branch's ref file still holds base, or is gone (the
// run deleted its branch). It reads the file as data, never through a symlink; anything else (a
// new commit, a symbolic ref, a packed or unreadable ref) is for git in the jail to resolve.
func (s gitStore) branchUnmoved(base string) bool {
	root, err := os.OpenRoot(s.repo())
	if err != nil {
		return false
	}
	defer root.Close()
	f, err := root.OpenFile(s.branchRef(), os.O_RDONLY|noFollow|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	if err != nil {
		return false
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 128))
	return err == nil && strings.TrimSpace(string(b)) == base
}

// base is the branch tip at the store's last sync.
func (s gitStore) base() (string, error) {
	b, err := readFileNoFollow(filepath.Join(s.dir, "base"), 256)
	if err != nil {
		return "", err
	}
	v := strings.TrimSpace(string(b))
	if !isHexID(v) {
		return "", fmt.Errorf("store base %q: %w", v, ErrGit)
	}
	return v, nil
}

// ensureAdminDir fills in the worktree's admin dir for a record made before Berth recorded it:
// the entry of the common dir's worktrees/ whose gitdir file names this root. It never reads the
// workspace's own .git.
func (m *Manager) ensureAdminDir(ctx context.Context, rec record) (record, error) {
	if rec.AdminDir != "" {
		return rec, nil
	}
	admin, err := m.findAdminDir(rec.GitDir, filepath.Join(m.base, rec.Ref))
	if err != nil {
		return rec, err
	}
	rec.AdminDir = admin
	if err := m.writeRecord(rec); err != nil {
		return rec, err
	}
	return rec, nil
}

// findAdminDir is the entry of gitDir's worktrees/ registered for root.
func (m *Manager) findAdminDir(gitDir, root string) (string, error) {
	dir := filepath.Join(gitDir, "worktrees")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("worktree admin dir: %w", err)
	}
	want := filepath.Join(root, ".git")
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		b, err := readFileNoFollow(filepath.Join(dir, e.Name(), "gitdir"), 4096)
		if err == nil && filepath.Clean(strings.TrimSpace(string(b))) == want {
			return filepath.Join(dir, e.Name()), nil
		}
	}
	return "", fmt.Errorf("no worktree of %s is registered for this workspace: %w", filepath.Base(gitDir), ErrGit)
}

// restoreGitFile puts back the worktree's .git file as git wrote it ("gitdir: <admin dir>"), if
// the run replaced it: by a file, a symlink or a directory, which is removed without following
// anything. Only the next run's own git sees it; Berth never reads it.
func (m *Manager) restoreGitFile(rec record) error {
	want := "gitdir: " + rec.AdminDir + "\n"
	root, err := os.OpenRoot(filepath.Join(m.base, rec.Ref))
	if err != nil {
		return err
	}
	defer root.Close()
	if fi, err := root.Lstat(".git"); err == nil && fi.Mode().IsRegular() {
		if f, err := root.OpenFile(".git", os.O_RDONLY|noFollow, 0); err == nil {
			b, _ := io.ReadAll(io.LimitReader(f, 4096))
			f.Close()
			if string(b) == want {
				return nil
			}
		}
	}
	if err := root.RemoveAll(".git"); err != nil {
		return err
	}
	f, err := root.OpenFile(".git", os.O_WRONLY|os.O_CREATE|os.O_EXCL|noFollow, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(want)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// copyTopFiles copies the regular files directly in src (a worktree admin dir: HEAD, index,
// commondir, gitdir, ORIG_HEAD) into dst, never through a symlink.
func copyTopFiles(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || strings.HasSuffix(e.Name(), ".lock") {
			continue
		}
		if err := copyFileNoFollow(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// copyFileNoFollow copies one small regular file without following a symlink at either end.
func copyFileNoFollow(src, dst string) error {
	b, err := readFileNoFollow(src, 256<<20)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|noFollow, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, bytes.NewReader(b))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func isHexID(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
