package db

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Sealer encrypts secrets at rest (environment private keys, secret env values) with AES-256-GCM.
// The associated data binds a ciphertext to its row, so a sealed value copied to another row
// does not open.
type Sealer struct {
	aead cipher.AEAD
	// receiptKey signs run receipts (ReceiptKey in receipts.go): derived from the same key.
	receiptKey []byte
}

// sealVersion prefixes every ciphertext so the format can change later.
const sealVersion = 1

// NewSealer builds a sealer from a 32-byte key.
func NewSealer(key []byte) (*Sealer, error) {
	if len(key) != 32 {
		return nil, fmt.Errorf("secret key: want 32 bytes, have %d", len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	return &Sealer{aead: aead, receiptKey: DeriveReceiptKey(key)}, nil
}

// Seal encrypts plaintext bound to aad (e.g. "environment:<id>").
func (s *Sealer) Seal(plaintext []byte, aad string) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	out := append([]byte{sealVersion}, nonce...)
	return s.aead.Seal(out, nonce, plaintext, []byte(aad)), nil
}

// ErrUnseal means a sealed value could not be opened: another key, another row, or tampering.
var ErrUnseal = errors.New("sealed value does not open with this key")

// Open decrypts a value from Seal with the same aad.
func (s *Sealer) Open(sealed []byte, aad string) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sealed) < 1+n || sealed[0] != sealVersion {
		return nil, ErrUnseal
	}
	pt, err := s.aead.Open(nil, sealed[1:1+n], sealed[1+n:], []byte(aad))
	if err != nil {
		return nil, ErrUnseal
	}
	return pt, nil
}

// LoadSecretKey returns the key from BERTH_SECRET_KEY (64 hex chars or base64 of 32 bytes) or, when
// that is empty, from <dataDir>/secret.key, creating the file (mode 0600) on first use.
func LoadSecretKey(envValue, dataDir string) ([]byte, error) {
	if v := strings.TrimSpace(envValue); v != "" {
		if b, err := hex.DecodeString(v); err == nil && len(b) == 32 {
			return b, nil
		}
		if b, err := base64.StdEncoding.DecodeString(v); err == nil && len(b) == 32 {
			return b, nil
		}
		return nil, errors.New("BERTH_SECRET_KEY must be 32 bytes as 64 hex characters or base64")
	}
	path := filepath.Join(dataDir, "secret.key")
	if b, err := os.ReadFile(path); err == nil {
		key, err := hex.DecodeString(strings.TrimSpace(string(b)))
		if err != nil || len(key) != 32 {
			return nil, fmt.Errorf("secret key file %s is not 64 hex characters", path)
		}
		return key, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	// Write a temporary file, then link it into place: the key file appears whole or not at all,
	// and of two processes starting together exactly one key wins.
	f, err := os.CreateTemp(dataDir, ".secret.key.*")
	if err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if _, err := f.WriteString(hex.EncodeToString(key) + "\n"); err != nil {
		f.Close()
		return nil, fmt.Errorf("secret key: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, fmt.Errorf("secret key: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	if err := os.Link(tmp, path); errors.Is(err, os.ErrExist) {
		return LoadSecretKey("", dataDir)
	} else if err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	return key, nil
}
