package db

import (
	"context"
	"fmt"
	"time"

	"github.com/alexedwards/scs/v2"
)

// SessionUserKey is the session value that holds the signed-in user's id; SessionAgentKey the
// browser's User-Agent at sign-in (cut to 200 bytes). The store reads both from the session data
// it saves, so a session row names its owner without the handlers writing the table themselves.
const (
	SessionUserKey  = "user_id"
	SessionAgentKey = "user_agent"
)

// sessionOwner is what a session's data says about who holds it.
type sessionOwner struct {
	UserID    string
	UserAgent string
}

// sessionOwnerOf decodes scs's gob encoding of a session (the store's codec) for its owner; data
// it cannot read names nobody (the row is still saved: the session is scs's, not ours).
func sessionOwnerOf(data []byte) sessionOwner {
	_, values, err := scs.GobCodec{}.Decode(data)
	if err != nil {
		return sessionOwner{}
	}
	var o sessionOwner
	if id, ok := values[SessionUserKey].(string); ok && validUUID(id) {
		o.UserID = id
	}
	if ua, ok := values[SessionAgentKey].(string); ok {
		o.UserAgent = cutUTF8(ua, 200)
	}
	return o
}

// cutUTF8 cuts s to at most n bytes without splitting a character.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}

// UserSession is one live browser session of a user, as the settings page lists it.
type UserSession struct {
	ID        string // the first 12 hex characters of the stored hash: a handle, never the token
	CreatedAt time.Time
	Expiry    time.Time
	UserAgent string
	Current   bool // the session that asked
}

// UserSessions lists a user's unexpired sessions, newest first; current (the asking session's
// token, "" for none) is marked.
func UserSessions(ctx context.Context, q Querier, userID, current string) ([]UserSession, error) {
	if !validUUID(userID) {
		return nil, nil
	}
	cur := ""
	if current != "" {
		cur = sessionKey(current)
	}
	rows, err := q.Query(ctx, `SELECT left(token, 12), created_at, expiry, user_agent, token = $2
		FROM sessions WHERE user_id = $1 AND expiry > now() ORDER BY created_at DESC, token LIMIT 100`, userID, cur)
	if err != nil {
		return nil, fmt.Errorf("user sessions: %w", err)
	}
	defer rows.Close()
	var out []UserSession
	for rows.Next() {
		var s UserSession
		if err := rows.Scan(&s.ID, &s.CreatedAt, &s.Expiry, &s.UserAgent, &s.Current); err != nil {
			return nil, fmt.Errorf("user sessions: %w", err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("user sessions: %w", err)
	}
	return out, nil
}

// DeleteOtherSessions ends every session of the user except the one with token keep, and says
// how many it ended.
func DeleteOtherSessions(ctx context.Context, q Querier, userID, keep string) (int64, error) {
	if !validUUID(userID) {
		return 0, nil
	}
	tag, err := q.Exec(ctx, `DELETE FROM sessions WHERE user_id = $1 AND token <> $2`, userID, sessionKey(keep))
	if err != nil {
		return 0, fmt.Errorf("delete other sessions: %w", err)
	}
	return tag.RowsAffected(), nil
}
