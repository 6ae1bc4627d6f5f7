package db

import (
	"context"
	"fmt"
	"sync"
	"time"
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
	err := q.QueryRow(ctx, `SELECT `+recoveryDueColumns("$1", "$2"), time.Duration(0), LiveRunStatuses).
		Scan(&d.Leases, &d.SetupSessions, &d.Live)
	if err != nil {
		return RecoveryDue{}, fmt.Errorf("recovery due: %w", err)
	}
	return d, nil
}

// recoveryDueColumns is RecoveryDue as three SQL columns, for RecoveryDueNow and HeartbeatNode.
// ahead names the statement's interval parameter: what expires within it counts as due already,
// so an answer holds for that long. statuses names its LiveRunStatuses parameter.
func recoveryDueColumns(ahead, statuses string) string {
	return `EXISTS (SELECT 1 FROM environment_leases WHERE status IN ('acquiring', 'active', 'releasing')
			AND expires_at < now() + ` + ahead + `::interval),
		EXISTS (SELECT 1 FROM image_setup_sessions WHERE status IN ('starting', 'waiting_for_user')
			AND expires_at <= now() + ` + ahead + `::interval),
		EXISTS (SELECT 1 FROM runs WHERE status = ANY(` + statuses + `))
			OR EXISTS (SELECT 1 FROM workspace_operations WHERE status = 'running')
			OR EXISTS (SELECT 1 FROM runtime_services WHERE status IN ('starting', 'running', 'stopping') OR desired_state = 'running')`
}

// RecoveryMemo holds the last RecoveryDue a node heartbeat answered, until it may have gone
// stale, so the periodic gate on the same process need not ask again (BenchmarkIdleServer: one
// transaction fewer per tick). A nil memo holds nothing.
type RecoveryMemo struct {
	mu    sync.Mutex
	due   RecoveryDue
	until time.Time
}

// Note keeps d as the answer until until.
func (m *RecoveryMemo) Note(d RecoveryDue, until time.Time) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.due, m.until = d, until
}

// Fresh is the kept answer and whether it still holds at now.
func (m *RecoveryMemo) Fresh(now time.Time) (RecoveryDue, bool) {
	if m == nil {
		return RecoveryDue{}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.due, now.Before(m.until)
}
