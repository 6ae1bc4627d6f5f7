package db

import (
	"context"
	"fmt"
)

// Ping reports whether the database answers a query, for the health endpoint that load
// balancers poll.
func Ping(ctx context.Context, q Querier) error {
	var one int
	if err := q.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
		return fmt.Errorf("ping database: %w", err)
	}
	return nil
}
