package db

import (
	"context"
	"fmt"
)

// Counts are the figures on the dashboard.
type Counts struct {
	Companies    int
	Projects     int // active projects
	OpenTasks    int // todo, in progress or in review
	DoneTasks    int
	Environments int // active environments
	Members      int // distinct people across the companies
	AuditEvents  int // in the last 24 hours
	QueuedJobs   int
	RunningJobs  int
	FailedJobs24 int
}

// DashboardCounts counts what a user can see: the companies they belong to (every company for
// an instance admin), those companies' active projects, open and done tasks, active environments
// and members, their audit events of the last 24 hours (plus instance-level events for admins),
// and for instance admins the job queue.
func DashboardCounts(ctx context.Context, q Querier, userID string, instanceAdmin bool) (Counts, error) {
	var c Counts
	err := q.QueryRow(ctx, `WITH visible AS (
			SELECT id FROM companies WHERE $2 OR id IN (SELECT company_id FROM memberships WHERE user_id = $1))
		SELECT
			(SELECT count(*) FROM visible),
			(SELECT count(*) FROM projects WHERE company_id IN (SELECT id FROM visible) AND status = 'active'),
			(SELECT count(*) FROM tasks WHERE company_id IN (SELECT id FROM visible) AND status IN ('todo', 'in_progress', 'in_review')),
			(SELECT count(*) FROM tasks WHERE company_id IN (SELECT id FROM visible) AND status = 'done'),
			(SELECT count(*) FROM environments WHERE company_id IN (SELECT id FROM visible) AND status = 'active'),
			(SELECT count(DISTINCT user_id) FROM memberships WHERE company_id IN (SELECT id FROM visible)),
			(SELECT count(*) FROM audit_events WHERE (company_id IN (SELECT id FROM visible) OR ($2 AND company_id IS NULL))
				AND at > now() - interval '24 hours'),
			CASE WHEN $2 THEN (SELECT count(*) FROM river_job WHERE state IN ('available', 'scheduled', 'retryable')) ELSE 0 END,
			CASE WHEN $2 THEN (SELECT count(*) FROM river_job WHERE state = 'running') ELSE 0 END,
			CASE WHEN $2 THEN (SELECT count(*) FROM river_job WHERE state = 'discarded' AND finalized_at > now() - interval '24 hours') ELSE 0 END`,
		userID, instanceAdmin).Scan(&c.Companies, &c.Projects, &c.OpenTasks, &c.DoneTasks, &c.Environments,
		&c.Members, &c.AuditEvents, &c.QueuedJobs, &c.RunningJobs, &c.FailedJobs24)
	if err != nil {
		return Counts{}, fmt.Errorf("dashboard counts: %w", err)
	}
	return c, nil
}
