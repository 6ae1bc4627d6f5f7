package db

import (
	"bytes"
	"context"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Receipts (DESIGN §13): every finalized run gets a receipt saying where its result came from,
// signed with HMAC-SHA256 over its canonical JSON under a key derived from the secret key. The
// stored document is exactly what GET /api/runs/{id}/receipt serves and `berth receipt verify`
// checks.

// receiptKeyLabel is the HKDF purpose label of the receipt signing key: no other key derived
// from the secret key uses it.
const receiptKeyLabel = "berth receipt signing v1"

// DeriveReceiptKey derives the 32-byte receipt signing key from the instance secret key (HKDF-SHA256).
func DeriveReceiptKey(secret []byte) []byte {
	k, err := hkdf.Key(sha256.New, secret, nil, receiptKeyLabel, 32)
	if err != nil { // only for lengths HKDF cannot give; 32 always works
		panic(err)
	}
	return k
}

// Receipt dispositions: what became of a run's result.
const (
	DispositionCommitted = "committed" // committed on the workspace's branch
	DispositionArtifact  = "artifact"  // packed into a capsule in the artifact store
	DispositionUnchanged = "unchanged" // the run changed nothing (or had no workspace)
	DispositionDiscarded = "discarded" // an attempt that was not selected
)

// Receipt is the signed record of one run. Nullable fields are null when they do not apply
// (no workspace, no artifact, not a sandbox).
type Receipt struct {
	RunID                  string  `json:"run_id"`
	TaskID                 string  `json:"task_id"`
	WorkspaceRef           *string `json:"workspace_ref"`
	BaseCommit             *string `json:"base_commit"`
	BaseTreeDigest         *string `json:"base_tree_digest"`
	FinalTreeDigest        *string `json:"final_tree_digest"`
	CapsuleDigest          *string `json:"capsule_digest"`
	ImageDigest            *string `json:"image_digest"`
	EnvironmentFingerprint *string `json:"environment_fingerprint"`
	Command                string  `json:"command"`
	ExitCode               *int    `json:"exit_code"`
	Status                 string  `json:"status"`
	StartedAt              *string `json:"started_at"`
	FinishedAt             *string `json:"finished_at"`
	NodeID                 string  `json:"node_id"`
	Disposition            string  `json:"disposition"`
	Signature              string  `json:"signature"`
}

// signaturePrefix names the signature scheme in the signature value.
const signaturePrefix = "hmac-sha256:"

// ErrBadSignature means a receipt's signature does not match its contents under this key (or the
// document is not a receipt at all).
var ErrBadSignature = errors.New("receipt signature does not verify")

// CanonicalReceipt is the byte string a receipt's signature covers: every member of the JSON
// object except signature, keys sorted, no insignificant whitespace, strings in Go's encoding
// without HTML escaping, numbers as written.
func CanonicalReceipt(doc []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("receipt: not a JSON object: %w", err)
	}
	if dec.More() {
		return nil, errors.New("receipt: trailing data after the object")
	}
	delete(m, "signature")
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil { // map keys encode sorted
		return nil, fmt.Errorf("receipt: %w", err)
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// receiptMAC is the signature value of a canonical receipt.
func receiptMAC(key, canonical []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write(canonical)
	return signaturePrefix + hex.EncodeToString(mac.Sum(nil))
}

// SignReceipt fills r.Signature and returns the document to store and serve (indented JSON).
func SignReceipt(key []byte, r Receipt) ([]byte, error) {
	if len(key) == 0 {
		return nil, errors.New("sign receipt: no key")
	}
	r.Signature = ""
	raw, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("sign receipt: %w", err)
	}
	canon, err := CanonicalReceipt(raw)
	if err != nil {
		return nil, err
	}
	r.Signature = receiptMAC(key, canon)
	out, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("sign receipt: %w", err)
	}
	return append(out, '\n'), nil
}

// VerifyReceipt checks doc's signature under key and returns the receipt it holds. A document
// that is not a receipt object, lacks a signature, or whose signature differs is ErrBadSignature.
func VerifyReceipt(key, doc []byte) (Receipt, error) {
	canon, err := CanonicalReceipt(doc)
	if err != nil {
		return Receipt{}, fmt.Errorf("%w: %v", ErrBadSignature, err)
	}
	var r Receipt
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Receipt{}, fmt.Errorf("%w: not a receipt: %v", ErrBadSignature, err)
	}
	if !strings.HasPrefix(r.Signature, signaturePrefix) {
		return Receipt{}, fmt.Errorf("%w: no %s signature", ErrBadSignature, strings.TrimSuffix(signaturePrefix, ":"))
	}
	if !hmac.Equal([]byte(r.Signature), []byte(receiptMAC(key, canon))) {
		return Receipt{}, ErrBadSignature
	}
	return r, nil
}

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

// ParseReceipt decodes a stored receipt document (already trusted: it came from the database).
func ParseReceipt(doc []byte) (Receipt, error) {
	var r Receipt
	if err := json.Unmarshal(doc, &r); err != nil {
		return Receipt{}, fmt.Errorf("parse receipt: %w", err)
	}
	return r, nil
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
