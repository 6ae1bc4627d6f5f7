package workspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"berth/environment/jail"
)

// A jailed run may commit on its task branch and nowhere else, and it never writes the source
// repository (docs/security.md, "Git inside the jail"). Its git writes go to a private store per
// workspace, <data dir>/run-git/<ref>:
//
//	admin/  a copy of the worktree's admin dir (<common>/worktrees/<id>): HEAD, index, …
//	repo/   a bare repository: objects/ (the source's objects as alternates) and the task
//	        branch's ref, the only ref the run can move
//
// In the jail, admin/ is bound over the worktree's admin dir, repo/refs/heads/<branch dir> over
// the same directory of the common dir, and repo/objects is the run's GIT_OBJECT_DIRECTORY; the
// rest of the common dir is read-only. After the command, BringHome fetches the branch from
// repo/ into the source (git verifies every object it takes) and moves the task branch there,
// conditional on the value it had when the run started.

// runGitDir is the private store of a workspace's jailed runs.
func (m *Manager) runGitDir(ref string) string { return filepath.Join(m.runGit, ref) }

// RunGit prepares the private git store of a worktree workspace for one jailed command and says
// what the jail must bind and set. Commits a previous command left there (a crash before
// BringHome) are brought home first. A workspace that is not a git worktree needs nothing.
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
	if rec.Strategy != StrategyGitWorktree || rec.GitDir == "" || rec.Branch == "" {
		return jail.GitAccess{}, nil
	}
	if err := m.bringHome(ctx, ref, rec); err != nil {
		return jail.GitAccess{}, err
	}
	root := filepath.Join(m.base, ref)
	admin, err := worktreeAdminDir(root)
	if err != nil {
		return jail.GitAccess{}, err
	}
	branchRef := "refs/heads/" + rec.Branch
	head, err := m.git.run(ctx, gitCall{}, "--git-dir="+rec.GitDir, "rev-parse", "--verify", "-q", branchRef+"^{commit}")
	if err != nil {
		return jail.GitAccess{}, err
	}
	store := m.runGitDir(ref)
	if err := os.RemoveAll(store); err != nil {
		return jail.GitAccess{}, err
	}
	privAdmin, repo := filepath.Join(store, "admin"), filepath.Join(store, "repo")
	refDir := filepath.Dir(branchRef) // refs/heads or refs/heads/berth …
	for _, d := range []string{privAdmin, filepath.Join(repo, "objects", "info"), filepath.Join(repo, refDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return jail.GitAccess{}, err
		}
	}
	if err := copyTopFiles(admin, privAdmin); err != nil {
		return jail.GitAccess{}, err
	}
	files := map[string]string{
		filepath.Join(repo, "HEAD"):                          "ref: " + branchRef + "\n",
		filepath.Join(repo, "config"):                        "[core]\n\trepositoryformatversion = 0\n\tbare = true\n",
		filepath.Join(repo, "objects", "info", "alternates"): filepath.Join(rec.GitDir, "objects") + "\n",
		filepath.Join(repo, branchRef):                       head + "\n",
		filepath.Join(store, "base"):                         head + "\n",
	}
	for p, body := range files {
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			return jail.GitAccess{}, err
		}
	}
	// The directory the private refs are bound over must exist in the common dir (a packed task
	// branch leaves none); an empty ref directory changes nothing for git.
	if err := os.MkdirAll(filepath.Join(rec.GitDir, refDir), 0o755); err != nil {
		return jail.GitAccess{}, err
	}
	rw := []jail.Bind{{Src: privAdmin, Dst: admin}, {Src: filepath.Join(repo, refDir), Dst: filepath.Join(rec.GitDir, refDir)},
		{Src: filepath.Join(repo, "objects")}}
	// git appends to a reflog that exists whatever core.logAllRefUpdates says: the run gets an
	// empty private directory over the branch's reflog directory, so it writes none.
	if fi, err := os.Stat(filepath.Join(rec.GitDir, "logs", refDir)); err == nil && fi.IsDir() {
		logs := filepath.Join(store, "logs")
		if err := os.MkdirAll(logs, 0o700); err != nil {
			return jail.GitAccess{}, err
		}
		rw = append(rw, jail.Bind{Src: logs, Dst: filepath.Join(rec.GitDir, "logs", refDir)})
	}
	return jail.GitAccess{
		Store:     store,
		ReadOnly:  []jail.Bind{{Src: rec.GitDir}},
		ReadWrite: rw,
		Env: map[string]string{
			"GIT_OBJECT_DIRECTORY": filepath.Join(repo, "objects"),
			// Command-line scope: git honours safe.directory here for a tree another uid owns.
			"GIT_CONFIG_COUNT": "3",
			"GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*",
			"GIT_CONFIG_KEY_1": "core.logAllRefUpdates", "GIT_CONFIG_VALUE_1": "false",
			"GIT_CONFIG_KEY_2": "gc.auto", "GIT_CONFIG_VALUE_2": "0",
		},
	}, nil
}

// BringHome moves the task branch of a worktree workspace to where its last jailed command left
// it: the run's objects are fetched from the private store into the source (verified by git), and
// the branch is updated only if it still points where it did when the command started. Nothing to
// do when the command made no commit, or for other workspaces.
func (m *Manager) BringHome(ctx context.Context, ref string) error {
	rec, err := m.owned(ref)
	if err != nil {
		return fmt.Errorf("bring home: %w", err)
	}
	if rec.Strategy != StrategyGitWorktree || rec.GitDir == "" || rec.Branch == "" {
		return nil
	}
	if err := m.bringHome(ctx, ref, rec); err != nil {
		return fmt.Errorf("bring home: %w", err)
	}
	return nil
}

func (m *Manager) bringHome(ctx context.Context, ref string, rec record) error {
	store := m.runGitDir(ref)
	repo := filepath.Join(store, "repo")
	branchRef := "refs/heads/" + rec.Branch
	base, err := os.ReadFile(filepath.Join(store, "base"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil // no jailed command used this store
	}
	if err != nil {
		return err
	}
	head, err := os.ReadFile(filepath.Join(repo, branchRef))
	if err != nil || len(bytes.TrimSpace(head)) == 0 {
		return nil // the run deleted its branch: nothing to bring
	}
	oldSHA, newSHA := strings.TrimSpace(string(base)), strings.TrimSpace(string(head))
	if newSHA == oldSHA {
		return nil
	}
	if !isHexID(newSHA) {
		return fmt.Errorf("the run left a malformed task branch: %w", ErrGit)
	}
	// The run could write these: put back what Berth wrote before git reads them.
	if err := os.WriteFile(filepath.Join(repo, "objects", "info", "alternates"), []byte(filepath.Join(rec.GitDir, "objects")+"\n"), 0o600); err != nil {
		return err
	}
	incoming := "refs/berth/incoming/" + ref
	gd := "--git-dir=" + rec.GitDir
	// The store belongs to the run user: upload-pack checks its ownership itself and takes
	// safe.directory only from its own command line.
	if _, err := m.git.run(ctx, gitCall{}, gd, "-c", "fetch.fsckObjects=true", "fetch", "--upload-pack=git -c safe.directory='*' upload-pack", "--no-tags",
		"--no-write-fetch-head", "--no-recurse-submodules", "--quiet", repo, "+"+branchRef+":"+incoming); err != nil {
		return err
	}
	defer m.git.run(context.WithoutCancel(ctx), gitCall{}, gd, "update-ref", "-d", incoming) //nolint:errcheck // a leftover temp ref is harmless
	got, err := m.git.run(ctx, gitCall{}, gd, "rev-parse", "--verify", "-q", incoming+"^{commit}")
	if err != nil {
		return err
	}
	if got != newSHA {
		return fmt.Errorf("the run's branch moved while it was brought home: %w", ErrGit)
	}
	if _, err := m.git.run(ctx, gitCall{}, gd, "update-ref", "-m", "berth: run commits", branchRef, newSHA, oldSHA); err != nil {
		return err
	}
	// The worktree's own index still describes the old commit: point it at the new one (the
	// working files stay as the run left them, so uncommitted work still shows as changes).
	if _, err := m.git.run(ctx, gitCall{dir: filepath.Join(m.base, ref)}, "read-tree", branchRef); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(store, "base"), []byte(newSHA+"\n"), 0o600)
}

// worktreeAdminDir reads the admin dir a linked worktree's .git file points at.
func worktreeAdminDir(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, ".git"))
	if err != nil {
		return "", fmt.Errorf("worktree .git file: %w", err)
	}
	p, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "gitdir: ")
	if !ok || !filepath.IsAbs(p) {
		return "", fmt.Errorf("worktree .git file is not an absolute gitdir link: %w", ErrGit)
	}
	return filepath.Clean(p), nil
}

// copyTopFiles copies the regular files directly in src into dst (a worktree admin dir holds
// only small files at the top: HEAD, index, commondir, gitdir, ORIG_HEAD).
func copyTopFiles(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || strings.HasSuffix(e.Name(), ".lock") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o600); err != nil {
			return err
		}
	}
	return nil
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
