package db

import (
	"context"
	"fmt"
)

// Receipts (DESIGN §13): the stored documents of finalized runs. db keeps the bytes exactly as
// workspace/receipt signed them (GET /api/runs/{id}/receipt serves them verbatim, `berth receipt
// verify` checks them); it neither signs nor parses them.

// SaveReceipt stores (or, for a re-signed receipt, replaces) the run's receipt document and tells
// live pages the run changed.
func SaveReceipt(ctx context.Context, q Querier, companyID, runID, disposition string, doc []byte) error {
	_, err := q.Exec(ctx, `INSERT INTO receipts (run_id, company_id, document, disposition) VALUES ($1, $2, $3, $4)
		ON CONFLICT (run_id) DO UPDATE SET document = EXCLUDED.document, disposition = EXCLUDED.disposition, updated_at = now()`,
		runID, companyID, doc, disposition)
	if err != nil {
		return fmt.Errorf("save receipt: %w", err)
	}
	// Pages showing the run (its page, the task's attempts) re-fetch when it commits (DESIGN §12).
	_, err = q.Exec(ctx, `SELECT pg_notify('berth_events', json_strip_nulls(json_build_object('company_id', company_id,
			'topic', 'run', 'id', id, 'task_id', task_id, 'workspace_id', execution_workspace_id, 'run_id', id))::text)
		FROM runs WHERE id = $1`, runID)
	if err != nil {
		return fmt.Errorf("save receipt: notify: %w", err)
	}
	return nil
}

// ReceiptOf reads a company's run's receipt document; none (or another company's) is ErrNotFound.
func ReceiptOf(ctx context.Context, q Querier, companyID, runID string) ([]byte, error) {
	if !validUUID(runID) {
		return nil, ErrNotFound
	}
	var doc []byte
	err := q.QueryRow(ctx, `SELECT document FROM receipts WHERE company_id = $1 AND run_id = $2`, companyID, runID).Scan(&doc)
	if err != nil {
		return nil, notFound(err)
	}
	return doc, nil
}

// ReceiptLineage is where a run's result can still be found, for `berth receipt verify`: the
// workspace's strategy and branch, the project workspace's source, the commit the run recorded
// and, for a discarded attempt, its rescue ref. Instance-wide (an operator's command).
type ReceiptLineage struct {
	Strategy  string
	Branch    string
	Source    string
	Commit    string // the run's commit work product, "" when it made none
	RescueRef string
}

// LineageOfRun reads a run's lineage; a run that is not in the database is ErrNotFound.
func LineageOfRun(ctx context.Context, q Querier, runID string) (ReceiptLineage, error) {
	if !validUUID(runID) {
		return ReceiptLineage{}, ErrNotFound
	}
	var l ReceiptLineage
	err := q.QueryRow(ctx, `SELECT coalesce(w.strategy, ''), coalesce(w.branch, ''), coalesce(pw.source, ''),
			coalesce((SELECT p.ref FROM work_products p WHERE p.run_id = r.id AND p.kind = 'commit'
				ORDER BY p.created_at DESC LIMIT 1), ''), r.attempt_rescue_ref
		FROM runs r LEFT JOIN execution_workspaces w ON w.id = r.execution_workspace_id
			LEFT JOIN project_workspaces pw ON pw.id = w.project_workspace_id
		WHERE r.id = $1`, runID).Scan(&l.Strategy, &l.Branch, &l.Source, &l.Commit, &l.RescueRef)
	return l, notFound(err)
}
