package db

// The writes after AcquireLease: the holder's (heartbeat, release, fail, provider ref, cleanup,
// delete), each fenced by the generation it holds; the sweeper's expiry; and the instance
// administrator's force release and cleanup retry. See leases.go for the state machine.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// HeartbeatLease extends a live lease the caller holds at generation gen to expire ttl from now
// (database clock) and returns it; a lost lease is ErrFenced. A lease past expires_at that the
// sweeper has not yet expired is still the holder's (no one else can hold it and no cleanup has
// started), so a late heartbeat keeps it.
func HeartbeatLease(ctx context.Context, q Querier, id string, gen int64, ttl time.Duration) (Lease, error) {
	if ttl <= 0 {
		return Lease{}, fmt.Errorf("heartbeat lease %s: ttl %v is not positive", id, ttl)
	}
	return fencedWrite(ctx, q, "heartbeat", id, gen, `UPDATE environment_leases AS l
		SET heartbeat_at = now(), expires_at = now() + $3::interval
		WHERE l.id = $1 AND l.generation = $2 AND l.status IN ('acquiring', 'active', 'releasing')
		RETURNING `+leaseColumns, ttl)
}

// ReleaseLease ends the live lease l that the caller holds, at l.Generation: released, with the
// reason and a pending cleanup at the same generation (enqueue the cleanup job in the same
// transaction). It returns l as released: the fields the release sets (Status, ReleasedAt,
// CleanupStatus, FailureReason, ReadAt) come from the database, the others are the caller's copy.
// Only those are read back because a release is on every run's path. A lost or already ended
// lease is ErrFenced.
func ReleaseLease(ctx context.Context, q Querier, l Lease, reason string) (Lease, error) {
	var released time.Time
	err := fencedRow(ctx, q, "release", l.ID, l.Generation, func() error {
		return q.QueryRow(ctx, `UPDATE environment_leases
			SET status = 'released', released_at = now(), cleanup_status = 'pending', failure_reason = $3
			WHERE id = $1 AND generation = $2 AND status IN ('acquiring', 'active', 'releasing')
			RETURNING released_at, statement_timestamp()`, l.ID, l.Generation, reason).Scan(&released, &l.ReadAt)
	})
	if err != nil {
		return Lease{}, err
	}
	l.Status, l.ReleasedAt, l.CleanupStatus, l.FailureReason = LeaseReleased, &released, LeaseCleanupPending, reason
	return l, nil
}

// FailLease ends a live lease the caller holds at generation gen as failed (the environment could
// not be provisioned or was lost), with the reason and a pending cleanup. A lost or already ended
// lease is ErrFenced.
func FailLease(ctx context.Context, q Querier, id string, gen int64, reason string) (Lease, error) {
	return fencedWrite(ctx, q, "fail", id, gen, `UPDATE environment_leases AS l
		SET status = 'failed', released_at = now(), cleanup_status = 'pending', failure_reason = $3
		WHERE l.id = $1 AND l.generation = $2 AND l.status IN ('acquiring', 'active', 'releasing')
		RETURNING `+leaseColumns, reason)
}

// SetLeaseProviderRef records which provider instance (sandbox, remote directory…) a live lease at
// generation gen occupies, so cleanup can find it after a crash. A lost lease is ErrFenced.
func SetLeaseProviderRef(ctx context.Context, q Querier, id string, gen int64, ref string) (Lease, error) {
	return fencedWrite(ctx, q, "set provider ref", id, gen, `UPDATE environment_leases AS l
		SET provider_ref = $3
		WHERE l.id = $1 AND l.generation = $2 AND l.status IN ('acquiring', 'active', 'releasing')
		RETURNING `+leaseColumns, ref)
}

// MarkLeaseCleanup records one cleanup attempt of an ended lease at generation gen: succeeded, or
// failed with the reason (kept in FailureReason); attempts + 1 either way. It applies while cleanup
// is pending or failed (a retried job may mark again after a failure); a live lease, a finished
// cleanup or a stale generation is ErrFenced.
func MarkLeaseCleanup(ctx context.Context, q Querier, id string, gen int64, ok bool, reason string) (Lease, error) {
	return fencedWrite(ctx, q, "mark cleanup", id, gen, `UPDATE environment_leases AS l
		SET cleanup_status = (CASE WHEN $3 THEN 'succeeded' ELSE 'failed' END)::lease_cleanup_status,
			cleanup_attempts = l.cleanup_attempts + 1,
			failure_reason = CASE WHEN $3 THEN l.failure_reason ELSE $4 END
		WHERE l.id = $1 AND l.generation = $2 AND l.status IN ('released', 'expired', 'failed')
			AND l.cleanup_status IN ('pending', 'failed')
		RETURNING `+leaseColumns, ok, reason)
}

// DeleteLease removes an ended lease whose cleanup succeeded, at generation gen. A live lease, a
// lease whose instance may still exist (cleanup pending or failed) or a stale generation is
// ErrFenced and stays.
func DeleteLease(ctx context.Context, q Querier, id string, gen int64) error {
	if !validUUID(id) {
		return fmt.Errorf("delete lease %s: %w", id, ErrNotFound)
	}
	tag, err := q.Exec(ctx, `DELETE FROM environment_leases
		WHERE id = $1 AND generation = $2 AND status IN ('released', 'expired', 'failed')
			AND cleanup_status = 'succeeded'`, id, gen)
	if err != nil {
		return fmt.Errorf("delete lease %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fenced(ctx, q, "delete", id, gen)
	}
	return nil
}

// fencedWrite runs one conditional UPDATE … RETURNING leaseColumns on (id, generation) with args
// after them and turns "no row" into ErrFenced plus its audit event.
func fencedWrite(ctx context.Context, q Querier, op, id string, gen int64, sql string, args ...any) (Lease, error) {
	var l Lease
	err := fencedRow(ctx, q, op, id, gen, func() (err error) {
		l, err = scanLease(q.QueryRow(ctx, sql, append([]any{id, gen}, args...)...))
		return err
	})
	return l, err
}

// fencedRow runs write, a conditional write on (id, generation) that reads back one row, and turns
// "no row" into ErrFenced plus its audit event; other errors are wrapped with op.
func fencedRow(ctx context.Context, q Querier, op, id string, gen int64, write func() error) error {
	if !validUUID(id) {
		return fmt.Errorf("%s lease %s: %w", op, id, ErrNotFound)
	}
	err := write()
	if errors.Is(err, ErrNotFound) || errors.Is(err, pgx.ErrNoRows) {
		return fenced(ctx, q, op, id, gen)
	}
	if err != nil {
		return fmt.Errorf("%s lease %s: %w", op, id, err)
	}
	return nil
}

// fenced records the lease.fenced audit event for a refused write, in its own statement after the
// update that matched nothing, and returns the ErrFenced error for op.
func fenced(ctx context.Context, q Querier, op, id string, gen int64) error {
	details := map[string]any{"op": op, "presented_generation": gen}
	var companyID, status, cleanup string
	var current int64
	err := q.QueryRow(ctx, `SELECT company_id::text, status, generation, cleanup_status
		FROM environment_leases WHERE id = $1`, id).Scan(&companyID, &status, &current, &cleanup)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		details["current_status"] = "missing"
	case err != nil:
		return fmt.Errorf("%s lease %s: %w; reading it for the audit: %w", op, id, ErrFenced, err)
	default:
		details["current_generation"] = current
		details["current_status"] = status
		details["cleanup_status"] = cleanup
	}
	if err := InsertAudit(ctx, q, AuditEvent{CompanyID: companyID, ActorType: ActorSystem, ActorLabel: "lease store",
		Action: "lease.fenced", TargetType: "environment_lease", TargetID: id, Details: details}); err != nil {
		return fmt.Errorf("%s lease %s: %w; %w", op, id, ErrFenced, err)
	}
	return fmt.Errorf("%s lease %s: %w", op, id, ErrFenced)
}

// ExpireLeases ends up to limit live leases whose expires_at has passed on the database clock:
// expired, generation + 1 (so the holder that stopped heartbeating is fenced out) and cleanup
// pending. It returns them, at their new generation, for the caller to enqueue cleanup. Rows are
// claimed with FOR UPDATE SKIP LOCKED, so several workers can sweep at once and each lease is
// expired exactly once. A lease without expires_at never expires (this store always sets one).
func ExpireLeases(ctx context.Context, q Querier, limit int) ([]Lease, error) {
	rows, err := q.Query(ctx, `WITH due AS (
			SELECT id FROM environment_leases
			WHERE status IN ('acquiring', 'active', 'releasing') AND expires_at < now()
			ORDER BY expires_at
			LIMIT $1
			FOR UPDATE SKIP LOCKED)
		UPDATE environment_leases AS l
		SET status = 'expired', generation = l.generation + 1, released_at = now(),
			cleanup_status = 'pending', failure_reason = 'expired: no heartbeat before expires_at'
		FROM due WHERE l.id = due.id
		RETURNING `+leaseColumns, limit)
	if err != nil {
		return nil, fmt.Errorf("expire leases: %w", err)
	}
	leases, err := collectLeases(rows)
	if err != nil {
		return nil, fmt.Errorf("expire leases: %w", err)
	}
	return leases, nil
}

// ForceReleaseLease is the instance administrator's release of a company's live lease: released,
// generation + 1 (its holder is fenced out from now on) and cleanup pending. An ended lease is
// ErrLeaseState; another company's is ErrNotFound. The caller audits who did it.
func ForceReleaseLease(ctx context.Context, q Querier, companyID, id string) (Lease, error) {
	return adminWrite(ctx, q, "force release", companyID, id, `UPDATE environment_leases AS l
		SET status = 'released', generation = l.generation + 1, released_at = now(), cleanup_status = 'pending',
			failure_reason = 'force released by an instance administrator'
		WHERE l.company_id = $1 AND l.id = $2 AND l.status IN ('acquiring', 'active', 'releasing')
		RETURNING `+leaseColumns)
}

// RetryLeaseCleanup puts a company's lease whose cleanup failed back to pending (attempts are
// kept), for the caller to enqueue a cleanup job at the returned generation. A lease whose cleanup
// did not fail is ErrLeaseState; another company's is ErrNotFound.
func RetryLeaseCleanup(ctx context.Context, q Querier, companyID, id string) (Lease, error) {
	return adminWrite(ctx, q, "retry cleanup", companyID, id, `UPDATE environment_leases AS l
		SET cleanup_status = 'pending'
		WHERE l.company_id = $1 AND l.id = $2 AND l.status IN ('released', 'expired', 'failed')
			AND l.cleanup_status = 'failed'
		RETURNING `+leaseColumns)
}

// adminWrite runs an administrator's conditional UPDATE on (company, id) and tells a lease in the
// wrong state (ErrLeaseState) from one that is not the company's (ErrNotFound).
func adminWrite(ctx context.Context, q Querier, op, companyID, id, sql string) (Lease, error) {
	if !validUUID(id) || !validUUID(companyID) {
		return Lease{}, fmt.Errorf("%s lease %s: %w", op, id, ErrNotFound)
	}
	l, err := scanLease(q.QueryRow(ctx, sql, companyID, id))
	if errors.Is(err, ErrNotFound) {
		cur, err := LeaseByID(ctx, q, companyID, id)
		if err != nil {
			return Lease{}, fmt.Errorf("%s lease %s: %w", op, id, err)
		}
		return Lease{}, fmt.Errorf("%s lease %s (%s, cleanup %s): %w", op, id, cur.Status, cur.CleanupStatus, ErrLeaseState)
	}
	if err != nil {
		return Lease{}, fmt.Errorf("%s lease %s: %w", op, id, err)
	}
	return l, nil
}
