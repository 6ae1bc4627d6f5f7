package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"berth/db"
	"berth/views"
	"berth/workspace"
)

// runFacts are what a run page's title and heading name besides the task: the branch the run
// worked on, its environment and how long it took (or has been going).
type runFacts struct {
	Branch      string
	Environment string
	Duration    string
}

// runFactsOf reads the branch from the run's workspace (else its plan) and the environment's name;
// a workspace or environment deleted since leaves that part out.
func (s *Server) runFactsOf(ctx context.Context, companyID string, run db.Run, now time.Time) (runFacts, error) {
	var f runFacts
	var plan workspace.Plan
	if json.Unmarshal(run.Plan, &plan) == nil {
		f.Branch = plan.Branch
	}
	if run.ExecutionWorkspaceID != "" {
		ws, err := db.ExecutionWorkspaceByID(ctx, s.pool, companyID, run.ExecutionWorkspaceID)
		switch {
		case err == nil && ws.Branch != "":
			f.Branch = ws.Branch
		case err != nil && !errors.Is(err, db.ErrNotFound):
			return f, err
		}
	}
	if run.EnvironmentID != "" {
		env, err := db.EnvironmentByID(ctx, s.pool, companyID, run.EnvironmentID)
		switch {
		case err == nil:
			f.Environment = views.EnvironmentLabel(env.Name, env.Driver)
		case !errors.Is(err, db.ErrNotFound):
			return f, err
		}
	}
	if run.StartedAt != nil {
		end := now
		if run.FinishedAt != nil {
			end = *run.FinishedAt
		}
		f.Duration = views.Duration(end.Sub(*run.StartedAt))
	}
	return f, nil
}

// runTitle is the run page's <title>: task and status, then branch, environment and duration,
// whichever are known.
func runTitle(taskKey, status string, f runFacts) string {
	parts := []string{taskKey + " run " + status}
	for _, p := range []string{f.Branch, f.Environment, f.Duration} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, " · ")
}
