package db

import (
	"context"
	"fmt"
	"time"
)

// UserToken is one of a person's API tokens as their settings page lists it (never the token).
type UserToken struct {
	ID         string
	Name       string
	CreatedAt  time.Time
	ExpiresAt  *time.Time
	LastUsedAt *time.Time
	RevokedAt  *time.Time
}

// UserTokens lists a user's API tokens (kind user), live ones first, then newest first.
func UserTokens(ctx context.Context, q Querier, userID string) ([]UserToken, error) {
	if !validUUID(userID) {
		return nil, nil
	}
	rows, err := q.Query(ctx, `SELECT id, name, created_at, expires_at, last_used_at, revoked_at
		FROM api_tokens WHERE user_id = $1 AND kind = 'user'
		ORDER BY revoked_at IS NOT NULL, created_at DESC, id LIMIT 200`, userID)
	if err != nil {
		return nil, fmt.Errorf("user tokens: %w", err)
	}
	defer rows.Close()
	var out []UserToken
	for rows.Next() {
		var t UserToken
		if err := rows.Scan(&t.ID, &t.Name, &t.CreatedAt, &t.ExpiresAt, &t.LastUsedAt, &t.RevokedAt); err != nil {
			return nil, fmt.Errorf("user tokens: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("user tokens: %w", err)
	}
	return out, nil
}

// CreateUserTokenExpiring stores the hash of a new user API token that stops working at expires
// (nil: never).
func CreateUserTokenExpiring(ctx context.Context, q Querier, userID, name string, hash []byte, expires *time.Time) (UserToken, error) {
	t := UserToken{Name: name, ExpiresAt: expires}
	err := q.QueryRow(ctx, `INSERT INTO api_tokens (token_hash, kind, name, user_id, expires_at)
		VALUES ($1, 'user', $2, $3, $4) RETURNING id, created_at`, hash, name, userID, expires).Scan(&t.ID, &t.CreatedAt)
	if err != nil {
		return UserToken{}, fmt.Errorf("create token: %w", err)
	}
	return t, nil
}

// RevokeUserToken revokes one of the user's own tokens: another user's token, a run token or a
// malformed id is ErrNotFound; an already revoked token stays as it was (no error).
func RevokeUserToken(ctx context.Context, q Querier, userID, tokenID string) (UserToken, error) {
	if !validUUID(userID) || !validUUID(tokenID) {
		return UserToken{}, ErrNotFound
	}
	var t UserToken
	err := q.QueryRow(ctx, `UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now())
		WHERE id = $1 AND user_id = $2 AND kind = 'user'
		RETURNING id, name, created_at, expires_at, last_used_at, revoked_at`, tokenID, userID).
		Scan(&t.ID, &t.Name, &t.CreatedAt, &t.ExpiresAt, &t.LastUsedAt, &t.RevokedAt)
	if err != nil {
		return UserToken{}, notFound(err)
	}
	return t, nil
}
