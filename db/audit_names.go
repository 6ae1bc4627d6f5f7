package db

import (
	"context"
	"fmt"
)

// AuditTargetNames names audit targets for people: for each id in ids that is one of the
// company's projects, tasks, environments, project workspaces, agents, execution workspaces, runs,
// leases, members or the company itself, a label keyed by "type/id" (the target_type the audit
// log uses). Anything else, gone or of another company, is left out: the page then shows the id.
func AuditTargetNames(ctx context.Context, q Querier, companyID string, ids []string) (map[string]string, error) {
	out := map[string]string{}
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := q.Query(ctx, `
		SELECT 'project', id::text, name FROM projects WHERE company_id = $1 AND id::text = ANY($2)
		UNION ALL SELECT 'task', id::text, key || ' ' || title FROM tasks WHERE company_id = $1 AND id::text = ANY($2)
		UNION ALL SELECT 'environment', id::text, name FROM environments WHERE company_id = $1 AND id::text = ANY($2)
		UNION ALL SELECT 'project_workspace', id::text, name FROM project_workspaces WHERE company_id = $1 AND id::text = ANY($2)
		UNION ALL SELECT 'agent', id::text, name FROM agents WHERE company_id = $1 AND id::text = ANY($2)
		UNION ALL SELECT 'execution_workspace', id::text, 'workspace ' || left(ref, 11) FROM execution_workspaces
			WHERE company_id = $1 AND id::text = ANY($2)
		UNION ALL SELECT 'run', r.id::text, 'run of ' || coalesce(t.key, 'a deleted task') FROM runs r
			LEFT JOIN tasks t ON t.id = r.task_id AND t.company_id = r.company_id WHERE r.company_id = $1 AND r.id::text = ANY($2)
		UNION ALL SELECT 'environment_lease', l.id::text, 'lease on ' || coalesce(e.name, 'a deleted environment') FROM environment_leases l
			LEFT JOIN environments e ON e.id = l.environment_id AND e.company_id = l.company_id WHERE l.company_id = $1 AND l.id::text = ANY($2)
		UNION ALL SELECT 'user', u.id::text, u.email FROM users u JOIN memberships m ON m.user_id = u.id AND m.company_id = $1
			WHERE u.id::text = ANY($2)
		UNION ALL SELECT 'company', id::text, name FROM companies WHERE id = $1 AND id::text = ANY($2)`, companyID, ids)
	if err != nil {
		return nil, fmt.Errorf("audit target names: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var typ, id, name string
		if err := rows.Scan(&typ, &id, &name); err != nil {
			return nil, fmt.Errorf("audit target names: %w", err)
		}
		out[typ+"/"+id] = name
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("audit target names: %w", err)
	}
	return out, nil
}
