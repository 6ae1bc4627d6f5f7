package backup

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Settled counts what a restore settled.
type Settled struct {
	Runs, Operations, Leases, Workspaces, Services, SetupSessions, ImageVersions, Jobs int64
}

// settle ends, in one transaction, everything the restored database says is in progress: none of
// it has a process, a lease holder or a workspace directory behind it any more (workspaces are
// not backed up; the jobs that would carry it on belong to processes of the old instance). After
// it no row is half-alive: runs are failed/orphaned with the reason, leases released, isolated
// workspaces closed (reopen rebuilds them from their branches), services stopped, setup sessions
// failed, building image versions failed, and River jobs that had not finished cancelled with the
// reason in their errors (visible on /admin/jobs).
func settle(ctx context.Context, tx pgx.Tx, takenAt time.Time) (Settled, error) {
	var s Settled
	reason := fmt.Sprintf("Restored from the backup of %s: the run was %%s then, and nothing of it survived the restore "+
		"(processes, lease, workspace files).", takenAt.UTC().Format(time.RFC3339))
	steps := []struct {
		n   *int64
		sql string
		arg []any
	}{
		{&s.Runs, `UPDATE runs SET error_message = format($1, status), status = 'failed', error_code = 'orphaned',
			finished_at = coalesce(finished_at, now()),
			finalize_state = CASE WHEN finalize_state = 'settled' THEN finalize_state ELSE 'failed' END,
			finalize_error = CASE WHEN finalize_state = 'settled' THEN finalize_error ELSE 'the workspace is not in backups' END
			WHERE status IN ('queued', 'preparing', 'running')`, []any{reason}},
		{nil, `UPDATE runs SET finalize_state = 'failed', finalize_error = 'restored from a backup before finalize settled; the workspace is not in backups'
			WHERE finalize_state = 'pending'`, nil},
		{&s.Operations, `UPDATE workspace_operations SET status = 'failed', finished_at = coalesce(finished_at, now()),
			error = 'ended by restore from backup' WHERE status = 'running'`, nil},
		{&s.Leases, `UPDATE environment_leases l SET status = 'released', released_at = coalesce(released_at, now()),
			failure_reason = 'released by restore from backup',
			cleanup_status = (CASE WHEN e.driver IN ('local', 'sandbox') THEN 'succeeded' ELSE 'failed' END)::lease_cleanup_status
			FROM environments e WHERE e.id = l.environment_id AND (l.status IN ('acquiring', 'active', 'releasing')
				OR l.cleanup_status = 'pending')`, nil},
		{nil, `UPDATE environment_leases SET status = 'released', released_at = coalesce(released_at, now()),
			failure_reason = 'released by restore from backup', cleanup_status = 'succeeded'
			WHERE environment_id IS NULL AND (status IN ('acquiring', 'active', 'releasing') OR cleanup_status = 'pending')`, nil},
		{&s.Workspaces, `UPDATE execution_workspaces SET status = 'closed', closed_at = coalesce(closed_at, now()),
			generation = generation + 1,
			finalize_state = CASE WHEN finalize_state = 'pending' THEN 'failed' ELSE finalize_state END,
			cleanup_reason = 'restored from backup: workspace files are not in backups; reopen rebuilds it from its branch'
			WHERE status <> 'closed' AND strategy <> 'shared'`, nil},
		{nil, `UPDATE execution_workspaces SET finalize_state = 'failed' WHERE finalize_state = 'pending'`, nil},
		{&s.Services, `UPDATE runtime_services SET status = 'stopped', desired_state = 'stopped', health = 'unknown', pid = NULL
			WHERE status IN ('starting', 'running', 'stopping') OR desired_state = 'running'`, nil},
		{&s.SetupSessions, `UPDATE image_setup_sessions SET status = 'failed'
			WHERE status IN ('starting', 'waiting_for_user', 'capturing')`, nil},
		{&s.ImageVersions, `UPDATE image_versions SET status = 'failed' WHERE status = 'building'`, nil},
		{&s.Jobs, `UPDATE river_job SET state = 'cancelled', finalized_at = now(),
			errors = coalesce(errors, '{}') || jsonb_build_object('at', now(), 'attempt', attempt,
				'error', 'cancelled by restore from backup: the instance that enqueued it is gone', 'trace', '')
			WHERE state NOT IN ('completed', 'cancelled', 'discarded')`, nil},
	}
	for _, st := range steps {
		tag, err := tx.Exec(ctx, st.sql, st.arg...)
		if err != nil {
			return s, fmt.Errorf("settle: %w", err)
		}
		if st.n != nil {
			*st.n += tag.RowsAffected()
		}
	}
	_, err := tx.Exec(ctx, `INSERT INTO audit_events (actor_type, actor_label, action, target_type, details)
		VALUES ('system', 'berth restore', 'instance.restored', 'instance', $1)`,
		map[string]any{"backup_created_at": takenAt.UTC(), "runs_orphaned": s.Runs, "leases_released": s.Leases,
			"workspaces_closed": s.Workspaces, "services_stopped": s.Services, "jobs_cancelled": s.Jobs})
	if err != nil {
		return s, fmt.Errorf("settle: audit: %w", err)
	}
	return s, nil
}
