package db

import (
	"context"
	"fmt"
)

// Metric series MetricCounts returns (MetricCount.Series).
const (
	MetricRuns              = "runs"                // Label1: status
	MetricLeases            = "leases"              // Label1: status
	MetricJobs              = "jobs"                // Label1: kind, Label2: River state
	MetricRuntimeServices   = "runtime_services"    // Label1: status, Label2: health
	MetricLeaseHeartbeatAge = "lease_heartbeat_age" // seconds since the stalest active lease's heartbeat
)

// MetricCount is one value of a database-backed gauge: its series, up to two label values, and
// the value.
type MetricCount struct {
	Series string
	Label1 string
	Label2 string
	Value  float64
}

// The statuses (and service healths) the tables allow (their CHECK constraints): a value with no
// rows reads 0 instead of vanishing from the scrape.
var (
	metricRunStatuses     = []string{RunQueued, RunPreparing, RunRunning, RunSucceeded, RunFailed, RunCancelled, RunTimedOut}
	metricLeaseStatuses   = []string{LeaseAcquiring, LeaseActive, LeaseReleasing, LeaseReleased, LeaseExpired, LeaseFailed}
	metricServiceStatuses = []string{ServiceStarting, ServiceRunning, ServiceStopping, ServiceStopped, ServiceFailed}
	metricServiceHealths  = []string{HealthUnknown, HealthHealthy, HealthUnhealthy}
)

// MetricCounts reads every database-backed gauge of GET /metrics in one statement (one round
// trip): runs by status, leases by status, River jobs by kind and state, runtime services by
// status and health, and the heartbeat age of the stalest active lease (0 with none active; a
// lease that never heartbeat counts from its creation). It reads across all companies: only
// instance admins and the metrics token see it.
func MetricCounts(ctx context.Context, q Querier) ([]MetricCount, error) {
	rows, err := q.Query(ctx, `
SELECT 'runs', k.s, '', count(r.id)::float8
	FROM unnest($1::text[]) AS k(s) LEFT JOIN runs r ON r.status::text = k.s GROUP BY k.s
UNION ALL
SELECT 'leases', k.s, '', count(l.id)::float8
	FROM unnest($2::text[]) AS k(s) LEFT JOIN environment_leases l ON l.status::text = k.s GROUP BY k.s
UNION ALL
SELECT 'jobs', kind, state::text, count(*)::float8 FROM river_job GROUP BY kind, state
UNION ALL
SELECT 'runtime_services', st.s, h.s, count(rs.id)::float8
	FROM unnest($3::text[]) AS st(s) CROSS JOIN unnest($4::text[]) AS h(s)
	LEFT JOIN runtime_services rs ON rs.status::text = st.s AND rs.health::text = h.s GROUP BY st.s, h.s
UNION ALL
SELECT 'lease_heartbeat_age', '', '',
	COALESCE(EXTRACT(EPOCH FROM max(now() - COALESCE(heartbeat_at, created_at))), 0)::float8
	FROM environment_leases WHERE status = 'active'`, metricRunStatuses, metricLeaseStatuses,
		metricServiceStatuses, metricServiceHealths)
	if err != nil {
		return nil, fmt.Errorf("metric counts: %w", err)
	}
	defer rows.Close()
	var out []MetricCount
	for rows.Next() {
		var m MetricCount
		if err := rows.Scan(&m.Series, &m.Label1, &m.Label2, &m.Value); err != nil {
			return nil, fmt.Errorf("metric counts: %w", err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("metric counts: %w", err)
	}
	return out, nil
}
