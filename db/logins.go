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

// LoginFailures is the recent failure record behind the sign-in throttle, as the database clock
// sees it, so every replica computes the same delay.
type LoginFailures struct {
	Account      int           // failures for the email within the window since ip last signed in to it
	AccountSince time.Duration // time since the account's latest counted failure
	Address      int           // failures from the address within the window (any account)
	AddressSince time.Duration // time since the address's latest failure
}

// RecentLoginFailureState reads the failures that drive the sign-in delay for email and ip:
// a success clears the account's count as seen from the address that signed in (the owner's own
// typos stop counting against them, an attacker elsewhere still sees every failure), and never
// clears the address's count (an attacker with one account of their own could otherwise reset it).
func RecentLoginFailureState(ctx context.Context, q Querier, email, ip string, window time.Duration) (LoginFailures, error) {
	var f LoginFailures
	var accSince, addrSince float64
	err := q.QueryRow(ctx, `WITH
		acct AS (SELECT count(*) AS n, coalesce(extract(epoch FROM now() - max(at)), 0)::float8 AS since
			FROM login_attempts
			WHERE email = $1 AND NOT ok AND at > now() - $3::interval
			  AND at > coalesce((SELECT max(at) FROM login_attempts WHERE email = $1 AND ip = $2 AND ok), '-infinity')),
		addr AS (SELECT count(*) AS n, coalesce(extract(epoch FROM now() - max(at)), 0)::float8 AS since
			FROM login_attempts
			WHERE ip = $2 AND NOT ok AND at > now() - $3::interval)
		SELECT acct.n, acct.since, addr.n, addr.since FROM acct, addr`,
		NormalizeEmail(email), ip, window).Scan(&f.Account, &accSince, &f.Address, &addrSince)
	if err != nil {
		return LoginFailures{}, fmt.Errorf("recent login failure state: %w", err)
	}
	f.AccountSince = time.Duration(accSince * float64(time.Second))
	f.AddressSince = time.Duration(addrSince * float64(time.Second))
	return f, nil
}

// PruneLoginAttempts deletes attempts older than age and returns how many went.
func PruneLoginAttempts(ctx context.Context, q Querier, age time.Duration) (int64, error) {
	tag, err := q.Exec(ctx, `DELETE FROM login_attempts WHERE at < now() - $1::interval`, age)
	if err != nil {
		return 0, fmt.Errorf("prune login attempts: %w", err)
	}
	return tag.RowsAffected(), nil
}
