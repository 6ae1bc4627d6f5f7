// Package receipt owns the run receipt (DESIGN §13): the document that says where a finalized
// run's result came from, its canonical JSON and its HMAC-SHA256 signature under a key derived
// from the instance secret key. It turns a Receipt into signed bytes and signed bytes back into a
// Receipt; it has no database access: db stores the bytes (SaveReceipt, ReceiptOf) exactly as
// Sign returned them, GET /api/runs/{id}/receipt serves them verbatim, and receiptcheck checks
// their digests against what still exists.
package receipt

import (
	"bytes"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// keyLabel is the HKDF purpose label of the receipt signing key: no other key derived from the
// secret key uses it.
const keyLabel = "berth receipt signing v1"

// DeriveKey derives the 32-byte receipt signing key from the instance secret key (HKDF-SHA256),
// so receipts are never signed with the key that seals secrets.
func DeriveKey(secret []byte) []byte {
	k, err := hkdf.Key(sha256.New, secret, nil, keyLabel, 32)
	if err != nil { // only for lengths HKDF cannot give; 32 always works
		panic(err)
	}
	return k
}

// Dispositions: what became of a run's result.
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

// Canonical is the byte string a receipt's signature covers: every member of the JSON object
// except signature, keys sorted, no insignificant whitespace, strings in Go's encoding without
// HTML escaping, numbers as written.
func Canonical(doc []byte) ([]byte, error) {
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

// mac is the signature value of a canonical receipt.
func mac(key, canonical []byte) string {
	h := hmac.New(sha256.New, key)
	h.Write(canonical)
	return signaturePrefix + hex.EncodeToString(h.Sum(nil))
}

// Sign fills r.Signature and returns the document to store and serve (indented JSON).
func Sign(key []byte, r Receipt) ([]byte, error) {
	if len(key) == 0 {
		return nil, errors.New("sign receipt: no key")
	}
	r.Signature = ""
	raw, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("sign receipt: %w", err)
	}
	canon, err := Canonical(raw)
	if err != nil {
		return nil, err
	}
	r.Signature = mac(key, canon)
	out, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("sign receipt: %w", err)
	}
	return append(out, '\n'), nil
}

// Verify checks doc's signature under key and returns the receipt it holds. A document that is
// not a receipt object, lacks a signature, or whose signature differs is ErrBadSignature.
func Verify(key, doc []byte) (Receipt, error) {
	canon, err := Canonical(doc)
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
	if !hmac.Equal([]byte(r.Signature), []byte(mac(key, canon))) {
		return Receipt{}, ErrBadSignature
	}
	return r, nil
}

// Parse decodes a stored receipt document without checking its signature (already trusted: it
// came from the database).
func Parse(doc []byte) (Receipt, error) {
	var r Receipt
	if err := json.Unmarshal(doc, &r); err != nil {
		return Receipt{}, fmt.Errorf("parse receipt: %w", err)
	}
	return r, nil
}
