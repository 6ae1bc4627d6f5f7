package db

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Environment statuses.
const (
	EnvironmentActive   = "active"
	EnvironmentArchived = "archived"
)

// Environment is one row of environments as stored. Config is the validated, normalized JSON
// document without secret values (see package environment); Secrets is the sealed JSON object of
// secret values (nil when there are none) and must never leave the server; Qualification is the
// server-written probe result, nil while unqualified.
type Environment struct {
	ID            string
	CompanyID     string
	Name          string
	Driver        string
	Status        string
	Config        []byte
	Secrets       []byte
	Qualification []byte
	CreatedAt     time.Time
	UpdatedAt     time.Time
}

// EnvironmentSummary is the short form of an environment that selects and the plan resolver need.
// Qualified is true only when a probe wrote a qualification with "ok": true.
type EnvironmentSummary struct {
	ID        string
	Name      string
	Driver    string
	Status    string
	Qualified bool
}

const environmentColumns = `id, company_id, name, driver, status, config, secrets, qualification, created_at, updated_at`

func scanEnvironment(row pgx.Row) (Environment, error) {
	var e Environment
	err := row.Scan(&e.ID, &e.CompanyID, &e.Name, &e.Driver, &e.Status, &e.Config, &e.Secrets,
		&e.Qualification, &e.CreatedAt, &e.UpdatedAt)
	return e, notFound(err)
}

// EnvironmentByID loads one of a company's environments; another company's id is ErrNotFound.
func EnvironmentByID(ctx context.Context, q Querier, companyID, id string) (Environment, error) {
	if !validUUID(id) {
		return Environment{}, ErrNotFound
	}
	e, err := scanEnvironment(q.QueryRow(ctx, `SELECT `+environmentColumns+` FROM environments
		WHERE company_id = $1 AND id = $2`, companyID, id))
	if err != nil {
		return Environment{}, fmt.Errorf("environment %s: %w", id, err)
	}
	return e, nil
}

// LockEnvironment loads an environment and locks its row until the transaction q ends, so a
// change, an archive and a lease acquisition on it happen one at a time. Lease acquirers take the
// same row lock (or FOR SHARE) and check the status, so nothing is leased once archiving commits.
func LockEnvironment(ctx context.Context, q Querier, companyID, id string) (Environment, error) {
	if !validUUID(id) {
		return Environment{}, ErrNotFound
	}
	e, err := scanEnvironment(q.QueryRow(ctx, `SELECT `+environmentColumns+` FROM environments
		WHERE company_id = $1 AND id = $2 FOR UPDATE`, companyID, id))
	if err != nil {
		return Environment{}, fmt.Errorf("lock environment %s: %w", id, err)
	}
	return e, nil
}

// EnvironmentCursor is the position after which a page of environments starts: the last name and
// id of the previous page (names are unique per company; the id keeps the order total).
type EnvironmentCursor struct {
	Name string `json:"n"`
	ID   string `json:"i"`
}

// ListEnvironments returns up to limit of a company's environments ordered by name, starting after
// the cursor (the zero cursor starts at the beginning).
func ListEnvironments(ctx context.Context, q Querier, companyID string, after EnvironmentCursor, limit int) ([]Environment, error) {
	var afterID any
	if after.ID != "" {
		if !validUUID(after.ID) {
			return nil, ErrInvalidID
		}
		afterID = after.ID
	}
	rows, err := q.Query(ctx, `SELECT `+environmentColumns+` FROM environments
		WHERE company_id = $1 AND ($3::uuid IS NULL OR (name, id) > ($2, $3::uuid))
		ORDER BY name, id LIMIT $4`, companyID, after.Name, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("list environments: %w", err)
	}
	envs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Environment, error) { return scanEnvironment(r) })
	if err != nil {
		return nil, fmt.Errorf("list environments: %w", err)
	}
	return envs, nil
}

// EnvironmentSummaries lists all of a company's environments, archived ones included (callers
// filter on Status), ordered by name.
func EnvironmentSummaries(ctx context.Context, q Querier, companyID string) ([]EnvironmentSummary, error) {
	rows, err := q.Query(ctx, `SELECT id, name, driver, status,
			coalesce(qualification -> 'ok' = 'true'::jsonb, false)
		FROM environments WHERE company_id = $1 ORDER BY name, id`, companyID)
	if err != nil {
		return nil, fmt.Errorf("environment summaries: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (EnvironmentSummary, error) {
		var e EnvironmentSummary
		err := r.Scan(&e.ID, &e.Name, &e.Driver, &e.Status, &e.Qualified)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("environment summaries: %w", err)
	}
	return list, nil
}

// NewEnvironment is what creating an environment writes. ID is chosen by the caller, because the
// sealed secrets are bound to it.
type NewEnvironment struct {
	ID        string
	CompanyID string
	Name      string
	Driver    string
	Config    []byte
	Secrets   []byte
}

// CreateEnvironment inserts an active, unqualified environment; a name already used in the company
// is ErrConflict (and leaves the transaction usable).
func CreateEnvironment(ctx context.Context, q Querier, n NewEnvironment) (Environment, error) {
	e, err := scanEnvironment(q.QueryRow(ctx, `INSERT INTO environments (id, company_id, name, driver, config, secrets)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (company_id, name) DO NOTHING
		RETURNING `+environmentColumns, n.ID, n.CompanyID, n.Name, n.Driver, n.Config, n.Secrets))
	if errors.Is(err, ErrNotFound) {
		return Environment{}, fmt.Errorf("create environment %q: %w", n.Name, ErrConflict)
	}
	if err != nil {
		return Environment{}, fmt.Errorf("create environment: %w", err)
	}
	return e, nil
}

// EnvironmentNameTaken reports whether another environment of the company (not exceptID) already
// has the name.
func EnvironmentNameTaken(ctx context.Context, q Querier, companyID, name, exceptID string) (bool, error) {
	var taken bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM environments
		WHERE company_id = $1 AND name = $2 AND id <> $3)`, companyID, name, exceptID).Scan(&taken)
	if err != nil {
		return false, fmt.Errorf("environment name taken: %w", err)
	}
	return taken, nil
}

// EnvironmentChange is the new state of an environment's client-editable columns. The caller
// computes it from the locked row and the request; ClearQualification is set when the driver, the
// config, the secrets or the active image changed.
type EnvironmentChange struct {
	Name               string
	Driver             string
	Status             string
	Config             []byte
	Secrets            []byte
	ClearQualification bool
}

// UpdateEnvironment writes a change in one statement, clearing the qualification in the same
// UPDATE when asked. A name taken meanwhile is ErrConflict.
func UpdateEnvironment(ctx context.Context, q Querier, companyID, id string, c EnvironmentChange) (Environment, error) {
	e, err := scanEnvironment(q.QueryRow(ctx, `UPDATE environments SET name = $3, driver = $4, status = $5,
			config = $6, secrets = $7,
			qualification = CASE WHEN $8 THEN NULL ELSE qualification END,
			updated_at = now()
		WHERE company_id = $1 AND id = $2
		RETURNING `+environmentColumns, companyID, id, c.Name, c.Driver, c.Status, c.Config, c.Secrets, c.ClearQualification))
	if isUniqueViolation(err) {
		return Environment{}, fmt.Errorf("update environment %s: %w", id, ErrConflict)
	}
	if err != nil {
		return Environment{}, fmt.Errorf("update environment %s: %w", id, err)
	}
	return e, nil
}

// SetEnvironmentQualification writes the server's probe result into an environment's
// qualification. The caller checks, under the row lock, that the result was earned for the
// environment's current fingerprint; updated_at (the last edit) is left alone.
func SetEnvironmentQualification(ctx context.Context, q Querier, companyID, environmentID string, doc []byte) error {
	tag, err := q.Exec(ctx, `UPDATE environments SET qualification = $3 WHERE company_id = $1 AND id = $2`,
		companyID, environmentID, doc)
	if err != nil {
		return fmt.Errorf("qualify environment %s: %w", environmentID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("qualify environment %s: %w", environmentID, ErrNotFound)
	}
	return nil
}
