// Package seal owns secret sealing at rest: environment private keys, secret env values and the
// egress CA key are stored only as AES-256-GCM ciphertexts bound to their row, under the
// instance's secret key (BERTH_SECRET_KEY or the data dir's secret.key). It turns bytes into
// bytes and touches no database; callers store what it returns.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
)

// Sealer encrypts secrets at rest with AES-256-GCM. The associated data binds a ciphertext to
// its row, so a sealed value copied to another row does not open.
type Sealer struct {
	aead cipher.AEAD
}

// version prefixes every ciphertext so the format can change later.
const version = 1

// New builds a sealer from a 32-byte key.
func New(key []byte) (*Sealer, error) {
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
	return &Sealer{aead: aead}, nil
}

// Seal encrypts plaintext bound to aad (e.g. "environment:<id>").
func (s *Sealer) Seal(plaintext []byte, aad string) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	out := append([]byte{version}, nonce...)
	return s.aead.Seal(out, nonce, plaintext, []byte(aad)), nil
}

// ErrUnseal means a sealed value could not be opened: another key, another row, or tampering.
var ErrUnseal = errors.New("sealed value does not open with this key")

// Open decrypts a value from Seal with the same aad.
func (s *Sealer) Open(sealed []byte, aad string) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sealed) < 1+n || sealed[0] != version {
		return nil, ErrUnseal
	}
	pt, err := s.aead.Open(nil, sealed[1:1+n], sealed[1+n:], []byte(aad))
	if err != nil {
		return nil, ErrUnseal
	}
	return pt, nil
}
