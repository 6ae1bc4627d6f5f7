package db

// Environment leases: which run holds which environment instance for which execution workspace,
// until when, and under which generation (the fencing token).
//
// State machine (status, then cleanup_status):
//
//	AcquireLease ─────────────▶ active (generation 1, cleanup none)
//	AcquireLease (same run)     live ─▶ same status, generation + 1, fresh expires_at (takeover)
//	HeartbeatLease              live ─▶ same status, expires_at = now() + ttl
//	ReleaseLease  (holder)      live ─▶ released, cleanup pending         generation kept
//	FailLease     (holder)      live ─▶ failed,   cleanup pending         generation kept
//	ExpireLeases  (sweeper)     live past expires_at ─▶ expired, pending  generation + 1
//	ForceReleaseLease (admin)   live ─▶ released, cleanup pending         generation + 1
//	MarkLeaseCleanup            ended, cleanup pending|failed ─▶ succeeded | failed, attempts + 1
//	RetryLeaseCleanup (admin)   ended, cleanup failed ─▶ pending
//	DeleteLease                 ended, cleanup succeeded ─▶ row gone
//
// Live means acquiring, active or releasing: the statuses covered by the partial unique index
// environment_leases_one_live, so PostgreSQL itself refuses a second live lease for one
// (environment, execution workspace). This store creates leases active; acquiring and releasing
// are left to drivers that provision or tear down in two steps, and are treated like active.
// Ended means released, expired or failed; an ended lease never becomes live again.
//
// Fencing: every write after AcquireLease names the lease id and the generation its writer holds,
// and is one conditional UPDATE (or DELETE) on both plus the statuses the transition starts from.
// A writer that lost the lease (expired by the sweeper, force released, already ended) matches no
// row and gets ErrFenced; the row is left as it was and a lease.fenced audit event is recorded.
// Transitions that take a lease away from its holder bump the generation, so the old holder's
// later writes fail; the cleanup job then works with the generation the transition returned.
// Every time is the database clock's now(), never the application's.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Lease statuses.
const (
	LeaseAcquiring = "acquiring"
	LeaseActive    = "active"
	LeaseReleasing = "releasing"
	LeaseReleased  = "released"
	LeaseExpired   = "expired"
	LeaseFailed    = "failed"
)

// Lease cleanup statuses: what became of the environment instance after the lease ended.
const (
	LeaseCleanupNone      = "none"
	LeaseCleanupPending   = "pending"
	LeaseCleanupSucceeded = "succeeded"
	LeaseCleanupFailed    = "failed"
)

// LiveLeaseStatuses are the statuses in which a lease holds its environment for its workspace.
var LiveLeaseStatuses = []string{LeaseAcquiring, LeaseActive, LeaseReleasing}

// ErrFenced is returned to a stale holder: the generation it presented is no longer the lease's,
// or the lease is no longer in a status the write may start from (or is gone). The write changed
// nothing; a lease.fenced audit event was recorded through the same Querier, so inside a
// transaction the event commits or rolls back with it. The holder must stop using the environment.
var ErrFenced = errors.New("lease fenced: stale generation or lease no longer in the expected state")

// ErrLeaseBusy is returned by AcquireLease when another run's live lease (or one without a run)
// holds the environment for the workspace; nothing was written.
var ErrLeaseBusy = errors.New("lease busy: another live lease holds the environment for this workspace")

// ErrLeaseUnavailable is returned by AcquireLease when the environment is archived or the execution
// workspace is closing or closed: nothing may be leased on them.
var ErrLeaseUnavailable = errors.New("lease unavailable: environment archived or workspace closing or closed")

// ErrLeaseState is returned by the administrator's actions (force release, retry cleanup) when the
// lease is not in a status the action applies to; nothing was written.
var ErrLeaseState = errors.New("lease is not in the expected state")

// Lease is one row of environment_leases. Ids of deleted parents read as "", unset times as nil.
type Lease struct {
	ID                   string
	CompanyID            string
	EnvironmentID        string
	ExecutionWorkspaceID string
	TaskID               string
	RunID                string
	Status               string
	Generation           int64
	ProviderRef          string
	AcquiredAt           *time.Time
	HeartbeatAt          *time.Time
	ExpiresAt            *time.Time
	// ReleasedAt is when the lease stopped holding the environment: released, expired or failed.
	ReleasedAt      *time.Time
	CleanupStatus   string
	CleanupAttempts int
	// FailureReason is why the lease ended (the release or failure reason, expiry, a force
	// release), replaced by the error of the latest failed cleanup attempt, which a later
	// successful attempt leaves in place.
	FailureReason string
	CreatedAt     time.Time
	// ReadAt is the database clock when the statement that read the row started, never earlier
	// than a heartbeat it can see, so ages need no application clock.
	ReadAt time.Time
}

// Live reports whether the lease still holds its environment for its workspace.
func (l Lease) Live() bool {
	return l.Status == LeaseAcquiring || l.Status == LeaseActive || l.Status == LeaseReleasing
}

// HeartbeatAge is how long before ReadAt the last heartbeat was written, on the database clock
// (zero when there was none).
func (l Lease) HeartbeatAge() time.Duration {
	if l.HeartbeatAt == nil {
		return 0
	}
	return l.ReadAt.Sub(*l.HeartbeatAt)
}

// Cursor is the position after this lease in a ListLeases page.
func (l Lease) Cursor() LeaseCursor { return LeaseCursor{CreatedAt: l.CreatedAt, ID: l.ID} }

// leaseColumns are the columns scanLease reads, in its order, on a row aliased l.
const leaseColumns = `l.id, l.company_id, coalesce(l.environment_id::text, ''),
	coalesce(l.execution_workspace_id::text, ''), coalesce(l.task_id::text, ''), coalesce(l.run_id::text, ''),
	l.status, l.generation, l.provider_ref, l.acquired_at, l.heartbeat_at, l.expires_at, l.released_at,
	l.cleanup_status, l.cleanup_attempts, l.failure_reason, l.created_at, statement_timestamp()`

func scanLease(row pgx.Row) (Lease, error) {
	var l Lease
	err := row.Scan(&l.ID, &l.CompanyID, &l.EnvironmentID, &l.ExecutionWorkspaceID, &l.TaskID, &l.RunID,
		&l.Status, &l.Generation, &l.ProviderRef, &l.AcquiredAt, &l.HeartbeatAt, &l.ExpiresAt, &l.ReleasedAt,
		&l.CleanupStatus, &l.CleanupAttempts, &l.FailureReason, &l.CreatedAt, &l.ReadAt)
	return l, notFound(err)
}

func collectLeases(rows pgx.Rows) ([]Lease, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Lease, error) { return scanLease(r) })
}

// LeaseRequest is what AcquireLease needs. TaskID and RunID may be empty; RunID makes the
// acquisition idempotent for that run.
type LeaseRequest struct {
	CompanyID            string
	EnvironmentID        string
	ExecutionWorkspaceID string
	TaskID               string
	RunID                string
	// TTL is how long the lease lives without a heartbeat, from the database's now().
	TTL time.Duration
}

// acquireAttempts bounds how often AcquireLease starts over when the live lease that blocked its
// insert ended, or changed hands, before it could be read or adopted.
const acquireAttempts = 3

// AcquireLease grants a new active lease (generation 1, expiring TTL from now on the database
// clock) on an active environment for a workspace of the same company that is not closing or
// closed. It is one conditional INSERT against the one-live-lease index, so two acquirers never
// both win: the loser gets ErrLeaseBusy and nothing is written. When the live lease already
// belongs to req.RunID, the caller takes it over instead: same lease, generation + 1 and a fresh
// expiry, so a retried job adopts what its first attempt acquired and that attempt, if it is still
// running somewhere, is fenced out. To read a lease without taking it, use LeaseByID.
//
// The insert checks the references that decide whether a lease may exist (environment_leases has
// no foreign keys: see migration 0004): an unknown or foreign environment or workspace is
// ErrNotFound; an archived environment or a closing or closed workspace is ErrLeaseUnavailable.
// Both rows are share-locked for the insert, so archiving or closing them (which lock them for
// update and then count live leases) cannot interleave with it. TaskID and RunID are recorded as
// given: they are the caller's own run, read from the database for the same company.
func AcquireLease(ctx context.Context, q Querier, req LeaseRequest) (Lease, error) {
	for _, id := range []string{req.CompanyID, req.EnvironmentID, req.ExecutionWorkspaceID} {
		if !validUUID(id) {
			return Lease{}, fmt.Errorf("acquire lease: %w", ErrInvalidID)
		}
	}
	for _, id := range []string{req.TaskID, req.RunID} {
		if id != "" && !validUUID(id) {
			return Lease{}, fmt.Errorf("acquire lease: %w", ErrInvalidID)
		}
	}
	if req.TTL <= 0 {
		return Lease{}, fmt.Errorf("acquire lease: ttl %v is not positive", req.TTL)
	}
	for range acquireAttempts {
		// Only what the insert decides is read back; the rest of the new row is the request.
		l := Lease{CompanyID: req.CompanyID, EnvironmentID: req.EnvironmentID, ExecutionWorkspaceID: req.ExecutionWorkspaceID,
			TaskID: req.TaskID, RunID: req.RunID, Status: LeaseActive, Generation: 1, CleanupStatus: LeaseCleanupNone}
		var expires time.Time
		err := q.QueryRow(ctx, `INSERT INTO environment_leases AS l
				(company_id, environment_id, execution_workspace_id, task_id, run_id, status, generation,
				 acquired_at, heartbeat_at, expires_at, created_at)
			SELECT e.company_id, e.id, w.id, $4::uuid, $5::uuid, 'active', 1, now(), now(), now() + $6::interval, now()
			FROM environments e
			JOIN execution_workspaces w ON w.company_id = e.company_id AND w.id = $3
			WHERE e.company_id = $1 AND e.id = $2 AND e.status = 'active' AND w.status NOT IN ('closing', 'closed')
			FOR SHARE OF e, w
			ON CONFLICT (environment_id, execution_workspace_id) WHERE status IN ('acquiring', 'active', 'releasing')
			DO NOTHING
			RETURNING l.id, l.created_at, l.expires_at, statement_timestamp()`,
			req.CompanyID, req.EnvironmentID, req.ExecutionWorkspaceID, nullable(req.TaskID), nullable(req.RunID), req.TTL,
		).Scan(&l.ID, &l.CreatedAt, &expires, &l.ReadAt)
		if err == nil {
			acquired, heartbeat := l.CreatedAt, l.CreatedAt // one now(): the same instant
			l.AcquiredAt, l.HeartbeatAt, l.ExpiresAt = &acquired, &heartbeat, &expires
			return l, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return Lease{}, fmt.Errorf("acquire lease: %w", err)
		}
		// Nothing inserted: a live lease holds the slot, or the targets refuse a lease.
		held, err := scanLease(q.QueryRow(ctx, `SELECT `+leaseColumns+` FROM environment_leases l
			WHERE l.environment_id = $1 AND l.execution_workspace_id = $2
				AND l.status IN ('acquiring', 'active', 'releasing')`, req.EnvironmentID, req.ExecutionWorkspaceID))
		if err == nil {
			if req.RunID == "" || held.RunID != req.RunID || held.CompanyID != req.CompanyID {
				return Lease{}, fmt.Errorf("acquire lease: %w", ErrLeaseBusy)
			}
			l, err := scanLease(q.QueryRow(ctx, `UPDATE environment_leases AS l
				SET generation = l.generation + 1, heartbeat_at = now(), expires_at = now() + $3::interval
				WHERE l.id = $1 AND l.generation = $2 AND l.status IN ('acquiring', 'active', 'releasing')
				RETURNING `+leaseColumns, held.ID, held.Generation, req.TTL))
			if err == nil {
				return l, nil
			}
			if !errors.Is(err, ErrNotFound) {
				return Lease{}, fmt.Errorf("acquire lease: adopt %s: %w", held.ID, err)
			}
			continue // it ended or was adopted meanwhile: look again
		}
		if !errors.Is(err, ErrNotFound) {
			return Lease{}, fmt.Errorf("acquire lease: %w", err)
		}
		if err := leaseTargetsUsable(ctx, q, req); err != nil {
			return Lease{}, fmt.Errorf("acquire lease: %w", err)
		}
		// The blocking lease ended between the insert and the look-up: try again.
	}
	return Lease{}, fmt.Errorf("acquire lease: %w", ErrLeaseBusy)
}

// AcquireLeaseWithin is AcquireLease on an environment that holds at most capacity live leases
// (its max_parallel_runs; 0 or less: no bound, and exactly AcquireLease). Acquirers of one
// capped environment take turns on a transaction-scoped advisory lock, count its live leases
// other than req.RunID's own (a retry adopts its lease), and get ErrLeaseBusy when it is full.
func AcquireLeaseWithin(ctx context.Context, pool *pgxpool.Pool, req LeaseRequest, capacity int) (Lease, error) {
	if capacity <= 0 {
		return AcquireLease(ctx, pool, req)
	}
	if !validUUID(req.EnvironmentID) {
		return Lease{}, fmt.Errorf("acquire lease: %w", ErrInvalidID)
	}
	var l Lease
	err := InTx(ctx, pool, func(tx pgx.Tx) error {
		// The lock first, the count in a statement of its own: under READ COMMITTED its snapshot
		// then sees every lease a previous holder of the lock committed.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('berth environment capacity ' || $1, 0))`,
			req.EnvironmentID); err != nil {
			return fmt.Errorf("acquire lease: capacity: %w", err)
		}
		var live int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM environment_leases
			WHERE environment_id = $1 AND status IN ('acquiring', 'active', 'releasing') AND run_id IS DISTINCT FROM $2::uuid`,
			req.EnvironmentID, nullable(req.RunID)).Scan(&live); err != nil {
			return fmt.Errorf("acquire lease: capacity: %w", err)
		}
		if live >= capacity {
			return fmt.Errorf("acquire lease: the environment runs %d of its %d: %w", live, capacity, ErrLeaseBusy)
		}
		var err error
		l, err = AcquireLease(ctx, tx, req)
		return err
	})
	return l, err
}

// leaseTargetsUsable explains why a lease on req's environment and workspace was not inserted when
// no live lease holds them: ErrNotFound, ErrLeaseUnavailable, or nil when nothing stands in the way.
func leaseTargetsUsable(ctx context.Context, q Querier, req LeaseRequest) error {
	var envStatus, wsStatus *string
	err := q.QueryRow(ctx, `SELECT
			(SELECT status FROM environments WHERE company_id = $1 AND id = $2),
			(SELECT status FROM execution_workspaces WHERE company_id = $1 AND id = $3)`,
		req.CompanyID, req.EnvironmentID, req.ExecutionWorkspaceID).Scan(&envStatus, &wsStatus)
	switch {
	case err != nil:
		return err
	case envStatus == nil || wsStatus == nil:
		return ErrNotFound
	case *envStatus != EnvironmentActive || *wsStatus == "closing" || *wsStatus == "closed":
		return ErrLeaseUnavailable
	}
	return nil
}
