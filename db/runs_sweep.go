package db

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Runs as the orphan sweep sees them, and what a run records about its egress and finalize.

// OrphanCandidate is a live run with its unfinished run jobs, as one statement saw it: what the
// orphan sweep judges (docs/runs.md "Crash recovery").
type OrphanCandidate struct {
	ID        string
	Status    string
	NodeID    string
	Heartbeat *time.Time
	Stale     bool // no heartbeat for OrphanQuery.StaleAfter
	Quiet     bool // no heartbeat for OrphanQuery.QuietAfter
	Jobs      []CandidateJob
}

// CandidateJob is an unfinished River job of a live run.
type CandidateJob struct {
	ID     int64
	State  string // River job state
	Holder string // the client id of its latest attempt ("" if never attempted)
	Old    bool   // its latest attempt (or its insert) is older than OrphanQuery.StaleAfter
}

// OrphanQuery says which jobs carry a run and what counts as old for OrphanCandidates.
type OrphanQuery struct {
	JobKinds   []string // the River kinds that carry a run to its end (their args hold run_id)
	JobStates  []string // the River states of a job that has not ended
	StaleAfter time.Duration
	QuietAfter time.Duration
	Limit      int
}

// OrphanCandidates reads up to q.Limit live runs, oldest first, each with its jobs of q.JobKinds
// in q.JobStates, and the heartbeat and attempt ages judged on the database clock.
func OrphanCandidates(ctx context.Context, q Querier, o OrphanQuery) ([]OrphanCandidate, error) {
	rows, err := q.Query(ctx, `SELECT r.id::text, r.status, r.node_id, r.heartbeat_at,
			coalesce(r.heartbeat_at, r.created_at) < now() - $1::interval,
			coalesce(r.heartbeat_at, r.created_at) < now() - $2::interval,
			coalesce(array_agg(j.id ORDER BY j.id) FILTER (WHERE j.id IS NOT NULL), '{}'),
			coalesce(array_agg(j.state::text ORDER BY j.id) FILTER (WHERE j.id IS NOT NULL), '{}'),
			coalesce(array_agg(coalesce(j.attempted_by[array_upper(j.attempted_by, 1)], '') ORDER BY j.id)
				FILTER (WHERE j.id IS NOT NULL), '{}'),
			coalesce(array_agg(coalesce(j.attempted_at, j.created_at) < now() - $1::interval ORDER BY j.id)
				FILTER (WHERE j.id IS NOT NULL), '{}')
		FROM runs r
		LEFT JOIN river_job j ON j.args->>'run_id' = r.id::text AND j.kind = ANY($3)
			AND j.state = ANY($4::river_job_state[])
		WHERE r.status = ANY($5)
		GROUP BY r.id
		ORDER BY r.created_at
		LIMIT $6`, o.StaleAfter, o.QuietAfter, o.JobKinds, o.JobStates, LiveRunStatuses, o.Limit)
	if err != nil {
		return nil, fmt.Errorf("live runs: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (OrphanCandidate, error) {
		var (
			c       OrphanCandidate
			ids     []int64
			states  []string
			holders []string
			old     []bool
		)
		if err := row.Scan(&c.ID, &c.Status, &c.NodeID, &c.Heartbeat, &c.Stale, &c.Quiet, &ids, &states, &holders, &old); err != nil {
			return c, err
		}
		for i := range states {
			c.Jobs = append(c.Jobs, CandidateJob{ID: ids[i], State: states[i], Holder: holders[i], Old: old[i]})
		}
		return c, nil
	})
}

// SetRunEgress stores what a run reached and was refused through the egress proxy (a JSON
// document written once the run's command ended).
func SetRunEgress(ctx context.Context, q Querier, runID string, doc []byte) error {
	if _, err := q.Exec(ctx, `UPDATE runs SET egress = $2 WHERE id = $1`, runID, doc); err != nil {
		return fmt.Errorf("set run egress: %w", err)
	}
	return nil
}

// RunEgress is the egress document of a company's run (nil when it recorded none).
func RunEgress(ctx context.Context, q Querier, companyID, runID string) ([]byte, error) {
	var doc []byte
	err := q.QueryRow(ctx, `SELECT egress FROM runs WHERE company_id = $1 AND id = $2`, companyID, runID).Scan(&doc)
	if err != nil {
		return nil, notFound(err)
	}
	return doc, nil
}

// SetRunFinalize records how a run's finalize stands: pending (with the last attempt's error,
// if any), settled or failed (with why).
func SetRunFinalize(ctx context.Context, q Querier, runID, state, errMsg string) error {
	if len(errMsg) > 2000 {
		errMsg = errMsg[:2000]
	}
	if _, err := q.Exec(ctx, `UPDATE runs SET finalize_state = $2, finalize_error = $3 WHERE id = $1`, runID, state, errMsg); err != nil {
		return fmt.Errorf("set run finalize: %w", err)
	}
	return nil
}

// MarkFinalizePending says, in the transaction that ends a run, that its finalize is to come: the
// run's workspace (when it has one) and the run itself read finalize pending. A run without a
// workspace has nothing to finalize there and is left as it is.
func MarkFinalizePending(ctx context.Context, q Querier, run Run) error {
	if run.ExecutionWorkspaceID == "" {
		return nil
	}
	if err := SetFinalizeState(ctx, q, run.ExecutionWorkspaceID, "pending"); err != nil {
		return err
	}
	return SetRunFinalize(ctx, q, run.ID, "pending", "")
}

// RunFinalize is how a company's run's finalize stands, and the error of its last failed attempt.
func RunFinalize(ctx context.Context, q Querier, companyID, runID string) (state, errMsg string, err error) {
	err = q.QueryRow(ctx, `SELECT finalize_state, finalize_error FROM runs WHERE company_id = $1 AND id = $2`, companyID, runID).
		Scan(&state, &errMsg)
	return state, errMsg, notFound(err)
}
