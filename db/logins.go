package db

import (
	"context"
	"fmt"
	"time"
)

// RecordLoginAttempt stores one login attempt for the rate limiter.
func RecordLoginAttempt(ctx context.Context, q Querier, email, ip string, ok bool) error {
	_, err := q.Exec(ctx, `INSERT INTO login_attempts (email, ip, ok) VALUES ($1, $2, $3)`, NormalizeEmail(email), ip, ok)
	if err != nil {
		return fmt.Errorf("record login attempt: %w", err)
	}
	return nil
}

// RecentLoginFailures counts failed attempts within window (on the database clock) for an
// email and for an address.
func RecentLoginFailures(ctx context.Context, q Querier, email, ip string, window time.Duration) (byEmail, byIP int, err error) {
	err = q.QueryRow(ctx, `SELECT
			count(*) FILTER (WHERE email = $1),
			count(*) FILTER (WHERE ip = $2)
		FROM login_attempts
		WHERE NOT ok AND at > now() - $3::interval AND (email = $1 OR ip = $2)`,
		NormalizeEmail(email), ip, window).Scan(&byEmail, &byIP)
	if err != nil {
		return 0, 0, fmt.Errorf("recent login failures: %w", err)
	}
	return byEmail, byIP, nil
}

// PruneLoginAttempts deletes attempts older than age and returns how many went.
func PruneLoginAttempts(ctx context.Context, q Querier, age time.Duration) (int64, error) {
	tag, err := q.Exec(ctx, `DELETE FROM login_attempts WHERE at < now() - $1::interval`, age)
	if err != nil {
		return 0, fmt.Errorf("prune login attempts: %w", err)
	}
	return tag.RowsAffected(), nil
}
