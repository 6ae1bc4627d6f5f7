package db

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// MaxTerminalTokenTTL is the longest a terminal token may live (docs/terminal.md).
const MaxTerminalTokenTTL = 60 * time.Second

// ErrTokenRefused means a presented terminal token is unknown, expired or already used. It
// carries no detail on purpose: the caller learns nothing about other tokens.
var ErrTokenRefused = errors.New("terminal token refused")

// TerminalToken is what a consumed token was bound to.
type TerminalToken struct {
	CompanyID     string
	SessionID     string
	UserID        string
	EnvironmentID string
	ExpiresAt     time.Time
}

// InsertTerminalToken stores the sha256 of a freshly minted token, bound to a setup session, its
// environment and the minting user, expiring ttl (capped at MaxTerminalTokenTTL) from now on the
// database clock. It returns the expiry.
func InsertTerminalToken(ctx context.Context, q Querier, hash [32]byte, t TerminalToken, ttl time.Duration) (time.Time, error) {
	if ttl <= 0 || ttl > MaxTerminalTokenTTL {
		ttl = MaxTerminalTokenTTL
	}
	var exp time.Time
	err := q.QueryRow(ctx, `INSERT INTO terminal_tokens (token_hash, company_id, session_id, user_id, environment_id, expires_at)
		VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6)) RETURNING expires_at`,
		hash[:], t.CompanyID, t.SessionID, t.UserID, t.EnvironmentID, ttl.Seconds()).Scan(&exp)
	if err != nil {
		return time.Time{}, fmt.Errorf("insert terminal token: %w", err)
	}
	return exp, nil
}

// ConsumeTerminalToken uses up the token with this hash, atomically: of two concurrent
// presentations at most one succeeds. Whatever the caller then decides (another session's token is
// still refused), the token is spent. Unknown, expired and used tokens are ErrTokenRefused.
func ConsumeTerminalToken(ctx context.Context, q Querier, hash [32]byte) (TerminalToken, error) {
	var t TerminalToken
	err := q.QueryRow(ctx, `UPDATE terminal_tokens SET consumed_at = now()
		WHERE token_hash = $1 AND consumed_at IS NULL AND expires_at > now()
		RETURNING company_id, session_id, user_id, environment_id, expires_at`, hash[:]).
		Scan(&t.CompanyID, &t.SessionID, &t.UserID, &t.EnvironmentID, &t.ExpiresAt)
	if err = notFound(err); errors.Is(err, ErrNotFound) {
		return TerminalToken{}, ErrTokenRefused
	}
	if err != nil {
		return TerminalToken{}, fmt.Errorf("consume terminal token: %w", err)
	}
	return t, nil
}

// PruneTerminalTokens deletes tokens that expired more than an hour ago, returning how many.
func PruneTerminalTokens(ctx context.Context, q Querier) (int64, error) {
	tag, err := q.Exec(ctx, `DELETE FROM terminal_tokens WHERE expires_at < now() - interval '1 hour'`)
	if err != nil {
		return 0, fmt.Errorf("prune terminal tokens: %w", err)
	}
	return tag.RowsAffected(), nil
}
