package jobs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/environment"
	"berth/workspace"
	"berth/workspace/receipt"
)

// Receipts and sealing at finalize (DESIGN §13, docs/attempts.md). After a run's result is
// committed or packed, finalize computes the run's receipt from the workspace (tree digests via
// the capsule machinery, .git excluded), signs it with the instance's receipt key and stores it;
// an attempt's workspace is sealed with its final tree digest in the same transaction. A retry
// finds the receipt stored and does nothing again.

// recordReceipt writes the run's receipt (and seals an attempt's workspace) unless it exists.
func (w *FinalizeWorker) recordReceipt(ctx context.Context, run db.Run) error {
	if len(w.deps.ReceiptKey) == 0 {
		w.deps.Log.WarnContext(ctx, "no receipt: this node has no receipt key", "run_id", run.ID)
		return nil
	}
	if _, err := db.ReceiptOf(ctx, w.deps.Pool, run.CompanyID, run.ID); err == nil {
		return nil
	} else if !errors.Is(err, db.ErrNotFound) {
		return err
	}
	var ws *db.ExecutionWorkspace
	if run.ExecutionWorkspaceID != "" {
		x, err := db.ExecutionWorkspaceByID(ctx, w.deps.Pool, run.CompanyID, run.ExecutionWorkspaceID)
		if err != nil {
			return err
		}
		ws = &x
	}
	rc, err := w.receiptFor(ctx, run, ws)
	if err != nil {
		return fmt.Errorf("receipt: %w", err)
	}
	doc, err := receipt.Sign(w.deps.ReceiptKey, rc)
	if err != nil {
		return err
	}
	att, err := db.AttemptOfRun(ctx, w.deps.Pool, run.ID)
	isAttempt := err == nil
	if err != nil && !errors.Is(err, db.ErrNotFound) {
		return err
	}
	return db.InTx(ctx, w.deps.Pool, func(tx pgx.Tx) error {
		if isAttempt && ws != nil && rc.FinalTreeDigest != nil {
			if err := db.SealWorkspace(ctx, tx, ws.ID, *rc.FinalTreeDigest); err != nil {
				return err
			}
			w.deps.Log.InfoContext(ctx, "attempt sealed", "run_id", run.ID, "task_id", run.TaskID, "company_id", run.CompanyID,
				"attempt_group_id", att.GroupID, "attempt", att.N, "final_tree_digest", *rc.FinalTreeDigest)
		}
		return db.SaveReceipt(ctx, tx, run.CompanyID, run.ID, rc.Disposition, doc)
	})
}

// receiptFor computes the unsigned receipt of an ended run in workspace ws (nil: it got none).
func (w *FinalizeWorker) receiptFor(ctx context.Context, run db.Run, ws *db.ExecutionWorkspace) (receipt.Receipt, error) {
	rc := receipt.Receipt{RunID: run.ID, TaskID: run.TaskID, Command: run.Command, ExitCode: run.ExitCode, Status: run.Status,
		StartedAt: receiptTime(run.StartedAt), FinishedAt: receiptTime(run.FinishedAt), NodeID: run.NodeID,
		Disposition: receipt.DispositionUnchanged}
	if rc.NodeID == "" {
		rc.NodeID = w.deps.NodeID
	}
	if err := w.receiptEnvironment(ctx, run, &rc); err != nil {
		return rc, err
	}
	if ws == nil || ws.Ref == "" {
		return rc, nil
	}
	rc.WorkspaceRef = strPtr(ws.Ref)
	if ws.Strategy != string(workspace.StrategyGitWorktree) && ws.Strategy != string(workspace.StrategyCopy) {
		return rc, nil // a shared workspace is the project's own directory: Berth keeps no result of it to digest
	}
	root, err := w.workspaceRoot(*ws)
	if err != nil {
		return rc, err
	}
	switch ws.Strategy {
	case string(workspace.StrategyGitWorktree):
		rc.BaseCommit = strPtr(ws.BaseCommit)
		gitDir, err := w.deps.Workspaces.GitDir(ws.Ref)
		if err != nil {
			return rc, err
		}
		base, err := w.deps.Workspaces.GitTreeDigest(ctx, gitDir, ws.BaseCommit)
		if err != nil {
			return rc, err
		}
		// Finalize committed everything `git add -A` takes: the branch's tree is the final one
		// (read from the source's objects, never from the workspace's git).
		final, err := w.deps.Workspaces.GitTreeDigest(ctx, gitDir, "refs/heads/"+ws.Branch)
		if err != nil {
			return rc, err
		}
		rc.BaseTreeDigest, rc.FinalTreeDigest = &base, &final
		if final != base {
			rc.Disposition = receipt.DispositionCommitted
		}
	case string(workspace.StrategyCopy):
		if strings.HasPrefix(ws.BaseTreeDigest, "sha256:") {
			rc.BaseTreeDigest = strPtr(ws.BaseTreeDigest)
		}
		final, err := workspace.TreeDigest(ctx, root)
		if err != nil {
			return rc, err
		}
		rc.FinalTreeDigest = &final
		products, err := db.WorkspaceWorkProducts(ctx, w.deps.Pool, run.CompanyID, ws.ID, 50)
		if err != nil {
			return rc, err
		}
		for _, p := range products {
			if p.Kind == "artifact" && p.RunID == run.ID {
				rc.CapsuleDigest, rc.Disposition = strPtr(p.Ref), receipt.DispositionArtifact
				break
			}
		}
	}
	return rc, nil
}

// receiptEnvironment fills the environment's fingerprint (driver, settings, secrets as an HMAC,
// active image) and, for a sandbox, the image digest the run used.
func (w *FinalizeWorker) receiptEnvironment(ctx context.Context, run db.Run, rc *receipt.Receipt) error {
	if run.EnvironmentID == "" {
		return nil
	}
	env, err := db.EnvironmentByID(ctx, w.deps.Pool, run.CompanyID, run.EnvironmentID)
	if errors.Is(err, db.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	basis, err := (&ProbeEnvironmentWorker{runWorker: w.runWorker}).qualificationBasis(ctx, w.deps.Pool, env)
	if err != nil {
		return err
	}
	rc.EnvironmentFingerprint = strPtr(basis.fingerprint)
	if (env.Driver == environment.DriverSandbox || env.Driver == environment.DriverPlugin) && basis.image != "" {
		rc.ImageDigest = strPtr(basis.image)
	}
	return nil
}

func strPtr(s string) *string { return &s }

func receiptTime(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := t.UTC().Format(time.RFC3339Nano)
	return &s
}
