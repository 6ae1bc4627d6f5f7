package db

import (
	"context"
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

func scanCompany(row pgx.Row) (Company, error) {
	var c Company
	err := row.Scan(&c.ID, &c.Name, &c.Slug, &c.CreatedAt)
	return c, notFound(err)
}

// CreateCompany inserts a company; an existing slug is ErrConflict.
func CreateCompany(ctx context.Context, q Querier, name, slug string) (Company, error) {
	c, err := scanCompany(q.QueryRow(ctx, `INSERT INTO companies (name, slug) VALUES ($1, $2)
		RETURNING id, name, slug, created_at`, name, slug))
	if isUniqueViolation(err) {
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

// PutMembership gives a user a role in a company, replacing any role they had.
func PutMembership(ctx context.Context, q Querier, companyID, userID, role string) error {
	_, err := q.Exec(ctx, `INSERT INTO memberships (company_id, user_id, role) VALUES ($1, $2, $3)
		ON CONFLICT (company_id, user_id) DO UPDATE SET role = EXCLUDED.role`, companyID, userID, role)
	if err != nil {
		return fmt.Errorf("put membership: %w", err)
	}
	return nil
}
