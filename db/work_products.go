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

// workProductColumns are the columns scanWorkProduct reads, in its order.
const workProductColumns = `id, company_id, coalesce(task_id::text, ''), coalesce(run_id::text, ''),
	coalesce(execution_workspace_id::text, ''), kind, ref, url, path, metadata, created_at`

func scanWorkProduct(row pgx.Row) (WorkProduct, error) {
	var p WorkProduct
	err := row.Scan(&p.ID, &p.CompanyID, &p.TaskID, &p.RunID, &p.ExecutionWorkspaceID, &p.Kind, &p.Ref, &p.URL,
		&p.Path, &p.Metadata, &p.CreatedAt)
	return p, notFound(err)
}

func collectWorkProducts(rows pgx.Rows) ([]WorkProduct, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkProduct, error) { return scanWorkProduct(r) })
}

// AddWorkProduct records a product once, so a retried job adds nothing: a run's product once per
// (run, kind, ref), a product that belongs to no run (a rescue commit made by a close) once per
// (workspace, kind, ref).
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
		SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9
		WHERE $3::uuid IS NOT NULL
		   OR NOT EXISTS (SELECT 1 FROM work_products WHERE execution_workspace_id = $4 AND kind = $5 AND ref = $6)
		ON CONFLICT (run_id, kind, ref) WHERE run_id IS NOT NULL DO NOTHING`,
		p.CompanyID, nullable(p.TaskID), nullable(p.RunID), nullable(p.ExecutionWorkspaceID), p.Kind, p.Ref, p.URL, p.Path, b)
	if err != nil {
		return fmt.Errorf("add work product: %w", err)
	}
	return nil
}

// TaskWorkProducts lists a task's work products, newest first.
func TaskWorkProducts(ctx context.Context, q Querier, companyID, taskID string) ([]WorkProduct, error) {
	rows, err := q.Query(ctx, `SELECT `+workProductColumns+` FROM work_products
		WHERE company_id = $1 AND task_id = $2 ORDER BY created_at DESC, id DESC`, companyID, taskID)
	if err != nil {
		return nil, fmt.Errorf("task work products: %w", err)
	}
	return collectWorkProducts(rows)
}

// WorkProductCursor is the position after which a page of work products starts.
type WorkProductCursor struct {
	CreatedAt time.Time `json:"t"`
	ID        string    `json:"i"`
}

// TaskWorkProductsPage lists a task's work products newest first, after the cursor (zero: from
// the newest), at most limit.
func TaskWorkProductsPage(ctx context.Context, q Querier, companyID, taskID string, after WorkProductCursor, limit int) ([]WorkProduct, error) {
	if !validUUID(companyID) || !validUUID(taskID) {
		return nil, ErrNotFound
	}
	var afterID any
	if after.ID != "" {
		if !validUUID(after.ID) {
			return nil, fmt.Errorf("task work products: %w", ErrInvalidID)
		}
		afterID = after.ID
	}
	rows, err := q.Query(ctx, `SELECT `+workProductColumns+` FROM work_products
		WHERE company_id = $1 AND task_id = $2
		  AND ($4::uuid IS NULL OR (created_at, id) < ($3::timestamptz, $4::uuid))
		ORDER BY created_at DESC, id DESC LIMIT $5`, companyID, taskID, after.CreatedAt, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("task work products: %w", err)
	}
	return collectWorkProducts(rows)
}

// WorkspaceWorkProducts lists the work products recorded from a workspace, newest first.
func WorkspaceWorkProducts(ctx context.Context, q Querier, companyID, workspaceID string, limit int) ([]WorkProduct, error) {
	if !validUUID(companyID) || !validUUID(workspaceID) {
		return nil, ErrNotFound
	}
	rows, err := q.Query(ctx, `SELECT `+workProductColumns+` FROM work_products
		WHERE company_id = $1 AND execution_workspace_id = $2 ORDER BY created_at DESC, id DESC LIMIT $3`,
		companyID, workspaceID, limit)
	if err != nil {
		return nil, fmt.Errorf("workspace work products: %w", err)
	}
	return collectWorkProducts(rows)
}

// CreateWorkProduct records a product a person or an agent adds by hand (POST
// /api/tasks/{id}/work-products) and returns it; unlike AddWorkProduct it never deduplicates.
func CreateWorkProduct(ctx context.Context, q Querier, p WorkProduct) (WorkProduct, error) {
	meta := p.Metadata
	if meta == nil {
		meta = map[string]any{}
	}
	b, err := json.Marshal(meta)
	if err != nil {
		return WorkProduct{}, fmt.Errorf("create work product: %w", err)
	}
	wp, err := scanWorkProduct(q.QueryRow(ctx, `INSERT INTO work_products (company_id, task_id, run_id, execution_workspace_id, kind, ref, url, path, metadata)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING `+workProductColumns,
		p.CompanyID, nullable(p.TaskID), nullable(p.RunID), nullable(p.ExecutionWorkspaceID), p.Kind, p.Ref, p.URL, p.Path, b))
	if err != nil {
		return WorkProduct{}, fmt.Errorf("create work product: %w", err)
	}
	return wp, nil
}
