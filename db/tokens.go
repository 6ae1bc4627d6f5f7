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

// RunPrincipal is a presented run token resolved to the run it was minted for. TaskID and
// WorkspaceID are "" when the run has none (or the row was deleted); AgentID is "" for a run
// started by a person.
type RunPrincipal struct {
	TokenID     string
	RunID       string
	RunStatus   string
	TaskID      string
	WorkspaceID string
	AgentID     string
	Company     Company
	// Live is true while the run is queued, preparing or running, the token is neither
	// revoked nor expired and the run's agent (if any) is not disabled: the only state in which
	// the token may be used.
	Live bool
}

// RunTokenPrincipal resolves a presented token's hash to its run token: ErrNotFound for an
// unknown hash or a user token. A token whose run ended, that was revoked or expired, or whose
// run's agent was disabled, is returned with Live false (the caller answers 401). A live token's use is recorded at most
// once a minute, like a user token's.
func RunTokenPrincipal(ctx context.Context, q Querier, hash []byte) (RunPrincipal, error) {
	var (
		p                 RunPrincipal
		tokenValid, stale bool
		runLive           bool
	)
	err := q.QueryRow(ctx, `SELECT t.id,
			t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > now()) AND a.disabled_at IS NULL,
			t.last_used_at IS NULL OR t.last_used_at < now() - interval '1 minute',
			r.id, r.status, r.status = ANY($2), coalesce(r.task_id::text, ''),
			coalesce(r.execution_workspace_id::text, ''), coalesce(r.agent_id::text, ''),
			c.id, c.name, c.slug, c.created_at
		FROM api_tokens t
		JOIN runs r ON r.id = t.run_id
		JOIN companies c ON c.id = r.company_id
		LEFT JOIN agents a ON a.id = r.agent_id
		WHERE t.token_hash = $1 AND t.kind = 'run'`, hash, LiveRunStatuses).
		Scan(&p.TokenID, &tokenValid, &stale, &p.RunID, &p.RunStatus, &runLive, &p.TaskID, &p.WorkspaceID,
			&p.AgentID, &p.Company.ID, &p.Company.Name, &p.Company.Slug, &p.Company.CreatedAt)
	if err != nil {
		return RunPrincipal{}, notFound(err)
	}
	p.Live = tokenValid && runLive
	if p.Live && stale {
		if _, err := q.Exec(ctx, `UPDATE api_tokens SET last_used_at = now() WHERE id = $1`, p.TokenID); err != nil {
			return RunPrincipal{}, fmt.Errorf("run token last used: %w", err)
		}
	}
	return p, nil
}

// RevokeRunTokens revokes every not yet revoked token of a run and returns how many it revoked.
// Ending the run already makes its tokens unusable; this is for stopping them earlier.
func RevokeRunTokens(ctx context.Context, q Querier, runID string) (int64, error) {
	if !validUUID(runID) {
		return 0, ErrNotFound
	}
	tag, err := q.Exec(ctx, `UPDATE api_tokens SET revoked_at = now()
		WHERE run_id = $1 AND kind = 'run' AND revoked_at IS NULL`, runID)
	if err != nil {
		return 0, fmt.Errorf("revoke run tokens %s: %w", runID, err)
	}
	return tag.RowsAffected(), nil
}
