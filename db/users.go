package db

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// User is a person who signs in to Berth.
type User struct {
	ID              string
	Email           string
	PasswordHash    string
	IsInstanceAdmin bool
	Disabled        bool
	CreatedAt       time.Time
}

// Membership is a user's role in one company.
type Membership struct {
	CompanyID   string
	CompanySlug string
	CompanyName string
	Role        string
}

// NormalizeEmail is the one canonical form of an email address Berth stores and compares.
func NormalizeEmail(email string) string {
	return strings.ToLower(strings.TrimSpace(email))
}

const userColumns = `id, email, password_hash, is_instance_admin, disabled_at IS NOT NULL, created_at`

func scanUser(row pgx.Row) (User, error) {
	var u User
	err := row.Scan(&u.ID, &u.Email, &u.PasswordHash, &u.IsInstanceAdmin, &u.Disabled, &u.CreatedAt)
	return u, notFound(err)
}

// CreateUser inserts a user; an existing email is ErrConflict.
func CreateUser(ctx context.Context, q Querier, email, passwordHash string, admin bool) (User, error) {
	u, err := scanUser(q.QueryRow(ctx, `INSERT INTO users (email, password_hash, is_instance_admin)
		VALUES ($1, $2, $3) RETURNING `+userColumns, NormalizeEmail(email), passwordHash, admin))
	if isUniqueViolation(err) {
		return User{}, fmt.Errorf("create user %s: %w", NormalizeEmail(email), ErrConflict)
	}
	if err != nil {
		return User{}, fmt.Errorf("create user: %w", err)
	}
	return u, nil
}

// UpdateUserCredentials replaces a user's password hash and, when admin is true, grants the
// instance-admin flag (it never revokes it).
func UpdateUserCredentials(ctx context.Context, q Querier, id, passwordHash string, admin bool) error {
	tag, err := q.Exec(ctx, `UPDATE users SET password_hash = $2,
		is_instance_admin = is_instance_admin OR $3, updated_at = now() WHERE id = $1`, id, passwordHash, admin)
	if err != nil {
		return fmt.Errorf("update user: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// UserByEmail finds a user by (normalized) email.
func UserByEmail(ctx context.Context, q Querier, email string) (User, error) {
	return scanUser(q.QueryRow(ctx, `SELECT `+userColumns+` FROM users WHERE email = $1`, NormalizeEmail(email)))
}

// UserByID finds a user by id.
func UserByID(ctx context.Context, q Querier, id string) (User, error) {
	return scanUser(q.QueryRow(ctx, `SELECT `+userColumns+` FROM users WHERE id = $1`, id))
}

// HasInstanceAdmin reports whether any enabled instance admin exists.
func HasInstanceAdmin(ctx context.Context, q Querier) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM users WHERE is_instance_admin AND disabled_at IS NULL)`).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("has instance admin: %w", err)
	}
	return ok, nil
}

// UserMemberships lists the companies a user belongs to, ordered by company name.
func UserMemberships(ctx context.Context, q Querier, userID string) ([]Membership, error) {
	rows, err := q.Query(ctx, `SELECT c.id, c.slug, c.name, m.role FROM memberships m
		JOIN companies c ON c.id = m.company_id WHERE m.user_id = $1 ORDER BY c.name, c.id`, userID)
	if err != nil {
		return nil, fmt.Errorf("user memberships: %w", err)
	}
	ms, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Membership, error) {
		var m Membership
		err := r.Scan(&m.CompanyID, &m.CompanySlug, &m.CompanyName, &m.Role)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("user memberships: %w", err)
	}
	return ms, nil
}
