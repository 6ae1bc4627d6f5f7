package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"berth/db"
	"berth/environment"
	"berth/jobs/spool"
)

// ExecuteRunArgs asks to run a prepared run's command.
type ExecuteRunArgs struct {
	RunID string `json:"run_id"`
}

// Kind names the job in River.
func (ExecuteRunArgs) Kind() string { return "execute_run" }

// InsertOpts: a command runs at most once; a crash mid-run is recovered by the orphan sweep, not
// by running the command a second time.
func (ExecuteRunArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{MaxAttempts: 1} }

// ExecuteRunWorker runs the command through the environment's driver, streams its log into the
// run row, heartbeats the lease, stops the command on cancel or timeout, and records the end.
type ExecuteRunWorker struct {
	river.WorkerDefaults[ExecuteRunArgs]
	runWorker
}

// Timeout: the run's own timeout bounds the command; River's job timeout is off for this kind.
func (w *ExecuteRunWorker) Timeout(*river.Job[ExecuteRunArgs]) time.Duration { return -1 }

// Work runs the command once.
func (w *ExecuteRunWorker) Work(ctx context.Context, job *river.Job[ExecuteRunArgs]) error {
	run, err := db.RunForJob(ctx, w.deps.Pool, job.Args.RunID)
	if err != nil {
		return startLater(err)
	}
	if run.Status != db.RunPreparing {
		return nil
	}
	if run.CancelRequested {
		return startLater(w.failRun(ctx, run, db.RunCancelled, "cancelled", "The run was cancelled before its command started."))
	}
	ws, err := db.ExecutionWorkspaceByID(ctx, w.deps.Pool, run.CompanyID, run.ExecutionWorkspaceID)
	if db.Unavailable(err) {
		return startLater(err)
	}
	if err != nil {
		return startLater(w.failRun(ctx, run, db.RunFailed, codeExecutorFailure, "The run's workspace is gone."))
	}
	lease, err := db.LeaseByID(ctx, w.deps.Pool, run.CompanyID, run.LeaseID)
	if db.Unavailable(err) {
		return startLater(err)
	}
	if err != nil {
		return startLater(w.failRun(ctx, run, db.RunFailed, codeLeaseLost, "The run's lease is gone."))
	}
	drv, err := w.driverFor(ctx, run)
	if db.Unavailable(err) {
		return startLater(err)
	}
	if err != nil {
		return startLater(w.failRun(ctx, run, db.RunFailed, codeEnvironment, err.Error()))
	}
	if c, ok := drv.(io.Closer); ok {
		defer c.Close()
	}
	root, err := w.workspaceRoot(ws)
	if err != nil {
		return w.failRun(ctx, run, db.RunFailed, codeExecutorFailure, "The workspace directory is not managed by this node.")
	}
	dir := root
	if environment.Remote(drv) {
		if dir, err = w.realizeRemote(ctx, run, ws, lease, drv, root); err != nil {
			code := codeRealizeFailed
			switch {
			case errors.Is(err, environment.ErrHostKeyMismatch):
				code = codeHostKeyMismatch
			case errors.Is(err, db.ErrFenced):
				code = codeLeaseLost
			case errors.Is(err, environment.ErrDriverUnavailable):
				code = codeDriverUnavailable
			}
			return w.failRun(ctx, run, db.RunFailed, code, "Preparing the remote workspace failed: "+err.Error())
		}
		if err := w.remoteSetup(ctx, run, ws, drv, dir); err != nil {
			return w.failRun(ctx, run, db.RunFailed, codeSetupFailed, "The setup command failed: "+err.Error())
		}
	}
	token, hash, err := db.NewToken()
	if err != nil {
		return err
	}
	err = db.InTx(ctx, w.deps.Pool, func(tx pgx.Tx) error {
		if err := db.CreateRunToken(ctx, tx, run.ID, hash, time.Now().Add(time.Duration(run.TimeoutS)*time.Second+time.Hour)); err != nil {
			return err
		}
		run, err = db.TransitionRun(ctx, tx, run.ID, []string{db.RunPreparing}, db.RunRunning, db.RunUpdate{Started: true, NodeID: &w.deps.NodeID})
		return err
	})
	if err != nil && !environment.Remote(drv) {
		return startLater(err) // nothing ran yet on this host
	}
	if err != nil {
		return err
	}
	w.started(ctx, run)

	runCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	watching := make(chan struct{})
	go func() { defer close(watching); w.watch(runCtx, stop, run, lease) }()

	log := environment.NewLogBuffer(environment.LogOptions{FlushInterval: logFlush, OnWrite: func(s environment.LogSnapshot) {
		if s.Final {
			return // the final transaction writes the whole kept log
		}
		// For tailing only: a failed write is superseded by the next one, or by the final one.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), outcomeTryTimeout)
		defer cancel()
		_ = db.SetRunLog(wctx, w.deps.Pool, run.ID, runLogOf(s))
	}})
	req := environment.ExecRequest{Command: run.Command, Dir: dir, Log: log, Tag: run.ID,
		Timeout: time.Duration(run.TimeoutS) * time.Second,
		Env: map[string]string{"BERTH_RUN_TOKEN": token, "BERTH_API_URL": w.deps.APIURL, "BERTH_TASK_ID": run.TaskID,
			"BERTH_WORKSPACE_ID": ws.ID, "BERTH_MCP_URL": mcpURL(w.deps.APIURL)}}
	if !environment.Remote(drv) { // the remote host is the boundary there; the jail is for this one
		req, err = w.inJail(ctx, ws, run.EnvironmentID, req)
	}
	// What the run's jails reach through the egress proxy is recorded for it, and refusals are
	// lines of its log.
	unbind := w.deps.Egress.Bind(ws.ID, run.CompanyID, run.EnvironmentID, &run, log)
	var res environment.ExecResult
	var execErr error
	if err != nil {
		res, execErr = environment.ExecResult{ExitCode: -1}, err
	} else {
		res, execErr = drv.Exec(runCtx, req)
	}
	hosts := w.deps.Egress.Hosts(run.ID)
	unbind()
	_ = log.Close()
	if len(hosts) > 0 {
		if doc, err := json.Marshal(map[string]any{"hosts": hosts}); err == nil {
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), outcomeTryTimeout)
			if err := db.SetRunEgress(wctx, w.deps.Pool, run.ID, doc); err != nil {
				runLog(w.deps.Log, run).WarnContext(ctx, "run egress record", "err", err)
			}
			cancel()
		}
	}
	// The watch ends with the command: no lease write follows it, whatever the final write waits for.
	cause := context.Cause(runCtx)
	stop(errCommandEnded)
	<-watching

	status, code, msg := db.RunSucceeded, "", ""
	switch {
	case execErr != nil && res.Started.IsZero() && errors.Is(cause, errLeaseLost):
		status, code, msg = db.RunFailed, codeLeaseLost, "The run lost its lease before its command started."
	case execErr != nil && res.Started.IsZero() && cause != nil:
		status, code, msg = db.RunCancelled, "cancelled", "The run was cancelled before its command started."
	case execErr != nil && res.Started.IsZero():
		status, code, msg = db.RunFailed, codeExecutorFailure, "The command could not start: "+execErr.Error()
	case errors.Is(execErr, environment.ErrDriverUnavailable) && !res.Started.IsZero():
		// A plugin that crashed mid-command: its instance is settled like a dead node's work
		// (finalize releases the lease; cleanup runs on the restarted plugin).
		status, code, msg = db.RunFailed, codeDriverUnavailable, "The environment's driver stopped while the command ran: "+execErr.Error()
	case errors.Is(execErr, environment.ErrNotGone):
		status, code, msg = db.RunFailed, "processes_survived", "Some of the command's processes survived SIGKILL."
	case res.TimedOut:
		status, code, msg = db.RunTimedOut, "timeout", fmt.Sprintf("The command ran longer than %d s and was stopped.", run.TimeoutS)
	case res.Cancelled && errors.Is(cause, errLeaseLost):
		status, code, msg = db.RunFailed, codeLeaseLost, "The run lost its lease and was stopped."
	case res.Cancelled:
		status, code, msg = db.RunCancelled, "cancelled", "The run was cancelled."
	case res.ExitCode != 0:
		status, code, msg = db.RunFailed, codeCommandFailed, fmt.Sprintf("The command exited with status %d.", res.ExitCode)
	}
	out := spool.Outcome{RunID: run.ID, Status: status, ErrorCode: code, ErrorMessage: msg}
	if !res.Started.IsZero() {
		exit := res.ExitCode
		out.ExitCode = &exit
	}
	snap := log.Snapshot()
	out.Log, out.LogHead, out.LogTotal, out.LogTruncated = snap.Data, snap.Head, snap.Total, snap.Truncated
	runLog(w.deps.Log, run).InfoContext(ctx, "run command ended", "status", status, "exit_code", res.ExitCode, "error_code", code)
	// The outcome is spooled and written whatever the database's state (outcome.go, package jobs/spool).
	return w.recordOutcome(ctx, run, out)
}

// startLater turns a database outage met before the command started into a later try: River
// counts no attempt for a snooze, so execute_run's single attempt stays the command's, and nothing
// has run yet that a second try would repeat.
func startLater(err error) error {
	if db.Unavailable(err) {
		return river.JobSnooze(finalizeOutageWait)
	}
	return err
}

// runLogOf is what the run row keeps of a log snapshot: head, marker and tail past the cap.
func runLogOf(s environment.LogSnapshot) db.RunLog {
	return db.RunLog{Data: s.Data, Head: s.Head, Total: s.Total, Truncated: s.Truncated}
}

// codeHostKeyMismatch fails a run on an ssh host whose key is not the pinned one.
const codeHostKeyMismatch = "host_key_mismatch"

// codeDriverUnavailable fails a run whose plugin crashed or stopped answering.
const codeDriverUnavailable = "driver_unavailable"

// realizeRemote acquires the lease's instance on a remote driver (one per lease generation),
// records it in the lease row so finalize and cleanup find it after a crash, and uploads the
// workspace there (operation upload). It returns the remote directory commands run in.
func (w *ExecuteRunWorker) realizeRemote(ctx context.Context, run db.Run, ws db.ExecutionWorkspace, lease db.Lease,
	drv environment.Driver, root string) (string, error) {
	inst, err := drv.Acquire(ctx, environment.AcquireRequest{Key: lease.ID + ":" + strconv.FormatInt(lease.Generation, 10), Tag: run.ID})
	if err != nil {
		return "", err
	}
	if _, err := db.SetLeaseProviderRef(ctx, w.deps.Pool, lease.ID, lease.Generation, inst.Ref); err != nil {
		return "", err
	}
	var real environment.Realization
	err = w.operation(ctx, db.NewOperation{CompanyID: run.CompanyID, ExecutionWorkspaceID: ws.ID, RunID: run.ID,
		TaskID: run.TaskID, Phase: "upload", Command: "upload workspace"}, func(log *environment.LogBuffer) (*int, error) {
		var err error
		real, err = drv.Realize(ctx, environment.RealizeRequest{Instance: inst, WorkspaceRef: ws.Ref, HostPath: root})
		if err == nil {
			fmt.Fprintf(log, "uploaded the workspace to %s (%s)\n", real.Root, inst.Ref)
		}
		return nil, err
	})
	return real.Root, err
}

// errLeaseLost ends a command whose lease was fenced or expired, or not renewed for a whole TTL.
var errLeaseLost = errors.New("lease lost")

// errCommandEnded ends the watch of a command that has ended.
var errCommandEnded = errors.New("command ended")

// cancelPoll is how often a running command checks for a cancel request.
const cancelPoll = 250 * time.Millisecond

// watch keeps the run's lease (leaseKeeper: renewed every TTL/3, lost when fenced or not renewed
// for a whole TTL), heartbeats the run, and stops the command on a cancel request or a lost
// lease. Every database call is bounded, so an unanswering database cannot hold the watch past
// the lease's local deadline.
func (w *ExecuteRunWorker) watch(ctx context.Context, stop context.CancelCauseFunc, run db.Run, lease db.Lease) {
	keeper := newLeaseKeeper(w.deps.Pool, lease, w.deps.leaseTTL())
	poll := time.NewTicker(cancelPoll)
	defer poll.Stop()
	renew := time.NewTicker(keeper.every())
	defer renew.Stop()
	lost := time.NewTimer(keeper.remaining())
	defer lost.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-lost.C:
			if keeper.remaining() <= 0 {
				runLog(w.deps.Log, run).Warn("lease not renewed for a whole TTL: stopping the run", "lease_id", lease.ID,
					"generation", lease.Generation)
				stop(errLeaseLost)
				return
			}
			lost.Reset(keeper.remaining())
		case <-renew.C:
			if err := keeper.renew(ctx); errors.Is(err, db.ErrFenced) {
				runLog(w.deps.Log, run).Warn("lease fenced: stopping the run", "lease_id", lease.ID, "generation", lease.Generation)
				stop(errLeaseLost)
				return
			}
			lost.Reset(keeper.remaining())
			bctx, cancel := context.WithTimeout(ctx, keeper.every())
			_ = db.HeartbeatRun(bctx, w.deps.Pool, run.ID)
			cancel()
		case <-poll.C:
			// A failed read is asked again at the next poll.
			pctx, cancel := context.WithTimeout(ctx, min(keeper.every(), 4*cancelPoll))
			cancelAsked, err := db.RunCancelRequested(pctx, w.deps.Pool, run.ID)
			cancel()
			if err == nil && cancelAsked {
				stop(context.Canceled)
				return
			}
		}
	}
}

// mcpURL is BERTH_MCP_URL beside BERTH_API_URL: the MCP endpoint on the same origin (a jail's
// network rewrites both to its API bridge, environment/jailed.go).
func mcpURL(apiURL string) string {
	if apiURL == "" {
		return ""
	}
	return strings.TrimSuffix(apiURL, "/") + "/mcp"
}
