package db

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// SearchHit is one result of the command palette's search: an object of one of the caller's
// companies, with what the palette shows and where it leads.
type SearchHit struct {
	Kind        string // project | task | workspace | run | environment
	ID          string
	CompanyID   string
	CompanyName string
	Title       string // the project's name, the task's key and title, a run's task key, …
	Detail      string // a short second line: status, project, branch
	At          time.Time
}

// SearchPerKind is how many hits of each kind a search returns at most.
const SearchPerKind = 6

// escapeLike makes s a literal inside a LIKE pattern (backslash is the escape).
func escapeLike(s string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(s)
}

// Search finds projects (name, key), tasks (key, title), execution workspaces (ref, branch, its
// task's key), runs (their task's key and title, or the start of the run's id) and environments
// (name) matching text, case-insensitively, in the companies the user is a member of (every
// company for an instance admin): company scoping is the query's own WHERE, never the caller's.
// Hits come grouped by kind, the kind with the best match first; within a kind an exact key or
// name comes first, then a prefix, then any match. Blank text finds nothing.
func Search(ctx context.Context, q Querier, userID string, instanceAdmin bool, text string, perKind int) ([]SearchHit, error) {
	text = strings.TrimSpace(text)
	if text == "" || !validUUID(userID) {
		return nil, nil
	}
	if len(text) > 200 {
		text = cutUTF8(text, 200)
	}
	if perKind <= 0 || perKind > 50 {
		perKind = SearchPerKind
	}
	lit := escapeLike(strings.ToLower(text))
	prefix, contains := lit+"%", "%"+lit+"%"
	idPrefix := ""
	if h := strings.ToLower(text); len(h) >= 4 && len(h) <= 36 && strings.Trim(h, "0123456789abcdef-") == "" {
		idPrefix = escapeLike(h) + "%"
	}
	rows, err := q.Query(ctx, `WITH visible AS (
			SELECT id, name FROM companies
			WHERE $2 OR id IN (SELECT company_id FROM memberships WHERE user_id = $1)),
		p AS (
			SELECT 'project' AS kind, x.id, x.company_id, v.name AS company, x.name || ' (' || x.key || ')' AS title,
				x.status AS detail, x.updated_at AS at,
				CASE WHEN lower(x.key) = lower($3) OR lower(x.name) = lower($3) THEN 0
					WHEN lower(x.key) LIKE $4 OR lower(x.name) LIKE $4 THEN 1 ELSE 2 END AS rank
			FROM projects x JOIN visible v ON v.id = x.company_id
			WHERE lower(x.key) LIKE $5 OR lower(x.name) LIKE $5
			ORDER BY rank, x.name LIMIT $7),
		t AS (
			SELECT 'task' AS kind, x.id, x.company_id, v.name, x.key || ' · ' || x.title,
				x.status, x.updated_at,
				CASE WHEN lower(x.key) = lower($3) THEN 0 WHEN lower(x.key) LIKE $4 THEN 1
					WHEN lower(x.title) LIKE $4 THEN 2 ELSE 3 END AS rank
			FROM tasks x JOIN visible v ON v.id = x.company_id
			WHERE lower(x.key) LIKE $5 OR lower(x.title) LIKE $5
			ORDER BY rank, x.updated_at DESC, x.id LIMIT $7),
		w AS (
			SELECT 'workspace' AS kind, x.id, x.company_id, v.name,
				coalesce(st.key || ' · ', '') || CASE WHEN x.branch <> '' THEN x.branch ELSE x.ref END,
				x.status, x.updated_at,
				CASE WHEN lower(x.branch) = lower($3) OR lower(st.key) = lower($3) THEN 0 ELSE 1 END AS rank
			FROM execution_workspaces x JOIN visible v ON v.id = x.company_id
			LEFT JOIN tasks st ON st.id = x.source_task_id AND st.company_id = x.company_id
			WHERE lower(x.ref) LIKE $5 OR lower(x.branch) LIKE $5 OR lower(st.key) LIKE $5
			ORDER BY rank, x.updated_at DESC, x.id LIMIT $7),
		r AS (
			SELECT 'run' AS kind, x.id, x.company_id, v.name, coalesce(rt.key || ' · ' || rt.title, 'run ' || left(x.id::text, 8)),
				x.status, x.created_at,
				CASE WHEN lower(rt.key) = lower($3) THEN 0 ELSE 1 END AS rank
			FROM runs x JOIN visible v ON v.id = x.company_id
			LEFT JOIN tasks rt ON rt.id = x.task_id AND rt.company_id = x.company_id
			WHERE lower(rt.key) LIKE $5 OR lower(rt.title) LIKE $5 OR ($6 <> '' AND x.id::text LIKE $6)
			ORDER BY rank, x.created_at DESC, x.id LIMIT $7),
		e AS (
			SELECT 'environment' AS kind, x.id, x.company_id, v.name, x.name, x.driver || ' · ' || x.status, x.updated_at,
				CASE WHEN lower(x.name) = lower($3) THEN 0 WHEN lower(x.name) LIKE $4 THEN 1 ELSE 2 END AS rank
			FROM environments x JOIN visible v ON v.id = x.company_id
			WHERE lower(x.name) LIKE $5
			ORDER BY rank, x.name LIMIT $7)
		SELECT kind, id, company_id, company, title, detail, at FROM (
			SELECT *, 1 AS k FROM p UNION ALL SELECT *, 2 FROM t UNION ALL SELECT *, 3 FROM w
			UNION ALL SELECT *, 4 FROM r UNION ALL SELECT *, 5 FROM e) hits
		ORDER BY min(rank) OVER (PARTITION BY k), k, rank, at DESC`,
		userID, instanceAdmin, text, prefix, contains, idPrefix, perKind)
	if err != nil {
		return nil, fmt.Errorf("search: %w", err)
	}
	hits, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SearchHit, error) {
		var h SearchHit
		return h, r.Scan(&h.Kind, &h.ID, &h.CompanyID, &h.CompanyName, &h.Title, &h.Detail, &h.At)
	})
	if err != nil {
		return nil, fmt.Errorf("search: %w", err)
	}
	return hits, nil
}
