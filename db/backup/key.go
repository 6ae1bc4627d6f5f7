package backup

import (
	"bufio"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/crypto/argon2"
)

// The secret key never lies in a backup directory in the clear: either it is sealed there with a
// passphrase (argon2id, then AES-256-GCM), or it is written to a separate file the operator keeps
// elsewhere (docs/operations.md "The secret key"). Without it a restored instance cannot open its
// environment secrets or verify a receipt, so restore refuses to start without it.

// ErrKey means the key given to restore is not the backed-up instance's, or the passphrase is wrong.
var ErrKey = errors.New("secret key does not match the backup")

// minPassphrase is the shortest passphrase a backup accepts.
const minPassphrase = 12

// sealedKey is DIR/secret.key.sealed.
type sealedKey struct {
	KDF     string `json:"kdf"`
	Time    uint32 `json:"time"`
	Memory  uint32 `json:"memory_kib"`
	Threads uint8  `json:"threads"`
	Salt    []byte `json:"salt"`
	Nonce   []byte `json:"nonce"`
	Sealed  []byte `json:"sealed"`
	KeyID   string `json:"key_id"`
}

// keyID names a key without revealing it: restore compares it before trusting a key file.
func keyID(key []byte) string {
	h := sha256.Sum256(append([]byte("berth backup key id\x00"), key...))
	return hex.EncodeToString(h[:8])
}

// manifestMAC signs a manifest's canonical bytes with a key derived from the secret key, so a
// manifest whose digests were edited does not restore.
func manifestMAC(key, canonical []byte) string {
	k := sha256.Sum256(append([]byte("berth backup manifest\x00"), key...))
	m := hmac.New(sha256.New, k[:])
	m.Write(canonical)
	return "hmac-sha256:" + hex.EncodeToString(m.Sum(nil))
}

func passphraseKey(pass []byte, s sealedKey) []byte {
	return argon2.IDKey(pass, s.Salt, s.Time, s.Memory, s.Threads, 32)
}

// sealKey seals key under passphrase.
func sealKey(key, pass []byte) ([]byte, error) {
	s := sealedKey{KDF: "argon2id", Time: 3, Memory: 64 * 1024, Threads: 2, Salt: make([]byte, 16), Nonce: make([]byte, 12), KeyID: keyID(key)}
	if _, err := rand.Read(s.Salt); err != nil {
		return nil, err
	}
	if _, err := rand.Read(s.Nonce); err != nil {
		return nil, err
	}
	aead, err := gcm(passphraseKey(pass, s))
	if err != nil {
		return nil, err
	}
	s.Sealed = aead.Seal(nil, s.Nonce, key, []byte(s.KeyID))
	return json.MarshalIndent(s, "", "  ")
}

// openKey opens a sealed key with passphrase.
func openKey(doc, pass []byte) ([]byte, error) {
	var s sealedKey
	if err := json.Unmarshal(doc, &s); err != nil || s.KDF != "argon2id" || s.Memory > 1<<21 || s.Time > 16 || s.Threads == 0 {
		return nil, fmt.Errorf("secret.key.sealed is not a sealed key: %w", ErrKey)
	}
	aead, err := gcm(passphraseKey(pass, s))
	if err != nil {
		return nil, err
	}
	if len(s.Nonce) != aead.NonceSize() {
		return nil, fmt.Errorf("secret.key.sealed: bad nonce: %w", ErrKey)
	}
	key, err := aead.Open(nil, s.Nonce, s.Sealed, []byte(s.KeyID))
	if err != nil {
		return nil, fmt.Errorf("wrong passphrase: %w", ErrKey)
	}
	return key, nil
}

func gcm(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// readPassphrase reads the first line of a passphrase file.
func readPassphrase(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("passphrase file: %w", err)
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil && line == "" {
		return nil, fmt.Errorf("passphrase file %s is empty", path)
	}
	pass := strings.TrimRight(line, "\r\n")
	if len(pass) < minPassphrase {
		return nil, fmt.Errorf("passphrase file %s: the passphrase must be at least %d characters", path, minPassphrase)
	}
	return []byte(pass), nil
}

// readKeyFile reads a key file written by a backup (64 hex characters and a newline).
func readKeyFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) != 32 {
		return nil, fmt.Errorf("key file %s: want 64 hex characters: %w", path, ErrKey)
	}
	return key, nil
}
