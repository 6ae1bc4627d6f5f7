package seal

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"berth/environment/datadir"
)

// LoadKey returns the instance's secret key from BERTH_SECRET_KEY (envValue: 64 hex chars or
// base64 of 32 bytes) or, when that is empty, from the data dir's secret.key, creating the file
// (mode 0600) on first use.
func LoadKey(envValue, dataDir string) ([]byte, error) {
	if v := strings.TrimSpace(envValue); v != "" {
		if b, err := hex.DecodeString(v); err == nil && len(b) == 32 {
			return b, nil
		}
		if b, err := base64.StdEncoding.DecodeString(v); err == nil && len(b) == 32 {
			return b, nil
		}
		return nil, errors.New("BERTH_SECRET_KEY must be 32 bytes as 64 hex characters or base64")
	}
	path := datadir.At(dataDir).SecretKey()
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
		return LoadKey("", dataDir)
	} else if err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	return key, nil
}
