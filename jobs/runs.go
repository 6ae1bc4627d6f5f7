package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"berth/db"
	"berth/environment"
	"berth/workspace"
)

// Run jobs: provision → execute_run → finalize. Each reads the run's row first and does only what
// the row says is still to do, so a retry after a crash adopts what the previous attempt left.

// leaseTTL is how long a run's lease lives without a heartbeat; runs heartbeat every leaseTTL/4.
const leaseTTL = 2 * time.Minute

// logFlush is how often a running command's log is written to its run row for tailing.
const logFlush = 500 * time.Millisecond

// errorCode values a failed run records.
const (
	codeSetupFailed     = "setup_failed"
	codeRealizeFailed   = "realize_failed"
	codeSourceTooLarge  = "source_too_large"
	codeCommandFailed   = "command_failed"
	codeLeaseLost       = "lease_lost"
	codeEnvironment     = "environment_unavailable"
	codeFinalizeFailed  = "finalize_failed"
	codeOrphaned        = "orphaned"
	codeExecutorFailure = "executor_failed"
)

// errStepSkipped is what a step returns when it decided not to run: its ledger entry reads
// skipped (the log says why), and the run goes on.
var errStepSkipped = errors.New("step skipped")

// operation runs step as a ledger entry: written running before, settled after with its log
// (succeeded, failed, or skipped when step returns errStepSkipped).
func (w runWorker) operation(ctx context.Context, n db.NewOperation, step func(log *environment.LogBuffer) (exit *int, err error)) error {
	n.NodeID = w.deps.NodeID
	op, err := db.StartOperation(ctx, w.deps.Pool, n)
	if err != nil {
		return err
	}
	log := environment.NewLogBuffer(environment.LogOptions{Limit: 256 << 10})
	exit, stepErr := step(log)
	res := db.OperationResult{Status: db.OpSucceeded, ExitCode: exit, Log: log.Bytes(), LogBytes: log.Total(),
		LogSHA256: log.SHA256(), LogTruncated: log.Truncated()}
	switch {
	case errors.Is(stepErr, errStepSkipped):
		res.Status, stepErr = db.OpSkipped, nil
	case stepErr != nil:
		res.Status, res.Error = db.OpFailed, stepErr.Error()
	}
	if err := db.FinishOperation(context.WithoutCancel(ctx), w.deps.Pool, op.ID, res); err != nil {
		return errors.Join(stepErr, err)
	}
	return stepErr
}

// runWorker is what the three run jobs share.
type runWorker struct {
	deps Deps
}

// failRun ends a live run as failed with a code and a message, enqueuing finalize so the lease is
// released and the workspace settled.
func (w runWorker) failRun(ctx context.Context, run db.Run, status, code, msg string) error {
	return db.InTx(ctx, w.deps.Pool, func(tx pgx.Tx) error {
		_, err := db.TransitionRun(ctx, tx, run.ID, db.LiveRunStatuses, status,
			db.RunUpdate{ErrorCode: &code, ErrorMessage: &msg, Finished: true})
		if errors.Is(err, db.ErrRunState) {
			return nil // already ended: nothing to do
		}
		if err != nil {
			return err
		}
		return w.enqueueFinalize(ctx, tx, run)
	})
}

// enqueueFinalize marks the workspace's finalize pending and enqueues finalize in tx.
func (w runWorker) enqueueFinalize(ctx context.Context, tx pgx.Tx, run db.Run) error {
	if err := db.MarkFinalizePending(ctx, tx, run); err != nil {
		return err
	}
	_, err := Enqueue(ctx, river.ClientFromContext[pgx.Tx](ctx), tx, FinalizeArgs{RunID: run.ID})
	return err
}

// driverFor builds the driver of a run's environment.
func (w runWorker) driverFor(ctx context.Context, run db.Run) (environment.Driver, error) {
	env, err := db.EnvironmentByID(ctx, w.deps.Pool, run.CompanyID, run.EnvironmentID)
	if err != nil {
		return nil, fmt.Errorf("run environment: %w", err)
	}
	cfg, err := environment.Load(env.Driver, env.Config)
	if err != nil {
		return nil, err
	}
	var sec environment.Secrets
	if len(env.Secrets) > 0 {
		if w.deps.Secrets == nil {
			return nil, fmt.Errorf("run environment: no key to open its secrets")
		}
		b, err := w.deps.Secrets.Open(env.Secrets, environment.SecretsAAD(env.ID))
		if err != nil {
			return nil, fmt.Errorf("run environment: its secrets do not open with this server's key")
		}
		if err := json.Unmarshal(b, &sec); err != nil {
			return nil, fmt.Errorf("run environment: its secrets are unreadable")
		}
	}
	opts := environment.Options{NodeID: w.deps.NodeID, Secrets: sec, Jail: w.deps.Jail, DataDir: w.deps.Data.Root, Networks: w.deps.Networks,
		CABundle: injectedBundle(cfg, w.deps.Egress),
		Masks:    w.deps.Masks, Plugins: w.deps.Plugins}
	if w.deps.Data.Root != "" {
		opts.Masks = append([]string{w.deps.Data.Root}, opts.Masks...)
	}
	switch cfg.Driver {
	case environment.DriverSandbox:
		if opts.ImageDir, err = w.imageLayer(ctx, env); err != nil {
			return nil, err
		}
	case environment.DriverPlugin:
		// A plugin gets the active image version (if any) by digest, and the layer when it lacks it.
		if v, err := db.ActiveImageVersion(ctx, w.deps.Pool, env.CompanyID, env.ID); err == nil && w.deps.Data.Root != "" {
			opts.ImageDir, opts.ImageDigest = w.deps.Data.ImageLayer(env.ID, v.Number), v.Digest
		} else if err != nil && !errors.Is(err, db.ErrNotFound) {
			return nil, fmt.Errorf("run environment: %w", err)
		}
	}
	if w.deps.HomeDir != "" {
		opts.Home = filepath.Join(w.deps.HomeDir, env.ID)
		if err := os.MkdirAll(opts.Home, 0o700); err != nil {
			return nil, fmt.Errorf("run environment: home: %w", err)
		}
	}
	return environment.New(cfg, opts)
}

// environmentDriver builds the driver of a stored environment as a run of it gets it.
func environmentDriver(ctx context.Context, d Deps, env db.Environment) (environment.Driver, error) {
	return runWorker{deps: d}.driverFor(ctx, db.Run{CompanyID: env.CompanyID, EnvironmentID: env.ID})
}

// injectedBundle is the CA bundle for an environment whose credentials the proxy injects, else "".
func injectedBundle(cfg environment.Config, e *Egress) string {
	if !cfg.Injects() {
		return ""
	}
	return e.Bundle()
}

// imageLayer is the host directory of a sandbox environment's active image version:
// <data dir>/images/<environment id>/<number> (version 1, the empty layer, is made on first use).
func (w runWorker) imageLayer(ctx context.Context, env db.Environment) (string, error) {
	if w.deps.Data.Root == "" {
		return "", fmt.Errorf("run environment: sandboxes need the data dir")
	}
	v, err := db.ActiveImageVersion(ctx, w.deps.Pool, env.CompanyID, env.ID)
	if err != nil {
		return "", fmt.Errorf("run environment: the sandbox has no active image version: %w", err)
	}
	return w.deps.Data.ImageLayer(env.ID, v.Number), nil
}

// inJail completes a command for workspace ws with what its jail needs: the workspace's network
// namespace (shared with its services), a private HOME per workspace (outside its tree, kept
// between runs) and, for a git worktree, the private git store its commits go to until finalize
// brings them home (workspace.RunGit).
func (w runWorker) inJail(ctx context.Context, ws db.ExecutionWorkspace, environmentID string, req environment.ExecRequest) (environment.ExecRequest, error) {
	req.Network = ws.ID
	w.deps.Egress.Bind(ws.ID, ws.CompanyID, environmentID, nil, nil) // its connections follow this environment's policy
	if w.deps.HomeDir != "" {
		req.Home = filepath.Join(w.deps.HomeDir, ws.Ref)
		if err := os.MkdirAll(req.Home, 0o700); err != nil {
			return req, fmt.Errorf("command home: %w", err)
		}
	}
	if w.deps.Workspaces != nil {
		acc, err := w.deps.Workspaces.RunGit(ctx, ws.Ref)
		if err != nil {
			return req, err
		}
		req.Git = acc
	}
	return req, nil
}

// snoozeBusy turns a busy lease into a later retry that does not count as a failure.
func snoozeBusy(err error) error {
	if errors.Is(err, db.ErrLeaseBusy) {
		return river.JobSnooze(2 * time.Second)
	}
	return err
}

// workspaceRoot is the absolute root of a run's workspace on this node.
func (w runWorker) workspaceRoot(ws db.ExecutionWorkspace) (string, error) {
	return w.deps.Workspaces.Root(ws.Ref)
}

// planOf decodes the plan a run was admitted with.
func planOf(run db.Run) (workspace.Plan, error) {
	var p workspace.Plan
	if err := json.Unmarshal(run.Plan, &p); err != nil {
		return p, fmt.Errorf("run plan: %w", err)
	}
	return p, nil
}
