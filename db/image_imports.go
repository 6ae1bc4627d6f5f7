package db

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// SetImageVersionSource records where an imported version came from (an image reference, or a
// file's name; never a host path).
func SetImageVersionSource(ctx context.Context, q Querier, companyID, versionID, source string) error {
	if len(source) > 1024 {
		source = source[:1024]
	}
	if _, err := q.Exec(ctx, `UPDATE image_versions SET source = $3 WHERE company_id = $1 AND id = $2`,
		companyID, versionID, source); err != nil {
		return fmt.Errorf("set image version source: %w", err)
	}
	return nil
}

// EnvironmentCompany resolves an environment named by operators on the command line, as its id
// or as "COMPANY-SLUG/NAME", to its company and id (ErrNotFound when there is none).
func EnvironmentCompany(ctx context.Context, q Querier, ref string) (companyID, id string, err error) {
	if slug, name, ok := strings.Cut(ref, "/"); ok {
		err = q.QueryRow(ctx, `SELECT e.company_id, e.id FROM environments e JOIN companies c ON c.id = e.company_id
			WHERE c.slug = $1 AND e.name = $2`, slug, name).Scan(&companyID, &id)
	} else if validUUID(ref) {
		err = q.QueryRow(ctx, `SELECT company_id, id FROM environments WHERE id = $1`, ref).Scan(&companyID, &id)
	} else {
		return "", "", ErrNotFound
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", ErrNotFound
	}
	if err != nil {
		return "", "", fmt.Errorf("environment %s: %w", ref, err)
	}
	return companyID, id, nil
}
