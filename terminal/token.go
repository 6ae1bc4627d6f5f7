package terminal

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
)

// tokenBytes is a terminal token's entropy.
const tokenBytes = 32

// NewToken mints a terminal token: 32 random bytes, base64url without padding. Only its sha256
// (the second result) is stored.
func NewToken() (string, [32]byte) {
	b := make([]byte, tokenBytes)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	t := base64.RawURLEncoding.EncodeToString(b)
	return t, sha256.Sum256([]byte(t))
}

// HashToken is the stored form of a presented token; ok is false when it cannot be a token
// Berth minted (so garbage never reaches the database).
func HashToken(t string) (sum [32]byte, ok bool) {
	b, err := base64.RawURLEncoding.DecodeString(t)
	if err != nil || len(b) != tokenBytes {
		return sum, false
	}
	return sha256.Sum256([]byte(t)), true
}
