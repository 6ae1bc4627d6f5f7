// Package receiptcheck verifies a run receipt (DESIGN §13): the signature first (a bad one is a
// signature failure and nothing else in the document is trusted), then each digest against
// what still exists: the workspace on this node's disk, the artifact in the store, the branch
// (or a discarded attempt's rescue ref) in the source repository. It is the one set of rules
// behind `berth receipt verify` and POST /api/runs/{id}/receipt/verify (and the MCP tool
// receipt_verify); each check says what it compared, or why it could not.
package receiptcheck

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"berth/db"
	"berth/workspace"
	"berth/workspace/receipt"
)

// Outcomes of one check.
const (
	Match    = "ok"
	Mismatch = "mismatch"
	Skipped  = "skipped"
)

// Check is one comparison: what (workspace, artifact, base, branch), its outcome and a
// sentence that says what was compared or why it was not.
type Check struct {
	What   string `json:"what"`
	Result string `json:"result"`
	Detail string `json:"detail"`
}

// Report is a verification: the receipt (when its signature holds) and the checks made.
type Report struct {
	Receipt    receipt.Receipt `json:"-"`
	Checks     []Check         `json:"checks"`
	Matched    int             `json:"matched"`
	Mismatched int             `json:"mismatched"`
	NotChecked int             `json:"not_checked"`
}

// Sources is what the checks may read; a nil field skips its checks.
type Sources struct {
	Manager   *workspace.Manager
	Artifacts *workspace.Artifacts
	// Lineage reads where the run's result lives (db.LineageOfRun); nil skips the branch check
	// with SkipLineage as the reason.
	Lineage     func(ctx context.Context, runID string) (db.ReceiptLineage, error)
	SkipLineage string
}

// ErrSignature wraps a receipt whose signature does not verify under the key.
var ErrSignature = receipt.ErrBadSignature

// Verify checks doc's signature under key and then its digests against src.
func Verify(ctx context.Context, key, doc []byte, src Sources) (Report, error) {
	rc, err := receipt.Verify(key, doc)
	if err != nil {
		return Report{}, err
	}
	v := &Report{Receipt: rc, Checks: []Check{}}
	v.workspace(ctx, src.Manager)
	v.artifact(ctx, src.Artifacts)
	if src.Lineage == nil {
		v.skip("branch", src.SkipLineage)
	} else if src.Manager != nil {
		v.branch(ctx, src.Manager, src.Lineage)
	}
	return *v, nil
}

func (v *Report) add(what, result, detail string) {
	v.Checks = append(v.Checks, Check{What: what, Result: result, Detail: detail})
	switch result {
	case Match:
		v.Matched++
	case Mismatch:
		v.Mismatched++
	default:
		v.NotChecked++
	}
}

func (v *Report) match(what, detail string)    { v.add(what, Match, detail) }
func (v *Report) mismatch(what, detail string) { v.add(what, Mismatch, detail) }
func (v *Report) skip(what, why string)        { v.add(what, Skipped, why) }

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// compare records a check of digest got (from where) against the receipt's want.
func (v *Report) compare(what, where, want, got string) {
	if got == want {
		v.match(what, where+" has "+want)
	} else {
		v.mismatch(what, where+" has "+got+", the receipt says "+want)
	}
}

// workspace checks the final tree digest against the workspace, when it is still on this disk.
func (v *Report) workspace(ctx context.Context, mgr *workspace.Manager) {
	ref, want := deref(v.Receipt.WorkspaceRef), deref(v.Receipt.FinalTreeDigest)
	if ref == "" || want == "" {
		v.skip("workspace", "the receipt names no workspace tree")
		return
	}
	if mgr == nil {
		v.skip("workspace", "this process has no workspace manager")
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
func (v *Report) artifact(ctx context.Context, store *workspace.Artifacts) {
	capsule := deref(v.Receipt.CapsuleDigest)
	if capsule == "" {
		return
	}
	hexDigest := strings.TrimPrefix(capsule, "sha256:")
	if _, err := hex.DecodeString(hexDigest); err != nil {
		v.mismatch("artifact", "capsule digest "+capsule+" is not a sha256 digest")
		return
	}
	if store == nil {
		v.skip("artifact", "this process has no artifact store")
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
	if want := deref(v.Receipt.FinalTreeDigest); want != "" {
		v.compare("artifact", "capsule "+capsule, want, got)
	}
}

// branch checks the base and final digests against git: the base commit, and the branch (or the
// rescue ref of a discarded attempt). A branch that moved on with later commits still matches
// when the run's own commit is in its history and has the receipt's digest.
func (v *Report) branch(ctx context.Context, mgr *workspace.Manager, lineage func(context.Context, string) (db.ReceiptLineage, error)) {
	l, err := lineage(ctx, v.Receipt.RunID)
	if errors.Is(err, db.ErrNotFound) {
		v.skip("branch", "the run is not in this instance's database")
		return
	}
	if err != nil {
		v.skip("branch", fmt.Sprintf("the run's lineage could not be read: %v", err))
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
	if base, want := deref(v.Receipt.BaseCommit), deref(v.Receipt.BaseTreeDigest); base != "" && want != "" {
		if got, err := mgr.GitTreeDigest(ctx, gitDir, base); err != nil {
			v.skip("base", "base commit "+base+" is not in the repository")
		} else {
			v.compare("base", "base commit "+base[:min(12, len(base))], want, got)
		}
	}
	want := deref(v.Receipt.FinalTreeDigest)
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
