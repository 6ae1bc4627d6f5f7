package workspace

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestArtifacts(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	data := t.TempDir()
	a, err := NewArtifacts(data)
	mustDo(t, err)
	sum := sha256.Sum256([]byte("payload"))
	want := hex.EncodeToString(sum[:])

	d, n, err := a.Put(ctx, strings.NewReader("payload"), "")
	if err != nil || d != want || n != 7 {
		t.Fatalf("Put = %s, %d, %v", d, n, err)
	}
	// Idempotent, with the digest verified.
	if d2, _, err := a.Put(ctx, strings.NewReader("payload"), want); err != nil || d2 != want {
		t.Fatalf("second Put = %s, %v", d2, err)
	}
	if _, _, err := a.Put(ctx, strings.NewReader("tampered"), want); !errors.Is(err, ErrDigest) {
		t.Fatalf("Put with wrong content: %v", err)
	}
	if _, _, err := a.Put(ctx, strings.NewReader("x"), "../../etc/passwd"); !errors.Is(err, ErrDigest) {
		t.Fatalf("Put with bad digest: %v", err)
	}
	f, err := a.Open(want)
	mustDo(t, err)
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "payload" {
		t.Fatalf("content %q", b)
	}
	for _, bad := range []string{"", "../" + want, strings.ToUpper(want), want + "0", want[:63], "sha256:" + want} {
		if _, err := a.Open(bad); !errors.Is(err, ErrDigest) {
			t.Errorf("Open(%q) = %v, want ErrDigest", bad, err)
		}
	}
	if _, err := a.Open(strings.Repeat("0", 64)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Open missing: %v", err)
	}
	mustDo(t, a.Verify(ctx, want))
	entries, _ := os.ReadDir(filepath.Join(data, "artifacts"))
	if len(entries) != 1 {
		t.Fatalf("store holds %v (temporary files left?)", entries)
	}
	// Corruption on disk is detected by Verify.
	p := filepath.Join(data, "artifacts", want)
	mustDo(t, os.Chmod(p, 0o644))
	mustDo(t, os.WriteFile(p, []byte("PAYLOAD"), 0o644))
	if err := a.Verify(ctx, want); !errors.Is(err, ErrDigest) {
		t.Fatalf("Verify corrupted: %v", err)
	}
}
