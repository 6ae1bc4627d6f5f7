package jobs

import (
	"context"
	"errors"

	"berth/db"
)

// Attempts (DESIGN §13, docs/attempts.md) are normal runs: provision, execute_run and finalize
// treat them as any other run, except that provision realizes each in a new worktree on its own
// branch (the plan's branch, berth/{task_key}-a{n}) from the group's recorded base commit rather
// than continuing in the task's open workspace, and finalize seals the workspace (receipts.go).

// attemptBase is the base commit an attempt run forks from, "" for an ordinary run.
func attemptBase(ctx context.Context, q db.Querier, run db.Run) (string, error) {
	a, err := db.AttemptOfRun(ctx, q, run.ID)
	if errors.Is(err, db.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return a.BaseCommit, nil
}
