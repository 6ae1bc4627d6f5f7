package db

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// PlanSnapshot is everything a task's effective plan depends on, read by one statement so it
// is one consistent snapshot: the task, its project's execution policy, the primary project
// workspace's source type, the environments the policy or the task name, and the task's binding
// with the workspace it selects.
type PlanSnapshot struct {
	Task          Task
	Policy        PlanPolicy
	PrimarySource string // "git", "directory", or "" when the project has no primary workspace
	Environments  []PlanEnvironment
	Binding       Binding
	Target        *BindingWorkspace // the bound workspace; nil when none is bound or it is gone
}

// PlanPolicy is a project's execution policy read leniently: a field with an unexpected JSON
// type reads as unset, so the resolver reports it instead of the request failing.
type PlanPolicy struct {
	DefaultMode       string
	AllowTaskOverride bool
	EnvironmentID     string
	Strategy          string
	BranchTemplate    string
}

// PlanEnvironment is an environment as the plan sees it.
type PlanEnvironment struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Driver    string `json:"driver"`
	Status    string `json:"status"`
	Qualified bool   `json:"qualified"` // a probe qualification exists and says ok
	// Uncontained: a local environment whose config says "containment": "none".
	Uncontained bool `json:"uncontained"`
	// Egress is the config's egress document (null: the driver's default) and Network a
	// sandbox's network setting, for the plan's egress line.
	Egress  json.RawMessage `json:"egress"`
	Network bool            `json:"network"`
}

// planSnapshotSQL reads the whole snapshot in one round trip. Environments are limited to the
// two the resolver can pick (the policy's and the task's); the binding and its workspace are
// left joins, so a never-bound task still has a row.
const planSnapshotSQL = `SELECT ` + taskColumns + `,
		pol.default_mode, pol.allow_override, pol.environment_id, pol.strategy, pol.branch_template,
		coalesce((SELECT pw.source_type FROM project_workspaces pw
			WHERE pw.company_id = t.company_id AND pw.project_id = t.project_id AND pw.is_primary), ''),
		coalesce((SELECT jsonb_agg(jsonb_build_object('id', e.id, 'name', e.name, 'driver', e.driver,
				'status', e.status, 'qualified', coalesce(e.qualification->'ok' = 'true'::jsonb, false),
				'uncontained', coalesce(e.config->>'containment' = 'none', false),
				'egress', e.config->'egress', 'network', coalesce(e.config->'network' = 'true'::jsonb, false)) ORDER BY e.name)
			FROM environments e WHERE e.company_id = t.company_id
				AND e.id::text IN (pol.environment_id, t.environment_id::text)), '[]'::jsonb),
		b.mode, b.execution_workspace_id::text, b.revision, b.request_key, b.updated_at,
		w.id, w.project_id, w.ref, w.mode, w.strategy, w.trust, w.status, w.branch, w.reusable, w.created_at
	` + taskFrom + `
	LEFT JOIN task_workspace_bindings b ON b.task_id = t.id AND b.company_id = t.company_id
	LEFT JOIN execution_workspaces w ON w.id = b.execution_workspace_id AND w.company_id = t.company_id
	CROSS JOIN LATERAL (SELECT
		coalesce(p.execution_policy->>'default_mode', '') AS default_mode,
		coalesce(p.execution_policy->'allow_task_override' = 'true'::jsonb, false) AS allow_override,
		lower(coalesce(p.execution_policy->>'environment_id', '')) AS environment_id,
		coalesce(p.execution_policy->>'strategy', '') AS strategy,
		coalesce(p.execution_policy->>'branch_template', '') AS branch_template) pol
	WHERE t.company_id = $1 AND t.id = $2`

// LoadPlanSnapshot reads a task's plan snapshot; a malformed id and another company's task are
// ErrNotFound.
func LoadPlanSnapshot(ctx context.Context, q Querier, companyID, taskID string) (PlanSnapshot, error) {
	if !validUUID(taskID) || !validUUID(companyID) {
		return PlanSnapshot{}, ErrNotFound
	}
	var (
		s    PlanSnapshot
		envs []byte
		b    struct {
			mode, wsID, key *string
			revision        *int64
			at              *time.Time
		}
		w struct {
			id, projectID, ref, mode, strategy, trust, status, branch *string
			reusable                                                  *bool
			at                                                        *time.Time
		}
	)
	dest := append(taskScanTargets(&s.Task),
		&s.Policy.DefaultMode, &s.Policy.AllowTaskOverride, &s.Policy.EnvironmentID, &s.Policy.Strategy,
		&s.Policy.BranchTemplate, &s.PrimarySource, &envs,
		&b.mode, &b.wsID, &b.revision, &b.key, &b.at,
		&w.id, &w.projectID, &w.ref, &w.mode, &w.strategy, &w.trust, &w.status, &w.branch, &w.reusable, &w.at)
	if err := q.QueryRow(ctx, planSnapshotSQL, companyID, taskID).Scan(dest...); err != nil {
		return PlanSnapshot{}, fmt.Errorf("plan snapshot %s: %w", taskID, notFound(err))
	}
	if err := json.Unmarshal(envs, &s.Environments); err != nil {
		return PlanSnapshot{}, fmt.Errorf("plan snapshot %s: environments: %w", taskID, err)
	}
	s.Binding = NeverBound(s.Task.ID)
	if b.mode != nil {
		s.Binding = Binding{TaskID: s.Task.ID, Mode: *b.mode, ExecutionWorkspaceID: planText(b.wsID),
			Revision: *b.revision, RequestKey: *b.key, UpdatedAt: *b.at}
	}
	if w.id != nil {
		s.Target = &BindingWorkspace{ID: *w.id, ProjectID: *w.projectID, Ref: *w.ref, Mode: *w.mode,
			Strategy: *w.strategy, Trust: *w.trust, Status: *w.status, Branch: *w.branch, Reusable: *w.reusable,
			CreatedAt: *w.at}
	}
	return s, nil
}

// planText is the value of an optional text column, "" for NULL.
func planText(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
