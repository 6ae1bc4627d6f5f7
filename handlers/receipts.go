package handlers

import (
	"context"
	"errors"
	"net/http"

	"berth/db"
	"berth/views"
)

// Receipts (DESIGN §13, docs/attempts.md "Receipts"): the signed document finalize stored for a
// run, served verbatim (not wrapped) so that `berth receipt verify` can check the very bytes.

// errNoReceipt answers for a run whose receipt is not written (yet: it comes with finalize).
var errNoReceipt = &httpError{Status: http.StatusNotFound, Code: "no_receipt",
	Message: "The run has no receipt yet: it is written when the run's finalize settles."}

// runReceiptAPI is GET /api/runs/{id}/receipt (readers): the bare receipt object.
func (s *Server) runReceiptAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	return s.sendReceipt(w, r, p, false)
}

// runReceiptDownload is GET /runs/{id}/receipt (readers): the receipt as a file, for the run page.
func (s *Server) runReceiptDownload(w http.ResponseWriter, r *http.Request, p *principal) error {
	return s.sendReceipt(w, r, p, true)
}

func (s *Server) sendReceipt(w http.ResponseWriter, r *http.Request, p *principal, attachment bool) error {
	id := r.PathValue("id")
	a, err := s.objectAccess(r.Context(), p, "runs", id)
	if err != nil {
		return err
	}
	doc, err := db.ReceiptOf(r.Context(), s.pool, a.Company.ID, id)
	if errors.Is(err, db.ErrNotFound) {
		return errNoReceipt
	}
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if attachment {
		w.Header().Set("Content-Disposition", `attachment; filename="receipt-`+id+`.json"`)
	}
	_, err = w.Write(doc)
	return err
}

// receiptView is the run page's receipt panel; nil when the run has none yet.
func (s *Server) receiptView(ctx context.Context, companyID, runID string) (*views.ReceiptView, error) {
	doc, err := db.ReceiptOf(ctx, s.pool, companyID, runID)
	if errors.Is(err, db.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	rc, err := db.ParseReceipt(doc)
	if err != nil {
		return nil, err
	}
	deref := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	return &views.ReceiptView{RunID: runID, Disposition: rc.Disposition, WorkspaceRef: deref(rc.WorkspaceRef),
		BaseCommit: deref(rc.BaseCommit), BaseTreeDigest: deref(rc.BaseTreeDigest), FinalTreeDigest: deref(rc.FinalTreeDigest),
		CapsuleDigest: deref(rc.CapsuleDigest), ImageDigest: deref(rc.ImageDigest),
		EnvironmentFingerprint: deref(rc.EnvironmentFingerprint), NodeID: rc.NodeID, Signature: rc.Signature}, nil
}
