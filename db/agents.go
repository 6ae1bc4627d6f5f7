package db

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Agent is a company's non-human principal for automation. It has no password; it acts only
// through run-scoped tokens, which disabling it revokes.
type Agent struct {
	ID          string
	CompanyID   string
	Name        string
	Description string
	DisabledAt  *time.Time
	CreatedBy   string // the user who created it; "" once that user is gone
	CreatedAt   time.Time
}

// Disabled reports whether the agent may no longer act.
func (a Agent) Disabled() bool { return a.DisabledAt != nil }

// agentColumns are the columns scanAgent reads, in its order.
const agentColumns = `id, company_id, name, description, disabled_at, coalesce(created_by::text, ''), created_at`

// scanAgent reads agentColumns; no row is ErrNotFound.
func scanAgent(row pgx.Row) (Agent, error) {
	var a Agent
	err := row.Scan(&a.ID, &a.CompanyID, &a.Name, &a.Description, &a.DisabledAt, &a.CreatedBy, &a.CreatedAt)
	return a, notFound(err)
}

// CreateAgent inserts an agent; a name already used in the company is ErrConflict, and the
// transaction stays usable.
func CreateAgent(ctx context.Context, q Querier, companyID, name, description, createdBy string) (Agent, error) {
	a, err := scanAgent(q.QueryRow(ctx, `INSERT INTO agents (company_id, name, description, created_by)
		VALUES ($1, $2, $3, $4) ON CONFLICT (company_id, name) DO NOTHING RETURNING `+agentColumns,
		companyID, name, description, nullable(createdBy)))
	if errors.Is(err, ErrNotFound) {
		return Agent{}, fmt.Errorf("create agent %q: %w", name, ErrConflict)
	}
	if err != nil {
		return Agent{}, fmt.Errorf("create agent: %w", err)
	}
	return a, nil
}

// AgentByID returns one of a company's agents; another company's agent is ErrNotFound.
func AgentByID(ctx context.Context, q Querier, companyID, id string) (Agent, error) {
	if !validUUID(id) {
		return Agent{}, ErrNotFound
	}
	return scanAgent(q.QueryRow(ctx, `SELECT `+agentColumns+` FROM agents WHERE company_id = $1 AND id = $2`, companyID, id))
}

// ListAgents lists a company's agents in name order, after afterName.
func ListAgents(ctx context.Context, q Querier, companyID, afterName string, limit int) ([]Agent, error) {
	rows, err := q.Query(ctx, `SELECT `+agentColumns+` FROM agents WHERE company_id = $1 AND name > $2
		ORDER BY name LIMIT $3`, companyID, afterName, limit)
	if err != nil {
		return nil, fmt.Errorf("list agents: %w", err)
	}
	as, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Agent, error) { return scanAgent(r) })
	if err != nil {
		return nil, fmt.Errorf("list agents: %w", err)
	}
	return as, nil
}

// DisableAgent disables an agent and revokes its live tokens. It is idempotent: changed is false
// when the agent was already disabled (and nothing is written).
func DisableAgent(ctx context.Context, q Querier, companyID, id string) (a Agent, changed bool, err error) {
	if !validUUID(id) {
		return Agent{}, false, ErrNotFound
	}
	a, err = scanAgent(q.QueryRow(ctx, `UPDATE agents SET disabled_at = now()
		WHERE company_id = $1 AND id = $2 AND disabled_at IS NULL RETURNING `+agentColumns, companyID, id))
	if errors.Is(err, ErrNotFound) {
		a, err = AgentByID(ctx, q, companyID, id)
		if err != nil {
			return Agent{}, false, fmt.Errorf("disable agent: %w", err)
		}
		return a, false, nil
	}
	if err != nil {
		return Agent{}, false, fmt.Errorf("disable agent: %w", err)
	}
	if _, err := q.Exec(ctx, `UPDATE api_tokens SET revoked_at = now() WHERE agent_id = $1 AND revoked_at IS NULL`, id); err != nil {
		return Agent{}, false, fmt.Errorf("disable agent: revoke tokens: %w", err)
	}
	return a, true, nil
}
