package seal_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"berth/environment/seal"
)

func TestSealer(t *testing.T) {
	t.Parallel()
	key := bytes.Repeat([]byte{1}, 32)
	s, err := seal.New(key)
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := s.Seal([]byte("private key"), "environment:1")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte("private key")) {
		t.Fatal("sealed value contains the plaintext")
	}
	if pt, err := s.Open(sealed, "environment:1"); err != nil || string(pt) != "private key" {
		t.Fatalf("open = %q, %v", pt, err)
	}
	if _, err := s.Open(sealed, "environment:2"); !errors.Is(err, seal.ErrUnseal) {
		t.Fatalf("open with another row's aad: %v", err)
	}
	other, _ := seal.New(bytes.Repeat([]byte{2}, 32))
	if _, err := other.Open(sealed, "environment:1"); !errors.Is(err, seal.ErrUnseal) {
		t.Fatalf("open with another key: %v", err)
	}
	flipped := append([]byte(nil), sealed...)
	flipped[len(flipped)-1] ^= 1
	if _, err := s.Open(flipped, "environment:1"); !errors.Is(err, seal.ErrUnseal) {
		t.Fatalf("open tampered: %v", err)
	}
	if _, err := seal.New([]byte("short")); err == nil {
		t.Fatal("short key accepted")
	}
}

// TestSealerOpensExisting pins the format: a value sealed before (version byte, nonce,
// AES-256-GCM with the row as associated data) still opens, and only for its row.
func TestSealerOpensExisting(t *testing.T) {
	t.Parallel()
	s, err := seal.New(bytes.Repeat([]byte{1}, 32))
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := hex.DecodeString("01c7ee6462e8fd6d5bf28da1f9ae9254ceafbe36ca349732876ee9458a96b76f7536544f98f4acac")
	if err != nil {
		t.Fatal(err)
	}
	if pt, err := s.Open(sealed, "environment:1"); err != nil || string(pt) != "private key" {
		t.Fatalf("open = %q, %v", pt, err)
	}
	if _, err := s.Open(sealed, "environment:2"); !errors.Is(err, seal.ErrUnseal) {
		t.Fatalf("open with another row's aad: %v", err)
	}
}

func TestLoadKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	k1, err := seal.LoadKey("", dir)
	if err != nil || len(k1) != 32 {
		t.Fatalf("generate: %v", err)
	}
	st, err := os.Stat(filepath.Join(dir, "secret.key"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v (%v), want 0600", st.Mode(), err)
	}
	k2, err := seal.LoadKey("", dir)
	if err != nil || !bytes.Equal(k1, k2) {
		t.Fatal("second load gave another key")
	}
	hexKey := "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
	k3, err := seal.LoadKey(hexKey, dir)
	if err != nil || k3[31] != 0x1f {
		t.Fatalf("env key: %v", err)
	}
	if _, err := seal.LoadKey("too-short", dir); err == nil {
		t.Fatal("a malformed BERTH_SECRET_KEY was accepted")
	}
}
