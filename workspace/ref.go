package workspace

import (
	"crypto/rand"
	"encoding/hex"
)

// refPrefix starts every workspace ref; the rest is 32 lowercase hex digits from crypto/rand.
const refPrefix = "ws-"

// ValidRef reports whether s is a well-formed workspace ref: "ws-" followed by exactly 32 lowercase
// hex digits. A valid ref is safe to use as a single path component.
func ValidRef(s string) bool {
	if len(s) != len(refPrefix)+32 || s[:len(refPrefix)] != refPrefix {
		return false
	}
	for i := len(refPrefix); i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// newRef returns a fresh opaque ref; it never derives from user input.
func newRef() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux (it panics instead).
	return refPrefix + hex.EncodeToString(b[:])
}
