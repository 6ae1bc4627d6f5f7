package receipt_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"

	"berth/workspace/receipt"
)

// TestReceiptSignature: a signed receipt verifies under its key only; re-indenting it does not
// matter (the signature covers the canonical JSON), any changed value, an added member or a
// missing signature does; the derived key is not the secret key.
func TestReceiptSignature(t *testing.T) {
	t.Parallel()
	secret := bytes.Repeat([]byte{7}, 32)
	key := receipt.DeriveKey(secret)
	if bytes.Equal(key, secret) || len(key) != 32 {
		t.Fatal("the receipt key is not derived")
	}
	exit, digest := 0, "sha256:abc"
	doc, err := receipt.Sign(key, receipt.Receipt{RunID: "r", TaskID: "t", Command: "echo <a> & b", ExitCode: &exit,
		Status: "succeeded", FinalTreeDigest: &digest, NodeID: "n", Disposition: receipt.DispositionCommitted})
	if err != nil {
		t.Fatal(err)
	}
	if rc, err := receipt.Verify(key, doc); err != nil || rc.Command != "echo <a> & b" {
		t.Fatalf("verify = %+v, %v", rc, err)
	}
	if _, err := receipt.Verify(key, bytes.ReplaceAll(doc, []byte("\n  "), []byte(" "))); err != nil {
		t.Fatalf("re-indented: %v", err)
	}
	bad := map[string][]byte{
		"other key":      nil,
		"changed value":  bytes.Replace(doc, []byte(`"sha256:abc"`), []byte(`"sha256:abd"`), 1),
		"added member":   bytes.Replace(doc, []byte(`{`), []byte(`{"extra": 1,`), 1),
		"no signature":   bytes.Replace(doc, []byte(`"signature": "hmac-sha256:`), []byte(`"signature": "x`), 1),
		"not an object":  []byte(`[1]`),
		"trailing bytes": append(append([]byte{}, doc...), []byte(`{}`)...),
	}
	for name, d := range bad {
		k := key
		if d == nil {
			d, k = doc, receipt.DeriveKey(bytes.Repeat([]byte{8}, 32))
		}
		if _, err := receipt.Verify(k, d); !errors.Is(err, receipt.ErrBadSignature) {
			t.Errorf("%s: %v, want ErrBadSignature", name, err)
		}
	}
}

// TestReceiptSignatureStable pins the bytes: a receipt signed with a fixed secret key is this
// exact document, and that document verifies. A change to the key derivation, the canonical
// form or the stored encoding fails here before it strands the receipts already stored.
func TestReceiptSignatureStable(t *testing.T) {
	t.Parallel()
	key := receipt.DeriveKey(bytes.Repeat([]byte{7}, 32))
	if got := hex.EncodeToString(key); got != "39d4950cbebf64efc5d397168d8683fbf94f0468ffc9cf12ad5f0199ce4de1cc" {
		t.Fatalf("derived key %s changed", got)
	}
	const want = `{
  "run_id": "r",
  "task_id": "t",
  "workspace_ref": null,
  "base_commit": null,
  "base_tree_digest": null,
  "final_tree_digest": "sha256:abc",
  "capsule_digest": null,
  "image_digest": null,
  "environment_fingerprint": null,
  "command": "echo \u003ca\u003e \u0026 b",
  "exit_code": 0,
  "status": "succeeded",
  "started_at": null,
  "finished_at": null,
  "node_id": "n",
  "disposition": "committed",
  "signature": "hmac-sha256:e54c076cb26b5e6ac7d5aa2702271c3499e3c1112184d1f6a7a5f5d31ccb6334"
}
`
	exit, digest := 0, "sha256:abc"
	doc, err := receipt.Sign(key, receipt.Receipt{RunID: "r", TaskID: "t", Command: "echo <a> & b", ExitCode: &exit,
		Status: "succeeded", FinalTreeDigest: &digest, NodeID: "n", Disposition: receipt.DispositionCommitted})
	if err != nil {
		t.Fatal(err)
	}
	if string(doc) != want {
		t.Fatalf("signed document changed:\n%s", doc)
	}
	if _, err := receipt.Verify(key, []byte(want)); err != nil {
		t.Fatalf("the stored document no longer verifies: %v", err)
	}
}
