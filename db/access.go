package db

import (
	"context"
	"errors"
	"fmt"
)

// Roles a member can hold in a company.
const (
	RoleBoard  = "board"
	RoleViewer = "viewer"
)

// CompanyRole returns the user's role in a company, or "" when they are not a member. It
// returns ErrNotFound when the company does not exist.
func CompanyRole(ctx context.Context, q Querier, companyID, userID string) (Company, string, error) {
	var (
		c    Company
		role *string
	)
	err := q.QueryRow(ctx, `SELECT c.id, c.name, c.slug, c.created_at, m.role FROM companies c
		LEFT JOIN memberships m ON m.company_id = c.id AND m.user_id = $2
		WHERE c.id = $1`, companyID, userID).Scan(&c.ID, &c.Name, &c.Slug, &c.CreatedAt, &role)
	if err != nil {
		return Company{}, "", notFound(err)
	}
	if role == nil {
		return c, "", nil
	}
	return c, *role, nil
}

// CompanyOf returns the company that owns a row of one of the company-owned tables, by the row's
// id. Handlers use it to authorize a route like /api/tasks/{id} before loading the row itself.
func CompanyOf(ctx context.Context, q Querier, table, id string) (string, error) {
	if !companyTables[table] {
		return "", fmt.Errorf("company of: table %q is not company-owned", table)
	}
	if !validUUID(id) {
		return "", ErrNotFound
	}
	var cid string
	err := q.QueryRow(ctx, `SELECT company_id FROM `+table+` WHERE id = $1`, id).Scan(&cid)
	if err != nil {
		return "", notFound(err)
	}
	return cid, nil
}

// companyTables are the tables CompanyOf may read.
var companyTables = map[string]bool{
	"projects": true, "project_workspaces": true, "environments": true, "tasks": true, "agents": true,
	"execution_workspaces": true, "environment_leases": true, "runs": true,
}

// validUUID reports whether s has the textual shape of a UUID, so malformed ids are a 404
// instead of a database error.
func validUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return false
			}
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f', c >= 'A' && c <= 'F':
		default:
			return false
		}
	}
	return true
}

// ValidID is validUUID for callers outside db: ids from URLs and bodies are checked before use.
func ValidID(s string) bool { return validUUID(s) }

// ErrInvalidID is returned for an id that is not a UUID.
var ErrInvalidID = errors.New("invalid id")
