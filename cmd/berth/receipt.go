package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"berth/db"
	"berth/environment/jail"
	"berth/workspace"
)

// maxReceiptFile bounds a receipt file read by `berth receipt verify`.
const maxReceiptFile = 1 << 20

// receiptCmd is `berth receipt verify [--offline] FILE` (DESIGN §13, docs/attempts.md): the
// signature first (a bad one is reported as a signature failure and nothing else is trusted),
// then each digest against what still exists: the workspace on this node's disk, the branch (or
// a discarded attempt's rescue ref) in the source repository, the artifact in the store. It says
// what it checked and what it could not; any mismatch is a non-zero exit.
func receiptCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "verify" {
		return fmt.Errorf("unknown command %q: did you mean %q?", "receipt "+first(args), "receipt verify")
	}
	fs := flagSet("receipt verify", stderr)
	c := baseConfig(fs, getenv)
	offline := fs.Bool("offline", false, "check the signature and what is on disk only; do not open the database")
	rest := args[1:]
	if len(rest) == 0 || strings.HasPrefix(rest[len(rest)-1], "-") {
		if err := parseFlags(fs, rest, stderr); err != nil {
			return err
		}
		return errors.New("receipt verify: give one receipt file, after the flags (as GET /api/runs/{id}/receipt serves it)")
	}
	path := rest[len(rest)-1]
	if err := parseFlags(fs, rest[:len(rest)-1], stderr); err != nil {
		return err
	}
	if err := c.finish(getenv, ""); err != nil {
		return err
	}
	doc, err := readReceiptFile(path)
	if err != nil {
		return err
	}
	key, err := existingSecretKey(getenv("BERTH_SECRET_KEY"), c.DataDir)
	if err != nil {
		return err
	}
	rc, err := db.VerifyReceipt(db.DeriveReceiptKey(key), doc)
	if err != nil {
		fmt.Fprintf(stdout, "signature  FAILED  %v\n", err)
		return errors.New("receipt verify: signature failure: the receipt was changed, or was not signed by this instance's key")
	}
	fmt.Fprintf(stdout, "signature  ok      run %s (%s, %s)\n", rc.RunID, rc.Status, rc.Disposition)

	v := &verifier{out: stdout, rc: rc}
	var opts workspace.Options
	if h, err := jail.Detect(ctx); err == nil {
		opts.Jail = &h // git reads a worktree's files in the jail (workspace/gitjail.go)
	}
	mgr, err := workspace.NewManager(c.DataDir, opts)
	if err != nil {
		return err
	}
	v.workspace(ctx, mgr)
	v.artifact(ctx, c.DataDir)
	if *offline {
		v.skip("branch", "--offline: the database was not opened")
	} else {
		log := c.newLogger(stderr, max(c.LogLevel, slog.LevelWarn))
		dbctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		d, err := openDatabase(dbctx, c, log, false)
		cancel()
		if err != nil {
			v.skip("branch", "the database could not be opened: "+err.Error())
		} else {
			v.branch(ctx, mgr, d)
			d.close()
		}
	}
	fmt.Fprintf(stdout, "summary    %d matched, %d mismatched, %d not checked\n", v.ok, v.bad, v.skipped)
	if v.bad > 0 {
		return fmt.Errorf("receipt verify: %d digest mismatch(es)", v.bad)
	}
	return nil
}

// readReceiptFile reads a receipt file of at most 1 MiB.
func readReceiptFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("receipt verify: %w", err)
	}
	defer f.Close()
	doc, err := io.ReadAll(io.LimitReader(f, maxReceiptFile+1))
	if err != nil {
		return nil, fmt.Errorf("receipt verify: %w", err)
	}
	if len(doc) > maxReceiptFile {
		return nil, errors.New("receipt verify: the file is larger than a receipt can be (1 MiB)")
	}
	return doc, nil
}

// existingSecretKey is the instance's secret key from BERTH_SECRET_KEY or the data dir's key
// file; unlike serve it never creates one (a new key would verify nothing).
func existingSecretKey(envValue, dataDir string) ([]byte, error) {
	if strings.TrimSpace(envValue) == "" {
		if _, err := os.Stat(filepath.Join(dataDir, "secret.key")); err != nil {
			return nil, fmt.Errorf("receipt verify: no secret key: set BERTH_SECRET_KEY or BERTH_DATA_DIR to the instance's (%v)", err)
		}
	}
	key, err := db.LoadSecretKey(envValue, dataDir)
	if err != nil {
		return nil, fmt.Errorf("receipt verify: %w", err)
	}
	return key, nil
}

// verifier prints one line per check and counts the outcomes.
type verifier struct {
	out              io.Writer
	rc               db.Receipt
	ok, bad, skipped int
}

func (v *verifier) match(what, detail string) {
	v.ok++
	fmt.Fprintf(v.out, "%-10s ok      %s\n", what, detail)
}

func (v *verifier) mismatch(what, detail string) {
	v.bad++
	fmt.Fprintf(v.out, "%-10s MISMATCH %s\n", what, detail)
}

func (v *verifier) skip(what, why string) {
	v.skipped++
	fmt.Fprintf(v.out, "%-10s skipped %s\n", what, why)
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// compare records a check of digest got (from where) against the receipt's want.
func (v *verifier) compare(what, where, want, got string) {
	if got == want {
		v.match(what, where+" has "+want)
	} else {
		v.mismatch(what, where+" has "+got+", the receipt says "+want)
	}
}

// workspace checks the final tree digest against the workspace, when it is still on this disk.
func (v *verifier) workspace(ctx context.Context, mgr *workspace.Manager) {
	ref, want := deref(v.rc.WorkspaceRef), deref(v.rc.FinalTreeDigest)
	if ref == "" || want == "" {
		v.skip("workspace", "the receipt names no workspace tree")
		return
	}
	root, err := mgr.Root(ref)
	if err != nil {
		v.skip("workspace", ref+" is not on this node's disk (closed, or on another node)")
		return
	}
	var got string
	if _, gerr := mgr.GitDir(ref); gerr == nil {
		got, err = mgr.WorktreeDigest(ctx, ref)
	} else {
		got, err = workspace.TreeDigest(ctx, root)
	}
	if err != nil {
		v.skip("workspace", ref+" could not be read: "+err.Error())
		return
	}
	v.compare("workspace", "workspace "+ref, want, got)
}

// artifact checks a stored capsule: its content hash, then its tree digest.
func (v *verifier) artifact(ctx context.Context, dataDir string) {
	capsule := deref(v.rc.CapsuleDigest)
	if capsule == "" {
		return
	}
	hexDigest := strings.TrimPrefix(capsule, "sha256:")
	if _, err := hex.DecodeString(hexDigest); err != nil {
		v.mismatch("artifact", "capsule digest "+capsule+" is not a sha256 digest")
		return
	}
	store, err := workspace.NewArtifacts(dataDir)
	if err != nil {
		v.skip("artifact", err.Error())
		return
	}
	if err := store.Verify(ctx, hexDigest); errors.Is(err, workspace.ErrNotFound) {
		v.skip("artifact", capsule+" is not in this node's artifact store")
		return
	} else if err != nil {
		v.mismatch("artifact", capsule+": "+err.Error())
		return
	}
	f, err := store.Open(hexDigest)
	if err != nil {
		v.skip("artifact", err.Error())
		return
	}
	defer f.Close()
	got, err := workspace.CapsuleTreeDigest(ctx, f)
	if err != nil {
		v.mismatch("artifact", capsule+": "+err.Error())
		return
	}
	if want := deref(v.rc.FinalTreeDigest); want != "" {
		v.compare("artifact", "capsule "+capsule, want, got)
	}
}

// branch checks the base and final digests against git: the base commit, and the branch (or the
// rescue ref of a discarded attempt). A branch that moved on with later commits still matches
// when the run's own commit is in its history and has the receipt's digest.
func (v *verifier) branch(ctx context.Context, mgr *workspace.Manager, d *database) {
	l, err := db.LineageOfRun(ctx, d.Pool, v.rc.RunID)
	if errors.Is(err, db.ErrNotFound) {
		v.skip("branch", "the run is not in this instance's database")
		return
	}
	if err != nil {
		v.skip("branch", err.Error())
		return
	}
	if l.Strategy != string(workspace.StrategyGitWorktree) || l.Source == "" {
		v.skip("branch", "the run's workspace is not a git worktree of a known source")
		return
	}
	gitDir, err := mgr.SourceGitDir(ctx, l.Source)
	if err != nil {
		v.skip("branch", "the source repository is not reachable from here")
		return
	}
	if base, want := deref(v.rc.BaseCommit), deref(v.rc.BaseTreeDigest); base != "" && want != "" {
		if got, err := mgr.GitTreeDigest(ctx, gitDir, base); err != nil {
			v.skip("base", "base commit "+base+" is not in the repository")
		} else {
			v.compare("base", "base commit "+base[:min(12, len(base))], want, got)
		}
	}
	want := deref(v.rc.FinalTreeDigest)
	ref, label := "refs/heads/"+l.Branch, "branch "+l.Branch
	if l.RescueRef != "" {
		ref, label = l.RescueRef, "rescue ref "+l.RescueRef
	}
	tip, ok, err := mgr.ResolveRef(ctx, gitDir, ref)
	if err != nil || !ok || want == "" {
		v.skip("branch", label+" no longer exists")
		return
	}
	got, err := mgr.GitTreeDigest(ctx, gitDir, tip)
	if err != nil {
		v.skip("branch", label+": "+err.Error())
		return
	}
	if got == want {
		v.match("branch", label+" at "+tip[:12]+" has "+want)
		return
	}
	if l.Commit != "" {
		if in, err := mgr.IsAncestor(ctx, gitDir, l.Commit, tip); err == nil && in {
			if own, err := mgr.GitTreeDigest(ctx, gitDir, l.Commit); err == nil && own == want {
				v.match("branch", label+" moved on with later commits; the run's commit "+l.Commit[:12]+" in its history has "+want)
				return
			}
		}
	}
	v.mismatch("branch", label+" at "+tip[:12]+" has "+got+", the receipt says "+want+" (the branch was rewritten or reset)")
}
