package db

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Image version statuses. Exactly one version of an environment is active (a partial unique
// index); rollback activates an earlier available one.
const (
	ImageBuilding  = "building"
	ImageAvailable = "available"
	ImageActive    = "active"
	ImageFailed    = "failed"
	ImageRevoked   = "revoked"
)

// ImageVersion is one numbered filesystem layer of a sandbox environment. Digest is the capsule
// tree digest of the layer ("" while building or after a failure); CreatedBySession and CreatedBy
// are "" when no setup session or user made it (version 1, the empty layer).
type ImageVersion struct {
	ID               string
	CompanyID        string
	EnvironmentID    string
	Number           int
	Digest           string
	Size             int64
	Status           string
	CreatedBySession string
	CreatedBy        string
	CreatedAt        time.Time
}

const imageVersionColumns = `id, company_id, environment_id, number, digest, size, status,
	coalesce(created_by_session::text, ''), coalesce(created_by::text, ''), created_at`

func scanImageVersion(row pgx.Row) (ImageVersion, error) {
	var v ImageVersion
	err := row.Scan(&v.ID, &v.CompanyID, &v.EnvironmentID, &v.Number, &v.Digest, &v.Size, &v.Status,
		&v.CreatedBySession, &v.CreatedBy, &v.CreatedAt)
	return v, notFound(err)
}

// NewImageVersion is a version about to be recorded; its number is the environment's highest + 1.
type NewImageVersion struct {
	CompanyID        string
	EnvironmentID    string
	Digest           string
	Size             int64
	Status           string
	CreatedBySession string // optional
	CreatedBy        string // optional user id
}

// NextImageVersionNumber is the number the environment's next image version gets (1 for the
// first). Callers hold the environment's row lock (LockEnvironment) so no other version takes it.
func NextImageVersionNumber(ctx context.Context, q Querier, environmentID string) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT coalesce(max(number), 0) + 1 FROM image_versions WHERE environment_id = $1`,
		environmentID).Scan(&n)
	return n, err
}

// CreateImageVersion records the environment's next version. Callers hold the environment's row
// lock (LockEnvironment, or the transaction that inserted it), so numbers are handed out one at a
// time; a number taken meanwhile or a second active version is ErrConflict, and the transaction
// stays usable.
func CreateImageVersion(ctx context.Context, q Querier, n NewImageVersion) (ImageVersion, error) {
	v, err := scanImageVersion(q.QueryRow(ctx, `INSERT INTO image_versions (company_id, environment_id, number,
			digest, size, status, created_by_session, created_by)
		SELECT $1::uuid, $2::uuid, coalesce(max(number), 0) + 1, $3::text, $4::bigint, $5::text, $6::uuid, $7::uuid
		FROM image_versions WHERE environment_id = $2::uuid
		ON CONFLICT DO NOTHING
		RETURNING `+imageVersionColumns,
		n.CompanyID, n.EnvironmentID, n.Digest, n.Size, n.Status, nullable(n.CreatedBySession), nullable(n.CreatedBy)))
	if errors.Is(err, ErrNotFound) {
		return ImageVersion{}, fmt.Errorf("create image version of %s: %w", n.EnvironmentID, ErrConflict)
	}
	if err != nil {
		return ImageVersion{}, fmt.Errorf("create image version of %s: %w", n.EnvironmentID, err)
	}
	return v, nil
}

// ImageVersionCursor is the position after which a page of image versions starts: the number of
// the last version of the previous page (0 starts at the newest).
type ImageVersionCursor struct {
	Number int `json:"n"`
}

// ImageVersions returns up to limit of an environment's versions, newest (highest number) first,
// starting after the cursor. Another company's environment has none.
func ImageVersions(ctx context.Context, q Querier, companyID, environmentID string, after ImageVersionCursor, limit int) ([]ImageVersion, error) {
	if !validUUID(environmentID) {
		return nil, ErrNotFound
	}
	rows, err := q.Query(ctx, `SELECT `+imageVersionColumns+` FROM image_versions
		WHERE company_id = $1 AND environment_id = $2 AND ($3::int = 0 OR number < $3::int)
		ORDER BY number DESC LIMIT $4`, companyID, environmentID, after.Number, limit)
	if err != nil {
		return nil, fmt.Errorf("image versions: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ImageVersion, error) { return scanImageVersion(r) })
	if err != nil {
		return nil, fmt.Errorf("image versions: %w", err)
	}
	return list, nil
}

// ActiveImageVersion is the version an environment's sandboxes mount; ErrNotFound when it has
// none (environments of other drivers, or another company's).
func ActiveImageVersion(ctx context.Context, q Querier, companyID, environmentID string) (ImageVersion, error) {
	if !validUUID(environmentID) {
		return ImageVersion{}, ErrNotFound
	}
	v, err := scanImageVersion(q.QueryRow(ctx, `SELECT `+imageVersionColumns+` FROM image_versions
		WHERE company_id = $1 AND environment_id = $2 AND status = 'active'`, companyID, environmentID))
	if err != nil {
		return ImageVersion{}, fmt.Errorf("active image version of %s: %w", environmentID, err)
	}
	return v, nil
}

// ActiveImageDigest is the digest of the environment's active version, "" when it has none. It is
// the active image that enters an environment's qualification fingerprint: handlers and the probe
// job both take it from here, so they agree on it.
func ActiveImageDigest(ctx context.Context, q Querier, companyID, environmentID string) (string, error) {
	v, err := ActiveImageVersion(ctx, q, companyID, environmentID)
	if errors.Is(err, ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return v.Digest, nil
}
