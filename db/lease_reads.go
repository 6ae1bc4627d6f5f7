package db

// Reading leases: one by id, a company's pages, a workspace's.

import (
	"context"
	"fmt"
	"time"
)

// LeaseByID reads one of a company's leases; another company's id is ErrNotFound.
func LeaseByID(ctx context.Context, q Querier, companyID, id string) (Lease, error) {
	if !validUUID(id) || !validUUID(companyID) {
		return Lease{}, ErrNotFound
	}
	l, err := scanLease(q.QueryRow(ctx, `SELECT `+leaseColumns+` FROM environment_leases l
		WHERE l.company_id = $1 AND l.id = $2`, companyID, id))
	if err != nil {
		return Lease{}, fmt.Errorf("lease %s: %w", id, err)
	}
	return l, nil
}

// LeaseForJob reads a lease by id alone, for a worker (jobs carry the lease id they were enqueued
// with, not its company).
func LeaseForJob(ctx context.Context, q Querier, id string) (Lease, error) {
	if !validUUID(id) {
		return Lease{}, ErrNotFound
	}
	l, err := scanLease(q.QueryRow(ctx, `SELECT `+leaseColumns+` FROM environment_leases l WHERE l.id = $1`, id))
	if err != nil {
		return Lease{}, fmt.Errorf("lease %s: %w", id, err)
	}
	return l, nil
}

// LeaseCursor is the position after which a page of leases starts: the created_at and id of the
// previous page's last lease (Lease.Cursor). The zero cursor starts at the newest.
type LeaseCursor struct {
	CreatedAt time.Time `json:"t"`
	ID        string    `json:"i"`
}

// LeaseFilter narrows a company's lease list; empty fields do not filter.
type LeaseFilter struct {
	// Status is one lease status, or "live" for acquiring, active and releasing together.
	Status        string
	EnvironmentID string
	After         LeaseCursor
	// Limit is the page size: 50 when zero or negative, at most 200.
	Limit int
}

// ListLeases returns a page of a company's leases, newest first (created_at, then id), filtered.
func ListLeases(ctx context.Context, q Querier, companyID string, f LeaseFilter) ([]Lease, error) {
	if !validUUID(companyID) {
		return nil, ErrNotFound
	}
	statuses := []string{}
	switch f.Status {
	case "":
	case "live":
		statuses = LiveLeaseStatuses
	default:
		statuses = []string{f.Status}
	}
	var envID, afterID any
	if f.EnvironmentID != "" {
		if !validUUID(f.EnvironmentID) {
			return nil, fmt.Errorf("list leases: %w", ErrInvalidID)
		}
		envID = f.EnvironmentID
	}
	if f.After.ID != "" {
		if !validUUID(f.After.ID) {
			return nil, fmt.Errorf("list leases: %w", ErrInvalidID)
		}
		afterID = f.After.ID
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 50
	}
	limit = min(limit, 200)
	rows, err := q.Query(ctx, `SELECT `+leaseColumns+` FROM environment_leases l
		WHERE l.company_id = $1
			AND (cardinality($2::text[]) = 0 OR l.status::text = ANY ($2::text[]))
			AND ($3::uuid IS NULL OR l.environment_id = $3::uuid)
			AND ($5::uuid IS NULL OR (l.created_at, l.id) < ($4::timestamptz, $5::uuid))
		ORDER BY l.created_at DESC, l.id DESC LIMIT $6`,
		companyID, statuses, envID, f.After.CreatedAt, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	leases, err := collectLeases(rows)
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	return leases, nil
}

// WorkspaceLeases lists a workspace's leases, live ones first, then newest first. With live set
// only live leases are listed (all of them); otherwise at most limit.
func WorkspaceLeases(ctx context.Context, q Querier, companyID, workspaceID string, live bool, limit int) ([]Lease, error) {
	if !validUUID(companyID) || !validUUID(workspaceID) {
		return nil, ErrNotFound
	}
	if live {
		limit = 1 << 20
	}
	rows, err := q.Query(ctx, `SELECT `+leaseColumns+` FROM environment_leases l
		WHERE l.company_id = $1 AND l.execution_workspace_id = $2
			AND (NOT $3 OR l.status IN ('acquiring', 'active', 'releasing'))
		ORDER BY (l.status IN ('acquiring', 'active', 'releasing')) DESC, l.created_at DESC, l.id DESC LIMIT $4`,
		companyID, workspaceID, live, limit)
	if err != nil {
		return nil, fmt.Errorf("workspace leases: %w", err)
	}
	return collectLeases(rows)
}

// LiveEnvironmentLeases counts the environment's leases that still hold it (acquiring, active or
// releasing): while there are any it may not be archived.
func LiveEnvironmentLeases(ctx context.Context, q Querier, companyID, id string) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT count(*) FROM environment_leases
		WHERE company_id = $1 AND environment_id = $2 AND status IN ('acquiring', 'active', 'releasing')`,
		companyID, id).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("live environment leases: %w", err)
	}
	return n, nil
}
