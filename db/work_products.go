package db

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// WorkProduct is something a human reviews: a branch, a commit, a preview URL, an artifact, a file.
type WorkProduct struct {
	ID                   string
	CompanyID            string
	TaskID               string
	RunID                string
	ExecutionWorkspaceID string
	Kind                 string
	Ref                  string
	URL                  string
	Path                 string
	Metadata             map[string]any
	CreatedAt            time.Time
}

// AddWorkProduct records a product once per (run, kind, ref): a retried finalize adds nothing.
func AddWorkProduct(ctx context.Context, q Querier, p WorkProduct) error {
	meta := p.Metadata
	if meta == nil {
		meta = map[string]any{}
	}
	b, err := json.Marshal(meta)
	if err != nil {
		return fmt.Errorf("add work product: %w", err)
	}
	_, err = q.Exec(ctx, `INSERT INTO work_products (company_id, task_id, run_id, execution_workspace_id, kind, ref, url, path, metadata)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (run_id, kind, ref) WHERE run_id IS NOT NULL DO NOTHING`,
		p.CompanyID, nullable(p.TaskID), nullable(p.RunID), nullable(p.ExecutionWorkspaceID), p.Kind, p.Ref, p.URL, p.Path, b)
	if err != nil {
		return fmt.Errorf("add work product: %w", err)
	}
	return nil
}

// TaskWorkProducts lists a task's work products, newest first.
func TaskWorkProducts(ctx context.Context, q Querier, companyID, taskID string) ([]WorkProduct, error) {
	rows, err := q.Query(ctx, `SELECT id, company_id, coalesce(task_id::text, ''), coalesce(run_id::text, ''),
			coalesce(execution_workspace_id::text, ''), kind, ref, url, path, metadata, created_at
		FROM work_products WHERE company_id = $1 AND task_id = $2 ORDER BY created_at DESC, id DESC`, companyID, taskID)
	if err != nil {
		return nil, fmt.Errorf("task work products: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkProduct, error) {
		var p WorkProduct
		err := r.Scan(&p.ID, &p.CompanyID, &p.TaskID, &p.RunID, &p.ExecutionWorkspaceID, &p.Kind, &p.Ref, &p.URL,
			&p.Path, &p.Metadata, &p.CreatedAt)
		return p, err
	})
}
