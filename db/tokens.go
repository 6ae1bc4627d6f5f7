package db

import (
	"context"
	"fmt"
	"time"
)

// APIToken is the stored side of an API token: never the token itself.
type APIToken struct {
	ID        string
	Kind      string
	Name      string
	UserID    string
	CreatedAt time.Time
}

// CreateUserToken stores the hash of a new user API token.
func CreateUserToken(ctx context.Context, q Querier, userID, name string, hash []byte) (APIToken, error) {
	t := APIToken{Kind: "user", Name: name, UserID: userID}
	err := q.QueryRow(ctx, `INSERT INTO api_tokens (token_hash, kind, name, user_id) VALUES ($1, 'user', $2, $3)
		RETURNING id, created_at`, hash, name, userID).Scan(&t.ID, &t.CreatedAt)
	if err != nil {
		return APIToken{}, fmt.Errorf("create token: %w", err)
	}
	return t, nil
}

// TokenUser resolves a presented token's hash to its live user: unknown, revoked, expired tokens
// and disabled users are ErrNotFound. It also records the use (at most once a minute per token,
// so a busy script does not turn every read into a write).
func TokenUser(ctx context.Context, q Querier, hash []byte) (User, string, error) {
	var (
		u       User
		tokenID string
		stale   bool
	)
	err := q.QueryRow(ctx, `SELECT t.id, t.last_used_at IS NULL OR t.last_used_at < now() - interval '1 minute',
			u.id, u.email, u.password_hash, u.is_instance_admin, u.disabled_at IS NOT NULL, u.created_at
		FROM api_tokens t JOIN users u ON u.id = t.user_id
		WHERE t.token_hash = $1 AND t.kind = 'user' AND t.revoked_at IS NULL
		  AND (t.expires_at IS NULL OR t.expires_at > now()) AND u.disabled_at IS NULL`, hash).
		Scan(&tokenID, &stale, &u.ID, &u.Email, &u.PasswordHash, &u.IsInstanceAdmin, &u.Disabled, &u.CreatedAt)
	if err != nil {
		return User{}, "", notFound(err)
	}
	if stale {
		if _, err := q.Exec(ctx, `UPDATE api_tokens SET last_used_at = now() WHERE id = $1`, tokenID); err != nil {
			return User{}, "", fmt.Errorf("token last used: %w", err)
		}
	}
	return u, tokenID, nil
}

// CreateRunToken stores the hash of a run token, valid until expires or until its run ends.
func CreateRunToken(ctx context.Context, q Querier, runID string, hash []byte, expires time.Time) error {
	if _, err := q.Exec(ctx, `INSERT INTO api_tokens (token_hash, kind, name, run_id, expires_at)
		VALUES ($1, 'run', 'run', $2, $3)`, hash, runID, expires); err != nil {
		return fmt.Errorf("create run token: %w", err)
	}
	return nil
}
