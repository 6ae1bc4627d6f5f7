package db

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Company is a tenant: everything a team owns hangs off one.
type Company struct {
	ID        string
	Name      string
	Slug      string
	CreatedAt time.Time
}

// VisibleCompany is a company as one user sees it: with their role in it, or "" when they read
// it as an instance admin without being a member.
type VisibleCompany struct {
	Company
	Role string
}

// scanCompany reads id, name, slug, created_at; no row is ErrNotFound.
func scanCompany(row pgx.Row) (Company, error) {
	var c Company
	err := row.Scan(&c.ID, &c.Name, &c.Slug, &c.CreatedAt)
	return c, notFound(err)
}

// CreateCompany inserts a company; an existing slug is ErrConflict. The insert cannot fail on the
// slug, so a transaction that gets ErrConflict stays usable.
func CreateCompany(ctx context.Context, q Querier, name, slug string) (Company, error) {
	c, err := scanCompany(q.QueryRow(ctx, `INSERT INTO companies (name, slug) VALUES ($1, $2)
		ON CONFLICT (slug) DO NOTHING RETURNING id, name, slug, created_at`, name, slug))
	if errors.Is(err, ErrNotFound) {
		return Company{}, fmt.Errorf("create company %s: %w", slug, ErrConflict)
	}
	if err != nil {
		return Company{}, fmt.Errorf("create company: %w", err)
	}
	return c, nil
}

// CompanyBySlug finds a company by its slug.
func CompanyBySlug(ctx context.Context, q Querier, slug string) (Company, error) {
	return scanCompany(q.QueryRow(ctx, `SELECT id, name, slug, created_at FROM companies WHERE slug = $1`, slug))
}

// ListCompanies lists, in slug order after afterSlug, the companies a user may read: those they
// belong to, or every company when all is true (instance admins).
func ListCompanies(ctx context.Context, q Querier, userID string, all bool, afterSlug string, limit int) ([]VisibleCompany, error) {
	rows, err := q.Query(ctx, `SELECT c.id, c.name, c.slug, c.created_at, coalesce(m.role, '')
		FROM companies c LEFT JOIN memberships m ON m.company_id = c.id AND m.user_id = $1
		WHERE ($2 OR m.role IS NOT NULL) AND c.slug > $3
		ORDER BY c.slug LIMIT $4`, userID, all, afterSlug, limit)
	if err != nil {
		return nil, fmt.Errorf("list companies: %w", err)
	}
	cs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (VisibleCompany, error) {
		var c VisibleCompany
		err := r.Scan(&c.ID, &c.Name, &c.Slug, &c.CreatedAt, &c.Role)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("list companies: %w", err)
	}
	return cs, nil
}

// PutMembership gives a user a role in a company, replacing any role they had. It is the
// operator's tool (CLI, seeding); the API adds and changes members with AddMember and
// ChangeMemberRole, which keep the last-board-member rule.
func PutMembership(ctx context.Context, q Querier, companyID, userID, role string) error {
	_, err := q.Exec(ctx, `INSERT INTO memberships (company_id, user_id, role) VALUES ($1, $2, $3)
		ON CONFLICT (company_id, user_id) DO UPDATE SET role = EXCLUDED.role`, companyID, userID, role)
	if err != nil {
		return fmt.Errorf("put membership: %w", err)
	}
	return nil
}
