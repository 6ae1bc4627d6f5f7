package db

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SessionStore keeps browser sessions in the sessions table under the sha256 of their token, so
// a copy of the database (a backup, a read replica, a leaked dump) holds no live session: the
// token exists only in the browser's cookie. It satisfies scs.Store and scs.CtxStore. It cannot
// list sessions by token (scs.IterableStore), by design. Expired rows are ignored here and
// deleted by the housekeeping job.
type SessionStore struct {
	pool *pgxpool.Pool
	mem  sessionMemory // saves that only move the expiry a little are skipped (sessions_refresh.go)
}

// NewSessionStore returns the session store for scs on pool; it starts no goroutine.
func NewSessionStore(pool *pgxpool.Pool) *SessionStore {
	return &SessionStore{pool: pool}
}

// sessionKey is the stored form of a session token: its sha256, in hex. scs tokens are 32
// random bytes, so an unsalted hash cannot be reversed or guessed.
func sessionKey(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// Find is FindCtx without a request context.
func (s *SessionStore) Find(token string) ([]byte, bool, error) {
	return s.FindCtx(context.Background(), token)
}

// FindCtx returns the data of the unexpired session with this token; found is false, with no
// error, for an unknown, expired or malformed token.
func (s *SessionStore) FindCtx(ctx context.Context, token string) (data []byte, found bool, err error) {
	err = s.pool.QueryRow(ctx, `SELECT data FROM sessions WHERE token = $1 AND expiry > now()`,
		sessionKey(token)).Scan(&data)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("find session: %w", err)
	}
	s.mem.loaded(sessionKey(token), data)
	return data, true, nil
}

// Commit is CommitCtx without a request context.
func (s *SessionStore) Commit(token string, data []byte, expiry time.Time) error {
	return s.CommitCtx(context.Background(), token, data, expiry)
}

// CommitCtx stores the session's data and expiry under the hash of its token, replacing any
// earlier version of the same session. The user the data names (SessionUserKey) and the browser
// it began in (SessionAgentKey) are stored beside it, for UserSessions.
func (s *SessionStore) CommitCtx(ctx context.Context, token string, data []byte, expiry time.Time) error {
	key := sessionKey(token)
	if s.mem.skip(key, data, expiry) {
		return nil
	}
	owner := sessionOwnerOf(data)
	if _, err := s.pool.Exec(ctx, `INSERT INTO sessions (token, data, expiry, user_id, user_agent)
		VALUES ($1, $2, $3, (SELECT id FROM users WHERE id = $4::uuid), $5)
		ON CONFLICT (token) DO UPDATE SET data = EXCLUDED.data, expiry = EXCLUDED.expiry,
			user_id = EXCLUDED.user_id, user_agent = EXCLUDED.user_agent`,
		key, data, expiry, nullable(owner.UserID), owner.UserAgent); err != nil {
		return fmt.Errorf("commit session: %w", err)
	}
	s.mem.wrote(key, data, expiry)
	return nil
}

// Delete is DeleteCtx without a request context.
func (s *SessionStore) Delete(token string) error {
	return s.DeleteCtx(context.Background(), token)
}

// DeleteCtx removes the session with this token; an unknown token is not an error.
func (s *SessionStore) DeleteCtx(ctx context.Context, token string) error {
	s.mem.forget(sessionKey(token))
	if _, err := s.pool.Exec(ctx, `DELETE FROM sessions WHERE token = $1`, sessionKey(token)); err != nil {
		return fmt.Errorf("delete session: %w", err)
	}
	return nil
}

// PruneSessions deletes the expired sessions (the housekeeping job), and says how many.
func PruneSessions(ctx context.Context, q Querier) (int64, error) {
	tag, err := q.Exec(ctx, `DELETE FROM sessions WHERE expiry < now()`)
	if err != nil {
		return 0, fmt.Errorf("prune sessions: %w", err)
	}
	return tag.RowsAffected(), nil
}
