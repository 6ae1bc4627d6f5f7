package db

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// SourceRoot is a host directory instance administrators allowed as a place for board members'
// local project workspace sources (besides BERTH_SOURCE_ROOTS).
type SourceRoot struct {
	ID        string
	Path      string
	Note      string
	CreatedBy string // email, "" when the user is gone
	CreatedAt time.Time
}

// SourceRoots lists the stored source roots by path.
func SourceRoots(ctx context.Context, q Querier) ([]SourceRoot, error) {
	rows, err := q.Query(ctx, `SELECT r.id, r.path, r.note, coalesce(u.email, ''), r.created_at
		FROM source_roots r LEFT JOIN users u ON u.id = r.created_by ORDER BY r.path`)
	if err != nil {
		return nil, fmt.Errorf("source roots: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (SourceRoot, error) {
		var s SourceRoot
		return s, r.Scan(&s.ID, &s.Path, &s.Note, &s.CreatedBy, &s.CreatedAt)
	})
}

// SourceRootPaths is the stored roots' paths alone (the check on every local source save).
func SourceRootPaths(ctx context.Context, q Querier) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT path FROM source_roots ORDER BY path`)
	if err != nil {
		return nil, fmt.Errorf("source root paths: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// AddSourceRoot stores a root; a path already stored is ErrConflict.
func AddSourceRoot(ctx context.Context, q Querier, path, note, userID string) (SourceRoot, error) {
	s := SourceRoot{Path: path, Note: note}
	err := q.QueryRow(ctx, `INSERT INTO source_roots (path, note, created_by) VALUES ($1, $2, $3)
		ON CONFLICT (path) DO NOTHING RETURNING id, created_at`, path, note, nullable(userID)).Scan(&s.ID, &s.CreatedAt)
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return SourceRoot{}, fmt.Errorf("add source root: %w", ErrConflict)
		}
		return SourceRoot{}, fmt.Errorf("add source root: %w", err)
	}
	return s, nil
}

// DeleteSourceRoot removes a stored root and returns it; unknown is ErrNotFound.
func DeleteSourceRoot(ctx context.Context, q Querier, id string) (SourceRoot, error) {
	if !validUUID(id) {
		return SourceRoot{}, ErrNotFound
	}
	var s SourceRoot
	err := q.QueryRow(ctx, `DELETE FROM source_roots WHERE id = $1 RETURNING id, path, note, created_at`, id).
		Scan(&s.ID, &s.Path, &s.Note, &s.CreatedAt)
	return s, notFound(err)
}

// SourceRootRequest is a board member's request to allow a refused directory.
type SourceRootRequest struct {
	ID          string
	CompanyID   string
	CompanyName string
	ProjectID   string
	ProjectName string
	Requester   string // email, "" when the user is gone
	Path        string
	Status      string // open | approved | dismissed
	CreatedAt   time.Time
	ResolvedAt  *time.Time
}

const sourceRootRequestSelect = `SELECT q.id, q.company_id, c.name, coalesce(q.project_id::text, ''), coalesce(p.name, ''),
		coalesce(u.email, ''), q.path, q.status, q.created_at, q.resolved_at
	FROM source_root_requests q
	JOIN companies c ON c.id = q.company_id
	LEFT JOIN projects p ON p.id = q.project_id AND p.company_id = q.company_id
	LEFT JOIN users u ON u.id = q.user_id`

func scanSourceRootRequest(r pgx.CollectableRow) (SourceRootRequest, error) {
	var s SourceRootRequest
	return s, r.Scan(&s.ID, &s.CompanyID, &s.CompanyName, &s.ProjectID, &s.ProjectName, &s.Requester, &s.Path,
		&s.Status, &s.CreatedAt, &s.ResolvedAt)
}

// OpenSourceRootRequest records a request, or returns the open one for the same company and path
// (created false).
func OpenSourceRootRequest(ctx context.Context, q Querier, companyID, projectID, userID, path string) (req SourceRootRequest, created bool, err error) {
	if !validUUID(companyID) || (projectID != "" && !validUUID(projectID)) {
		return SourceRootRequest{}, false, ErrNotFound
	}
	var id string
	err = q.QueryRow(ctx, `INSERT INTO source_root_requests (company_id, project_id, user_id, path)
		SELECT $1, p.id, $3, $4 FROM companies c LEFT JOIN projects p ON p.id = $2::uuid AND p.company_id = c.id
		WHERE c.id = $1
		ON CONFLICT (company_id, path) WHERE status = 'open' DO NOTHING RETURNING id`,
		companyID, nullable(projectID), nullable(userID), path).Scan(&id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		rows, qerr := q.Query(ctx, sourceRootRequestSelect+` WHERE q.company_id = $1 AND q.path = $2 AND q.status = 'open'`, companyID, path)
		if qerr != nil {
			return SourceRootRequest{}, false, fmt.Errorf("open source root request: %w", qerr)
		}
		req, err = pgx.CollectExactlyOneRow(rows, scanSourceRootRequest)
		return req, false, notFound(err)
	case err != nil:
		return SourceRootRequest{}, false, fmt.Errorf("open source root request: %w", err)
	}
	req, err = SourceRootRequestByID(ctx, q, id)
	return req, true, err
}

// SourceRootRequestByID reads one request (any company: instance admins' view).
func SourceRootRequestByID(ctx context.Context, q Querier, id string) (SourceRootRequest, error) {
	if !validUUID(id) {
		return SourceRootRequest{}, ErrNotFound
	}
	rows, err := q.Query(ctx, sourceRootRequestSelect+` WHERE q.id = $1`, id)
	if err != nil {
		return SourceRootRequest{}, fmt.Errorf("source root request: %w", err)
	}
	r, err := pgx.CollectExactlyOneRow(rows, scanSourceRootRequest)
	return r, notFound(err)
}

// CompanySourceRootRequest reads one request of a company (the requester's view); another
// company's is ErrNotFound.
func CompanySourceRootRequest(ctx context.Context, q Querier, companyID, id string) (SourceRootRequest, error) {
	r, err := SourceRootRequestByID(ctx, q, id)
	if err != nil {
		return SourceRootRequest{}, err
	}
	if r.CompanyID != companyID {
		return SourceRootRequest{}, ErrNotFound
	}
	return r, nil
}

// SourceRootRequests lists requests: the open ones oldest first, then up to 20 resolved ones,
// newest first.
func SourceRootRequests(ctx context.Context, q Querier) ([]SourceRootRequest, error) {
	rows, err := q.Query(ctx, `(`+sourceRootRequestSelect+` WHERE q.status = 'open' ORDER BY q.created_at LIMIT 200)
		UNION ALL (`+sourceRootRequestSelect+` WHERE q.status <> 'open' ORDER BY q.resolved_at DESC NULLS LAST LIMIT 20)`)
	if err != nil {
		return nil, fmt.Errorf("source root requests: %w", err)
	}
	return pgx.CollectRows(rows, scanSourceRootRequest)
}

// CountOpenSourceRootRequests counts the requests waiting for an instance admin.
func CountOpenSourceRootRequests(ctx context.Context, q Querier) (int, error) {
	var n int
	if err := q.QueryRow(ctx, `SELECT count(*) FROM source_root_requests WHERE status = 'open'`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count source root requests: %w", err)
	}
	return n, nil
}

// ResolveSourceRootRequest closes an open request as approved or dismissed, under its row lock;
// a request that is not open any more is ErrConflict, an unknown one ErrNotFound.
func ResolveSourceRootRequest(ctx context.Context, q Querier, id, status, userID string) (SourceRootRequest, error) {
	if !validUUID(id) {
		return SourceRootRequest{}, ErrNotFound
	}
	if status != "approved" && status != "dismissed" {
		return SourceRootRequest{}, fmt.Errorf("resolve source root request: status %q", status)
	}
	var cur string
	if err := q.QueryRow(ctx, `SELECT status FROM source_root_requests WHERE id = $1 FOR UPDATE`, id).Scan(&cur); err != nil {
		return SourceRootRequest{}, notFound(err)
	}
	if cur != "open" {
		return SourceRootRequest{}, fmt.Errorf("resolve source root request: already %s: %w", cur, ErrConflict)
	}
	if _, err := q.Exec(ctx, `UPDATE source_root_requests SET status = $2, resolved_by = $3, resolved_at = now() WHERE id = $1`,
		id, status, nullable(userID)); err != nil {
		return SourceRootRequest{}, fmt.Errorf("resolve source root request: %w", err)
	}
	return SourceRootRequestByID(ctx, q, id)
}
