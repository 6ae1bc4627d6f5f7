package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"berth/db"
	"berth/views"
	"berth/workspace/receipt"
	"berth/workspace/receiptcheck"
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
	rc, err := receipt.Parse(doc)
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

// receiptVerifyRequest is the optional body of POST /api/runs/{id}/receipt/verify: a receipt
// document to check instead of the stored one (it must be this run's).
type receiptVerifyRequest struct {
	Receipt json.RawMessage `json:"receipt"`
}

// receiptVerifyJSON is the answer of POST /api/runs/{id}/receipt/verify.
type receiptVerifyJSON struct {
	RunID     string `json:"run_id"`
	Signature string `json:"signature"` // "ok" or "failed"
	// Verified is true when the signature holds and no digest mismatched.
	Verified bool `json:"verified"`
	receiptcheck.Report
}

// runReceiptVerifyAPI is POST /api/runs/{id}/receipt/verify (readers of the run): the checks of
// `berth receipt verify` (workspace/receiptcheck) against the stored receipt, or against the
// receipt in the body → 200 {run_id, signature, verified, checks, matched, mismatched,
// not_checked}. A bad signature is 200 with signature "failed" and no checks: nothing in such a
// document is trusted.
func (s *Server) runReceiptVerifyAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx, id := r.Context(), r.PathValue("id")
	a, err := s.objectAccess(ctx, p, "runs", id)
	if err != nil {
		return err
	}
	var in receiptVerifyRequest
	if r.ContentLength != 0 || r.Header.Get("Content-Type") != "" {
		if err := decodeJSON(w, r, &in); err != nil {
			return err
		}
	}
	doc := []byte(in.Receipt)
	if len(in.Receipt) == 0 || string(in.Receipt) == "null" {
		if doc, err = db.ReceiptOf(ctx, s.pool, a.Company.ID, id); errors.Is(err, db.ErrNotFound) {
			return errNoReceipt
		} else if err != nil {
			return err
		}
	} else {
		var named struct {
			RunID string `json:"run_id"`
		}
		if json.Unmarshal(doc, &named) != nil || !strings.EqualFold(named.RunID, id) {
			return badRequest("receipt_of_another_run", "The receipt given is not this run's (its run_id differs).")
		}
	}
	out := receiptVerifyJSON{RunID: id, Signature: "ok", Report: receiptcheck.Report{Checks: []receiptcheck.Check{}}}
	src := receiptcheck.Sources{Manager: s.workspaces, Artifacts: s.artifacts,
		Lineage: func(ctx context.Context, runID string) (db.ReceiptLineage, error) {
			return db.LineageOfRun(ctx, s.pool, runID)
		}}
	rep, err := receiptcheck.Verify(ctx, s.receiptKey, doc, src)
	switch {
	case errors.Is(err, receiptcheck.ErrSignature):
		out.Signature = "failed"
	case err != nil:
		return err
	default:
		out.Report = rep
		out.Verified = rep.Mismatched == 0
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
