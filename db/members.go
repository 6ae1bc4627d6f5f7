package db

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrLastBoardMember is returned when a change would leave a company without a board member,
// and so without anyone who may manage it.
var ErrLastBoardMember = errors.New("last board member")

// Member is a user's membership in one company, with the user's email for display.
type Member struct {
	CompanyID string
	UserID    string
	Email     string
	Role      string
	CreatedAt time.Time
}

// memberSelect reads memberships with their user's email; callers add WHERE and ORDER BY.
const memberSelect = `SELECT m.company_id, m.user_id, u.email, m.role, m.created_at
	FROM memberships m JOIN users u ON u.id = m.user_id`

// scanMember reads one row of memberSelect; no row is ErrNotFound.
func scanMember(row pgx.Row) (Member, error) {
	var m Member
	err := row.Scan(&m.CompanyID, &m.UserID, &m.Email, &m.Role, &m.CreatedAt)
	return m, notFound(err)
}

// ListMembers lists a company's members in email order, after afterEmail.
func ListMembers(ctx context.Context, q Querier, companyID, afterEmail string, limit int) ([]Member, error) {
	rows, err := q.Query(ctx, memberSelect+` WHERE m.company_id = $1 AND u.email > $2
		ORDER BY u.email LIMIT $3`, companyID, afterEmail, limit)
	if err != nil {
		return nil, fmt.Errorf("list members: %w", err)
	}
	ms, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Member, error) { return scanMember(r) })
	if err != nil {
		return nil, fmt.Errorf("list members: %w", err)
	}
	return ms, nil
}

// MemberByUser returns one member of a company; a user who does not belong to it is ErrNotFound.
func MemberByUser(ctx context.Context, q Querier, companyID, userID string) (Member, error) {
	if !validUUID(userID) {
		return Member{}, ErrNotFound
	}
	return scanMember(q.QueryRow(ctx, memberSelect+` WHERE m.company_id = $1 AND m.user_id = $2`, companyID, userID))
}

// AddMember gives a user a role in a company. A user who already belongs is ErrConflict (their
// role is left alone), and the transaction stays usable.
func AddMember(ctx context.Context, q Querier, companyID, userID, role string) (Member, error) {
	m, err := scanMember(q.QueryRow(ctx, `WITH ins AS (
			INSERT INTO memberships (company_id, user_id, role) VALUES ($1, $2, $3)
			ON CONFLICT (company_id, user_id) DO NOTHING
			RETURNING company_id, user_id, role, created_at)
		SELECT ins.company_id, ins.user_id, u.email, ins.role, ins.created_at
		FROM ins JOIN users u ON u.id = ins.user_id`, companyID, userID, role))
	if errors.Is(err, ErrNotFound) {
		return Member{}, fmt.Errorf("add member: %w", ErrConflict)
	}
	if err != nil {
		return Member{}, fmt.Errorf("add member: %w", err)
	}
	return m, nil
}

// ChangeMemberRole sets a member's role and returns the membership before and after. Demoting
// the only board member is ErrLastBoardMember. q must be a transaction: the company's
// memberships stay locked until it ends, so concurrent changes cannot together remove every
// board member.
func ChangeMemberRole(ctx context.Context, q Querier, companyID, userID, role string) (before, after Member, err error) {
	before, err = lockedMember(ctx, q, companyID, userID)
	if err != nil {
		return Member{}, Member{}, fmt.Errorf("change member role: %w", err)
	}
	if before.Role == role {
		return before, before, nil
	}
	if err := keepBoardMember(ctx, q, before); err != nil {
		return Member{}, Member{}, fmt.Errorf("change member role: %w", err)
	}
	if _, err := q.Exec(ctx, `UPDATE memberships SET role = $3 WHERE company_id = $1 AND user_id = $2`,
		companyID, userID, role); err != nil {
		return Member{}, Member{}, fmt.Errorf("change member role: %w", err)
	}
	after = before
	after.Role = role
	return before, after, nil
}

// RemoveMember takes a user out of a company and returns the membership that was removed.
// Removing the only board member is ErrLastBoardMember. q must be a transaction (see
// ChangeMemberRole).
func RemoveMember(ctx context.Context, q Querier, companyID, userID string) (Member, error) {
	m, err := lockedMember(ctx, q, companyID, userID)
	if err != nil {
		return Member{}, fmt.Errorf("remove member: %w", err)
	}
	if err := keepBoardMember(ctx, q, m); err != nil {
		return Member{}, fmt.Errorf("remove member: %w", err)
	}
	if _, err := q.Exec(ctx, `DELETE FROM memberships WHERE company_id = $1 AND user_id = $2`, companyID, userID); err != nil {
		return Member{}, fmt.Errorf("remove member: %w", err)
	}
	return m, nil
}

// lockedMember locks the company's row against other membership changes (FOR NO KEY UPDATE
// leaves inserts of the company's projects, tasks… unblocked) and then reads the member.
func lockedMember(ctx context.Context, q Querier, companyID, userID string) (Member, error) {
	if !validUUID(userID) {
		return Member{}, ErrNotFound
	}
	var id string
	if err := q.QueryRow(ctx, `SELECT id FROM companies WHERE id = $1 FOR NO KEY UPDATE`, companyID).Scan(&id); err != nil {
		return Member{}, notFound(err)
	}
	return MemberByUser(ctx, q, companyID, userID)
}

// keepBoardMember refuses to demote or remove m when m is the company's only board member.
func keepBoardMember(ctx context.Context, q Querier, m Member) error {
	if m.Role != RoleBoard {
		return nil
	}
	var boards int
	if err := q.QueryRow(ctx, `SELECT count(*) FROM memberships WHERE company_id = $1 AND role = 'board'`,
		m.CompanyID).Scan(&boards); err != nil {
		return err
	}
	if boards <= 1 {
		return ErrLastBoardMember
	}
	return nil
}
