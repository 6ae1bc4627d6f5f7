package db

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Image setup session statuses (docs/terminal.md). Starting, waiting for the user and capturing
// are live: at most one live session per environment (a partial unique index).
const (
	SetupStarting       = "starting"
	SetupWaitingForUser = "waiting_for_user"
	SetupCapturing      = "capturing"
	SetupPromoted       = "promoted"
	SetupCancelled      = "cancelled"
	SetupTimedOut       = "timed_out"
	SetupFailed         = "failed"
)

// SetupSession is one instance admin's image setup session: a shell over a scratch copy of the
// environment's base version, captured into ResultVersion when it is promoted.
type SetupSession struct {
	ID            string
	CompanyID     string
	EnvironmentID string
	BaseVersion   int
	UserID        string
	Status        string
	ExpiresAt     time.Time
	ResultVersion int // 0 until promoted
	Error         string
	CreatedAt     time.Time
	UpdatedAt     time.Time
	FinishedAt    *time.Time
	NodeID        string // the node whose process holds the session's shell and scratch layer
	ProviderRef   string // plugin environments: the instance the terminal runs on ("" otherwise)
}

// SetSetupSessionProviderRef records the plugin instance a session's terminal runs on.
func SetSetupSessionProviderRef(ctx context.Context, q Querier, companyID, id, ref string) error {
	tag, err := q.Exec(ctx, `UPDATE image_setup_sessions SET provider_ref = $3, updated_at = now()
		WHERE company_id = $1 AND id = $2`, companyID, id, ref)
	if err == nil && tag.RowsAffected() == 0 {
		err = ErrNotFound
	}
	return err
}

// Live reports whether the session still holds its environment's one live slot.
func (s SetupSession) Live() bool {
	return s.Status == SetupStarting || s.Status == SetupWaitingForUser || s.Status == SetupCapturing
}

const setupSessionColumns = `id, company_id, environment_id, base_version, coalesce(user_id::text, ''), status,
	expires_at, coalesce(result_version, 0), error, created_at, updated_at, finished_at, node_id, provider_ref`

func scanSetupSession(row pgx.Row) (SetupSession, error) {
	var s SetupSession
	err := row.Scan(&s.ID, &s.CompanyID, &s.EnvironmentID, &s.BaseVersion, &s.UserID, &s.Status, &s.ExpiresAt,
		&s.ResultVersion, &s.Error, &s.CreatedAt, &s.UpdatedAt, &s.FinishedAt, &s.NodeID, &s.ProviderRef)
	return s, notFound(err)
}

func collectSetupSessions(rows pgx.Rows, err error) ([]SetupSession, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (SetupSession, error) { return scanSetupSession(r) })
}

// NewSetupSession is a session about to start.
type NewSetupSession struct {
	CompanyID     string
	EnvironmentID string
	BaseVersion   int
	UserID        string
	TTL           time.Duration
	NodeID        string
}

// CreateSetupSession records a session in status starting, expiring TTL from now (database
// clock). A live session of the same environment is ErrConflict.
func CreateSetupSession(ctx context.Context, q Querier, n NewSetupSession) (SetupSession, error) {
	s, err := scanSetupSession(q.QueryRow(ctx, `INSERT INTO image_setup_sessions
			(company_id, environment_id, base_version, user_id, status, expires_at, node_id)
		VALUES ($1, $2, $3, $4, 'starting', now() + make_interval(secs => $5), $6)
		ON CONFLICT (environment_id) WHERE status IN ('starting', 'waiting_for_user', 'capturing') DO NOTHING
		RETURNING `+setupSessionColumns,
		n.CompanyID, n.EnvironmentID, n.BaseVersion, nullable(n.UserID), n.TTL.Seconds(), n.NodeID))
	if errors.Is(err, ErrNotFound) {
		return SetupSession{}, fmt.Errorf("create setup session of %s: %w", n.EnvironmentID, ErrConflict)
	}
	if err != nil {
		return SetupSession{}, fmt.Errorf("create setup session of %s: %w", n.EnvironmentID, err)
	}
	return s, nil
}

// SetupSessionByID loads one of a company's setup sessions.
func SetupSessionByID(ctx context.Context, q Querier, companyID, id string) (SetupSession, error) {
	if !validUUID(id) {
		return SetupSession{}, ErrNotFound
	}
	s, err := scanSetupSession(q.QueryRow(ctx, `SELECT `+setupSessionColumns+` FROM image_setup_sessions
		WHERE company_id = $1 AND id = $2`, companyID, id))
	if err != nil {
		return SetupSession{}, fmt.Errorf("setup session %s: %w", id, err)
	}
	return s, nil
}

// LockSetupSession loads a session and locks its row until the transaction q ends, so finish,
// cancel, expiry and capture move it one at a time.
func LockSetupSession(ctx context.Context, q Querier, companyID, id string) (SetupSession, error) {
	if !validUUID(id) {
		return SetupSession{}, ErrNotFound
	}
	s, err := scanSetupSession(q.QueryRow(ctx, `SELECT `+setupSessionColumns+` FROM image_setup_sessions
		WHERE company_id = $1 AND id = $2 FOR UPDATE`, companyID, id))
	if err != nil {
		return SetupSession{}, fmt.Errorf("lock setup session %s: %w", id, err)
	}
	return s, nil
}

// SetupSessionCompany is the company owning a setup session, to authorize a route by its id.
func SetupSessionCompany(ctx context.Context, q Querier, id string) (string, error) {
	if !validUUID(id) {
		return "", ErrNotFound
	}
	var cid string
	if err := q.QueryRow(ctx, `SELECT company_id FROM image_setup_sessions WHERE id = $1`, id).Scan(&cid); err != nil {
		return "", fmt.Errorf("setup session %s: %w", id, notFound(err))
	}
	return cid, nil
}

// LiveSetupSession is an environment's live session; ErrNotFound when it has none.
func LiveSetupSession(ctx context.Context, q Querier, companyID, environmentID string) (SetupSession, error) {
	if !validUUID(environmentID) {
		return SetupSession{}, ErrNotFound
	}
	s, err := scanSetupSession(q.QueryRow(ctx, `SELECT `+setupSessionColumns+` FROM image_setup_sessions
		WHERE company_id = $1 AND environment_id = $2 AND status IN ('starting', 'waiting_for_user', 'capturing')`,
		companyID, environmentID))
	if err != nil {
		return SetupSession{}, fmt.Errorf("live setup session of %s: %w", environmentID, err)
	}
	return s, nil
}

// MoveSetupSession changes a session's status from one of from to to (a final status also sets
// finished_at, and errMsg is kept). A session in another status is ErrConflict and is unchanged.
func MoveSetupSession(ctx context.Context, q Querier, companyID, id string, from []string, to, errMsg string) (SetupSession, error) {
	s, err := scanSetupSession(q.QueryRow(ctx, `UPDATE image_setup_sessions
		SET status = $4, error = $5, updated_at = now(),
			finished_at = CASE WHEN $4 IN ('promoted', 'cancelled', 'timed_out', 'failed') THEN now() END
		WHERE company_id = $1 AND id = $2 AND status = ANY($3)
		RETURNING `+setupSessionColumns, companyID, id, from, to, errMsg))
	if errors.Is(err, ErrNotFound) {
		return SetupSession{}, fmt.Errorf("setup session %s to %s: %w", id, to, ErrConflict)
	}
	if err != nil {
		return SetupSession{}, fmt.Errorf("setup session %s to %s: %w", id, to, err)
	}
	return s, nil
}

// PromoteSetupSession marks a capturing session promoted with the version it produced.
func PromoteSetupSession(ctx context.Context, q Querier, companyID, id string, version int) (SetupSession, error) {
	s, err := scanSetupSession(q.QueryRow(ctx, `UPDATE image_setup_sessions
		SET status = 'promoted', result_version = $3, updated_at = now(), finished_at = now()
		WHERE company_id = $1 AND id = $2 AND status = 'capturing'
		RETURNING `+setupSessionColumns, companyID, id, version))
	if errors.Is(err, ErrNotFound) {
		return SetupSession{}, fmt.Errorf("promote setup session %s: %w", id, ErrConflict)
	}
	if err != nil {
		return SetupSession{}, fmt.Errorf("promote setup session %s: %w", id, err)
	}
	return s, nil
}

// ExpiredSetupSessions lists up to limit sessions, of every company, still starting or waiting
// for their user after their expiry (database clock).
func ExpiredSetupSessions(ctx context.Context, q Querier, limit int) ([]SetupSession, error) {
	list, err := collectSetupSessions(q.Query(ctx, `SELECT `+setupSessionColumns+` FROM image_setup_sessions
		WHERE status IN ('starting', 'waiting_for_user') AND expires_at <= now()
		ORDER BY expires_at LIMIT $1`, limit))
	if err != nil {
		return nil, fmt.Errorf("expired setup sessions: %w", err)
	}
	return list, nil
}

// SetupSessionStatus is a session's status by id alone (any company), for the scratch sweep that
// finds layers on disk by their session id; ErrNotFound when the row is gone.
func SetupSessionStatus(ctx context.Context, q Querier, id string) (string, error) {
	if !validUUID(id) {
		return "", ErrNotFound
	}
	var st string
	if err := q.QueryRow(ctx, `SELECT status FROM image_setup_sessions WHERE id = $1`, id).Scan(&st); err != nil {
		return "", fmt.Errorf("setup session %s: %w", id, notFound(err))
	}
	return st, nil
}

// ActivateImageVersion makes version number the environment's active one and the previously
// active version available, in q's transaction; the caller holds the environment's row lock. A
// version that is neither available nor already active is ErrConflict; activating the active
// version changes nothing. It returns the previous and the new active version, and clears the
// environment's qualification when the active image changed (a qualification holds only for the
// image it was earned with).
func ActivateImageVersion(ctx context.Context, q Querier, companyID, environmentID string, number int) (prev, cur ImageVersion, err error) {
	prev, err = ActiveImageVersion(ctx, q, companyID, environmentID)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return ImageVersion{}, ImageVersion{}, err
	}
	if err == nil && prev.Number == number {
		return prev, prev, nil
	}
	target, err := scanImageVersion(q.QueryRow(ctx, `SELECT `+imageVersionColumns+` FROM image_versions
		WHERE company_id = $1 AND environment_id = $2 AND number = $3`, companyID, environmentID, number))
	if err != nil {
		return ImageVersion{}, ImageVersion{}, fmt.Errorf("activate image version %d: %w", number, err)
	}
	if target.Status != ImageAvailable {
		return ImageVersion{}, ImageVersion{}, fmt.Errorf("activate image version %d (%s): %w", number, target.Status, ErrConflict)
	}
	if prev.ID != "" {
		if _, err := q.Exec(ctx, `UPDATE image_versions SET status = 'available' WHERE id = $1`, prev.ID); err != nil {
			return ImageVersion{}, ImageVersion{}, fmt.Errorf("activate image version %d: demote %d: %w", number, prev.Number, err)
		}
		prev.Status = ImageAvailable
	}
	cur, err = scanImageVersion(q.QueryRow(ctx, `UPDATE image_versions SET status = 'active' WHERE id = $1
		RETURNING `+imageVersionColumns, target.ID))
	if err != nil {
		return ImageVersion{}, ImageVersion{}, fmt.Errorf("activate image version %d: %w", number, err)
	}
	if _, err := q.Exec(ctx, `UPDATE environments SET qualification = NULL WHERE company_id = $1 AND id = $2`,
		companyID, environmentID); err != nil {
		return ImageVersion{}, ImageVersion{}, fmt.Errorf("activate image version %d: clear qualification: %w", number, err)
	}
	return prev, cur, nil
}
