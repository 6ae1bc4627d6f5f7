package db

import (
	"context"
	"fmt"
)

// RecoveryDue says which periodic recovery job has something to do now (jobs/periodic.go asks
// before the leader enqueues one). Each flag is the question its job's own query asks, so a
// false flag means the job would change nothing.
type RecoveryDue struct {
	// Leases: a live lease is past its expires_at (expire_leases).
	Leases bool
	// SetupSessions: a live setup session is past its expiry (expire_setup_sessions).
	SetupSessions bool
	// Live: a run is live, a ledger step is running, or a runtime service is live or wanted
	// running (sweep_orphans: nothing else can be orphaned, stuck or out of step).
	Live bool
}

// RecoveryDueNow answers RecoveryDue in one statement, over the partial indexes of live rows.
func RecoveryDueNow(ctx context.Context, q Querier) (RecoveryDue, error) {
	var d RecoveryDue
	err := q.QueryRow(ctx, `SELECT
		EXISTS (SELECT 1 FROM environment_leases WHERE status IN ('acquiring', 'active', 'releasing') AND expires_at < now()),
		EXISTS (SELECT 1 FROM image_setup_sessions WHERE status IN ('starting', 'waiting_for_user') AND expires_at <= now()),
		EXISTS (SELECT 1 FROM runs WHERE status = ANY($1))
			OR EXISTS (SELECT 1 FROM workspace_operations WHERE status = 'running')
			OR EXISTS (SELECT 1 FROM runtime_services WHERE status IN ('starting', 'running', 'stopping') OR desired_state = 'running')`,
		LiveRunStatuses).Scan(&d.Leases, &d.SetupSessions, &d.Live)
	if err != nil {
		return RecoveryDue{}, fmt.Errorf("recovery due: %w", err)
	}
	return d, nil
}
