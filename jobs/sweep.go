package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"berth/db"
	"berth/environment"
	"berth/environment/datadir"
	"berth/jobs/executing"
	"berth/jobs/nodes"
	"berth/jobs/spool"
	"berth/workspace"
)

// Orphan sweeps: a run whose executor is gone leaves its live status as failed with error_code
// orphaned (a run is never executed a second time: its command may have had effects), its
// processes are killed when they are on this host, and finalize is enqueued (it releases the
// lease and settles the workspace). Whichever step the executor died in, the verdict is the same:
// a crash mid-provision ends the run orphaned too, never setup_failed, because nobody saw the
// setup command end.
//
// A live run is orphaned when nothing can carry it on any more (and no outcome of it waits in this
// node's spool, package jobs/spool: its executor knew how it ended and the outcome is on its way):
//   - no provision or execute_run job of it waits for a worker, and none runs in this process
//     (this process's Executing registry, or a running job fetched under this client id); and
//   - either no such job is left at all and the run has been quiet (no heartbeat) for quietAfter;
//   - or every job still "running" was fetched by an earlier process of this node, and this
//     process is the only live one of the node (Executing's claim): this node restarted, so the
//     run is orphaned at once, which is what lets a restarted node recover within seconds;
//   - or the run's heartbeat and every running job's attempt are older than staleAfter (another
//     node died; its processes die with it or are killed when it restarts, see reapEnded).
//
// River's stuck-job rescuer plays no part in recovery: a dead process's job stays "running" until
// it is rescued, over an hour later, and an execute_run job (no River timeout) never is. So the
// sweep also asks River to cancel the dead process's jobs of the run, in the transaction that ends
// the run: the rescuer then cancels them instead of retrying them. Were one retried anyway, it
// would find the run ended and do nothing (execute_run has a single attempt; provision returns
// early on an ended run).

// Each sweep also settles ledger steps whose executor is gone (settleOperations) and reports, as
// an audit event, what lies under this node's managed base without an owner (reportUnmanaged in
// unmanaged_report.go); nothing there is ever deleted.

// SweepInterval is how often the leader enqueues sweep_orphans.
const SweepInterval = 30 * time.Second

const (
	// staleAfter: a run with no heartbeat (and a job attempt no newer) for this long has lost its
	// executor, whichever node it was on.
	staleAfter = 2 * leaseTTL
	// quietAfter: a run that no job can move on any more is orphaned after this long without a
	// heartbeat (its executor, if any, beats every heartbeatEvery).
	quietAfter = 3 * leaseTTL / 4
	// killGrace is how long an orphan's processes get between SIGTERM and SIGKILL.
	killGrace = 3 * time.Second
	// stuckOperationAge: any ledger step still running after this long is settled as failed.
	stuckOperationAge = time.Hour
	// deadRunOperationAge: a run's preparation step still running this long after it started,
	// its run having ended, is settled as failed.
	deadRunOperationAge = 10 * time.Minute
	// sweepBatch bounds how many live runs one sweep looks at.
	sweepBatch = 1000
	// reapWindow: at startup, processes of this node's runs orphaned this recently are killed.
	reapWindow = 24 * time.Hour
	// reapBatch bounds how many ended runs a startup sweep looks for processes of.
	reapBatch = 200
)

// Orphan reasons, recorded in the run.orphaned audit event.
const (
	reasonNoJob         = "no_job"
	reasonNodeRestarted = "node_restarted"
	reasonStale         = "stale_heartbeat"
)

// SweepOrphansArgs asks for one orphan sweep.
type SweepOrphansArgs struct{}

// Kind names the job in River.
func (SweepOrphansArgs) Kind() string { return "sweep_orphans" }

// InsertOpts: one sweep per interval however many nodes enqueue; a failed sweep is not retried
// (the next one comes soon).
func (SweepOrphansArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: 1, UniqueOpts: river.UniqueOpts{ByPeriod: SweepInterval}}
}

// SweepOrphansWorker runs the periodic sweep on whichever node picks it up.
type SweepOrphansWorker struct {
	river.WorkerDefaults[SweepOrphansArgs]
	deps Deps
}

// Work sweeps once.
func (w *SweepOrphansWorker) Work(ctx context.Context, job *river.Job[SweepOrphansArgs]) error {
	return sweepOrphans(ctx, w.deps, false)
}

// SweepOrphans is the startup sweep, run once by every working process after its River client
// started: the periodic sweep, plus killing what is left on this host of this node's runs that
// were orphaned (by any node) in the last reapWindow. d must carry the Executing the client was
// built with, claimed.
func SweepOrphans(ctx context.Context, d Deps) error {
	return sweepOrphans(ctx, d, true)
}

func sweepOrphans(ctx context.Context, d Deps, startup bool) error {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	ins, err := inserter(ctx, d)
	if err != nil {
		return fmt.Errorf("sweep orphans: %w", err)
	}
	s := sweeper{deps: d, log: d.Log.With("component", "sweep"), ins: ins}
	orphaned, err := s.orphans(ctx)
	errs := []error{err}
	var reaped int
	if startup {
		reaped, err = s.reapEnded(ctx)
		errs = append(errs, err)
	}
	settled, err := s.settleOperations(ctx)
	errs = append(errs, err, s.reportUnmanaged(ctx), s.sweepServices(ctx, startup), s.sweepStaging())
	level := slog.LevelDebug
	if orphaned+reaped+int(settled) > 0 || startup {
		level = slog.LevelInfo
	}
	s.log.Log(ctx, level, "orphan sweep", "startup", startup, "runs_orphaned", orphaned, "processes_killed", reaped,
		"operations_settled", settled)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sweep orphans: %w", err)
	}
	return nil
}

// jobClient is the part of a River client the sweep needs.
type jobClient interface {
	InsertTx(ctx context.Context, tx pgx.Tx, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error)
	JobCancelTx(ctx context.Context, tx pgx.Tx, jobID int64) (*rivertype.JobRow, error)
}

// inserter is the River client working the current job, or an insert-only one for a direct call.
func inserter(ctx context.Context, d Deps) (jobClient, error) {
	if c, err := river.ClientFromContextSafely[pgx.Tx](ctx); err == nil {
		return c, nil
	}
	return NewClient(d, ClientOptions{Work: false})
}

type sweeper struct {
	deps Deps
	log  *slog.Logger
	ins  jobClient
}

// runJobKinds are the jobs that carry a run to its end.
var runJobKinds = []string{ProvisionArgs{}.Kind(), ExecuteRunArgs{}.Kind()}

// unfinishedJobStates are the River states of a job that has not ended.
var unfinishedJobStates = []string{string(rivertype.JobStateAvailable), string(rivertype.JobStatePending),
	string(rivertype.JobStateRunning), string(rivertype.JobStateRetryable), string(rivertype.JobStateScheduled)}

// loadCandidates reads every live run with its unfinished run jobs, oldest first.
func loadCandidates(ctx context.Context, q db.Querier) ([]db.OrphanCandidate, error) {
	return db.OrphanCandidates(ctx, q, db.OrphanQuery{JobKinds: runJobKinds, JobStates: unfinishedJobStates,
		StaleAfter: staleAfter, QuietAfter: quietAfter, Limit: sweepBatch})
}

// verdict decides whether a live run is orphaned, and why. sole means this process is the only
// live one of its node.
func verdict(c db.OrphanCandidate, e *executing.Registry, sole bool) (reason string, orphaned bool) {
	if e.Has(c.ID) {
		return "", false
	}
	self := e.ClientID()
	for _, j := range c.Jobs {
		if j.State != string(rivertype.JobStateRunning) || (self != "" && j.Holder == self) {
			return "", false // waiting for a worker, or just fetched by this process
		}
	}
	if len(c.Jobs) == 0 {
		return reasonNoJob, c.Quiet
	}
	ours, old := sole, true
	for _, j := range c.Jobs {
		ours = ours && e.OwnsHolder(j.Holder)
		old = old && j.Old
	}
	switch {
	case ours:
		return reasonNodeRestarted, true
	case c.Stale && old:
		return reasonStale, true
	}
	return "", false
}

// orphans finds and ends orphaned runs; it returns how many it ended.
func (s *sweeper) orphans(ctx context.Context) (int, error) {
	var (
		cands []db.OrphanCandidate
		sole  bool
	)
	// The candidates are read while no other process of this node can start (or finish
	// claiming), so a running job under another client id of this node is a dead process's.
	err := s.deps.Executing.WhileSole(ctx, func(isSole bool) error {
		sole = isSole
		var err error
		cands, err = loadCandidates(ctx, s.deps.Pool)
		return err
	})
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	sp := spool.Of(s.deps.Data)
	for _, c := range cands {
		if sp.Has(c.ID) {
			continue // its executor's outcome waits in this node's spool, to be written (ReplaySpool)
		}
		reason, ok := verdict(c, s.deps.Executing, sole)
		if !ok {
			if r, would := verdict(c, s.deps.Executing, true); would && r == reasonNodeRestarted {
				runLogByID(ctx, s.log, s.deps.Pool, c.ID).Warn("a run of this node's dead process waits for the stale-heartbeat rule: another live process "+
					"claims this node id (give each working process its own BERTH_NODE_ID)", "node", s.deps.NodeID)
			}
			continue
		}
		ended, err := s.orphan(ctx, c, reason)
		if err != nil {
			errs = append(errs, fmt.Errorf("run %s: %w", c.ID, err))
		}
		if ended {
			n++
		}
	}
	return n, errors.Join(errs...)
}

// orphanMessage is what an orphaned run tells its reader.
func orphanMessage(reason, node string) string {
	switch reason {
	case reasonNodeRestarted:
		return fmt.Sprintf("The Berth process executing this run on node %s stopped (crash or restart) before the run ended.", node)
	case nodes.ReasonDead: // package jobs/nodes
		return fmt.Sprintf("Node %s, which held this run, stopped sending heartbeats and was declared dead; the run was settled by another node.", node)
	case reasonStale:
		return fmt.Sprintf("The run's executor (node %s) sent no heartbeat for more than %s.", node, staleAfter)
	default:
		return "No job was left to carry the run on (its provision or execution job ended without ending it)."
	}
}

// orphan kills the run's processes when they are on this host, then ends it as failed/orphaned
// (only if it is still as the sweep saw it: same status, no heartbeat since), settles its running
// steps, cancels the gone executor's jobs, audits, and enqueues finalize, all in one transaction.
func (s *sweeper) orphan(ctx context.Context, c db.OrphanCandidate, reason string) (bool, error) {
	run, err := db.RunForJob(ctx, s.deps.Pool, c.ID)
	if err != nil {
		return false, err
	}
	msg := orphanMessage(reason, run.NodeID)
	killed := 0
	if s.deps.NodeID != "" && run.NodeID == s.deps.NodeID {
		var kerr error
		if killed, kerr = environment.KillTagged(ctx, run.ID, killGrace); kerr != nil {
			runLog(s.log, run).Error("orphaned run's processes not all stopped", "err", kerr)
			msg += " Some of its processes could not be stopped."
		}
	}
	code := codeOrphaned
	ended := false
	err = db.InTx(ctx, s.deps.Pool, func(tx pgx.Tx) error {
		now, err := db.LockRun(ctx, tx, run.ID)
		if err != nil {
			return err
		}
		if now.Status != c.Status || !sameTime(now.HeartbeatAt, c.Heartbeat) {
			return nil // it moved on, or an executor showed signs of life: not an orphan
		}
		r, err := db.TransitionRun(ctx, tx, run.ID, []string{c.Status}, db.RunFailed,
			db.RunUpdate{ErrorCode: &code, ErrorMessage: &msg, Finished: true})
		if err != nil {
			return err
		}
		if err := db.FailRunOperations(ctx, tx, run.ID); err != nil {
			return err
		}
		for _, j := range c.Jobs { // all running, under a client that is gone (see verdict)
			if _, err := s.ins.JobCancelTx(ctx, tx, j.ID); err != nil && !errors.Is(err, river.ErrNotFound) {
				return fmt.Errorf("cancel job %d: %w", j.ID, err)
			}
		}
		if err := db.InsertAudit(ctx, tx, db.AuditEvent{CompanyID: r.CompanyID, ActorType: db.ActorSystem,
			ActorLabel: "orphan sweep", Action: "run.orphaned", TargetType: "run", TargetID: r.ID,
			Details: map[string]any{"reason": reason, "node": r.NodeID, "swept_by": s.deps.NodeID,
				"previous_status": c.Status, "processes_killed": killed}}); err != nil {
			return err
		}
		if err := db.MarkFinalizePending(ctx, tx, r); err != nil {
			return err
		}
		if _, err := Enqueue(ctx, s.ins, tx, FinalizeArgs{RunID: r.ID}); err != nil {
			return fmt.Errorf("enqueue finalize: %w", err)
		}
		ended = true
		return nil
	})
	if err != nil {
		return false, err
	}
	if ended {
		runLog(s.log, run).Warn("run orphaned", "reason", reason, "node", run.NodeID, "status_was", c.Status,
			"processes_killed", killed)
	}
	return ended, nil
}

// sameTime compares two optional timestamps.
func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Equal(*b)
}

// reapEnded kills what is left on this host of this node's runs orphaned in the last reapWindow
// (by this node before it died, or by another node while this one was down). It returns how
// many processes it signalled.
func (s *sweeper) reapEnded(ctx context.Context) (int, error) {
	if s.deps.NodeID == "" {
		return 0, nil
	}
	ids, err := db.NodeRunsEndedWith(ctx, s.deps.Pool, s.deps.NodeID, codeOrphaned, reapWindow, reapBatch)
	if err != nil {
		return 0, fmt.Errorf("orphaned runs: %w", err)
	}
	total := 0
	var errs []error
	for _, id := range ids {
		n, err := environment.KillTagged(ctx, id, killGrace)
		total += n
		if err != nil {
			errs = append(errs, fmt.Errorf("run %s: %w", id, err))
		}
		if n > 0 {
			runLogByID(ctx, s.log, s.deps.Pool, id).Warn("killed processes of an orphaned run", "processes", n)
		}
	}
	return total, errors.Join(errs...)
}

// preparationPhases are the ledger steps that happen while their run is live (the rest, finalize
// and what follows it, legitimately run after the run ended).
var preparationPhases = []string{"source_prepare", "realize", "setup", "upload"}

// settleOperations marks ledger steps whose executor is gone as failed: any step running for
// over stuckOperationAge, and a run's preparation step still running deadRunOperationAge after it
// started when its run has ended.
func (s *sweeper) settleOperations(ctx context.Context) (int64, error) {
	n, err := db.SettleStuckOperations(ctx, s.deps.Pool, stuckOperationAge)
	if err != nil {
		return 0, err
	}
	m, err := db.SettleEndedRunOperations(ctx, s.deps.Pool, preparationPhases, deadRunOperationAge)
	return n + m, err
}

// SweepImageStaging removes what killed imports left under <data dir>/images/<environment>/:
// capsule-import, OCI-import and OCI-extraction staging directories of processes that are gone
// (workspace.SweepStaging). The startup sweep and every periodic sweep run it.
func SweepImageStaging(data datadir.Layout) (int, error) {
	if data.Root == "" {
		return 0, nil
	}
	dirs, err := filepath.Glob(filepath.Join(data.Images(), "*"))
	if err != nil {
		return 0, err
	}
	total := 0
	var errs []error
	for _, d := range dirs {
		n, err := workspace.SweepStaging(d)
		total += n
		errs = append(errs, err)
	}
	return total, errors.Join(errs...)
}

// sweepStaging runs SweepImageStaging and logs what it removed.
func (s *sweeper) sweepStaging() error {
	n, err := SweepImageStaging(s.deps.Data)
	if n > 0 {
		s.log.Info("removed staging directories of killed imports", "count", n)
	}
	return err
}
