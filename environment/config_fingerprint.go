package environment

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"slices"
)

// Fingerprint identifies what a qualification was earned for: the driver, the normalized
// settings, the secret values and the active image. Any change of one of them changes it; a
// rename does not. The secrets enter as an HMAC keyed by their salt, so the fingerprint reveals
// nothing about them.
func Fingerprint(c Config, s Secrets, activeImage string) string {
	c.MaxParallelRuns = 0           // capacity is scheduling, not what a probe qualified
	doc, _ := json.Marshal(c.doc()) // plain structs always marshal
	secrets := ""
	if !s.Empty() {
		b, _ := json.Marshal(struct {
			PrivateKey string            `json:"private_key"`
			Env        map[string]string `json:"env"` // map keys marshal sorted
		}{s.PrivateKey, s.Env})
		mac := hmac.New(sha256.New, []byte(s.Salt))
		mac.Write(b)
		secrets = hex.EncodeToString(mac.Sum(nil))
	}
	payload, _ := json.Marshal(struct {
		Version     int             `json:"v"`
		Driver      string          `json:"driver"`
		Config      json.RawMessage `json:"config"`
		Secrets     string          `json:"secrets"`
		ActiveImage string          `json:"active_image"`
	}{1, c.Driver, doc, secrets, activeImage})
	sum := sha256.Sum256(payload)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ChangedKeys names the settings that differ between two configurations (secret values
// included), sorted, without saying how: audit details and messages use it.
func ChangedKeys(old Config, oldSecrets Secrets, cur Config, curSecrets Secrets) []string {
	a, b := map[string]json.RawMessage{}, map[string]json.RawMessage{}
	ab, _ := json.Marshal(old.doc())
	bb, _ := json.Marshal(cur.doc())
	_ = json.Unmarshal(ab, &a)
	_ = json.Unmarshal(bb, &b)
	changed := map[string]bool{}
	for k, v := range a {
		if w, ok := b[k]; !ok || !bytes.Equal(v, w) {
			changed[k] = true
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			changed[k] = true
		}
	}
	if oldSecrets.PrivateKey != curSecrets.PrivateKey {
		changed["private_key"] = true
	}
	if !maps.Equal(oldSecrets.Env, curSecrets.Env) {
		changed["env"] = true
	}
	return slices.Sorted(maps.Keys(changed))
}
