package db

import (
	"context"
	"fmt"
)

// Onboarding is how far an instance has come on its first steps (the dashboard's checklist for
// instance administrators): each is a count, so the checklist can say what exists.
type Onboarding struct {
	Companies            int
	ProbedEnvironments   int // active environments whose last probe passed
	Environments         int // active environments
	Projects             int
	SucceededRuns        int
	FirstCompanyID       string // "" when there is none
	FirstEnvironmentID   string // the oldest active environment, "" when none
	FirstProjectID       string
	OpenSourceRequests   int
	LocalEnvironmentOnly bool // every active environment is local (a local one needs no probe)
}

// OnboardingState reads the instance-wide facts the checklist shows (instance admins only: it
// spans every company).
func OnboardingState(ctx context.Context, q Querier) (Onboarding, error) {
	var o Onboarding
	err := q.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM companies),
			(SELECT count(*) FROM environments WHERE status = 'active' AND coalesce(qualification -> 'ok' = 'true'::jsonb, false)),
			(SELECT count(*) FROM environments WHERE status = 'active'),
			(SELECT count(*) FROM projects WHERE status = 'active'),
			(SELECT count(*) FROM (SELECT 1 FROM runs WHERE status = 'succeeded' LIMIT 1) r),
			coalesce((SELECT id::text FROM companies ORDER BY created_at, id LIMIT 1), ''),
			coalesce((SELECT id::text FROM environments WHERE status = 'active' ORDER BY created_at, id LIMIT 1), ''),
			coalesce((SELECT id::text FROM projects WHERE status = 'active' ORDER BY created_at, id LIMIT 1), ''),
			(SELECT count(*) FROM source_root_requests WHERE status = 'open'),
			NOT EXISTS (SELECT 1 FROM environments WHERE status = 'active' AND driver <> 'local')`).
		Scan(&o.Companies, &o.ProbedEnvironments, &o.Environments, &o.Projects, &o.SucceededRuns,
			&o.FirstCompanyID, &o.FirstEnvironmentID, &o.FirstProjectID, &o.OpenSourceRequests, &o.LocalEnvironmentOnly)
	if err != nil {
		return Onboarding{}, fmt.Errorf("onboarding state: %w", err)
	}
	return o, nil
}
