package db

import (
	"context"
	"fmt"
)

// NotifyJobQueue tells the nodes working River queue that a job is waiting, at q's commit
// (jobs.Enqueue calls it for every insert). River notifies too, but skips an insert's
// notification when its process notified that queue within FetchCooldown (marked at insert,
// before the commit), and the earlier notification's fetch can run before this job commits: the
// job would wait for the fallback poll. The channel and payload are River's own (v0.51:
// "<schema>.river_insert", {"queue": "<name>"}), so PostgreSQL folds the two into one when River
// sent its own in the same transaction (jobs.TestEnqueueNotifiesEveryInsert).
func NotifyJobQueue(ctx context.Context, q Querier, queue string) error {
	_, err := q.Exec(ctx, `SELECT pg_notify(current_schema() || '.river_insert', $1)`, fmt.Sprintf("{\"queue\": %q}", queue))
	if err != nil {
		return fmt.Errorf("notify job queue %s: %w", queue, err)
	}
	return nil
}
