package backup

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// FormatVersion is the layout of a backup directory this code writes and reads.
const FormatVersion = 1

// Manifest describes one backup: what the database dump, the image layers and the artifacts are
// (each a blob in DIR/blobs named by its sha256), where the key went, what was live, and a MAC
// over all of it under a key derived from the instance's secret key.
type Manifest struct {
	Format        int       `json:"format"`
	BerthVersion  string    `json:"berth_version"`
	CreatedAt     time.Time `json:"created_at"`
	SchemaVersion int       `json:"schema_version"` // the newest Berth migration the database had
	Postgres      PGInfo    `json:"postgres"`
	Database      Blob      `json:"database"` // pg_dump -Fc of the whole database
	Key           KeyInfo   `json:"key"`
	// Rows counts the main tables inside the dump's snapshot; restore checks them again.
	Rows           map[string]int64 `json:"rows"`
	Images         []ImageLayer     `json:"images"`
	Artifacts      []Blob           `json:"artifacts"`
	OpenWorkspaces []OpenWorkspace  `json:"open_workspaces"` // not backed up: reproducible from their branches
	LiveRuns       []LiveRun        `json:"live_runs"`       // settled as orphaned by restore
	Stats          Stats            `json:"stats"`
	MAC            string           `json:"mac"`
}

// PGInfo records the server and client versions of the dump.
type PGInfo struct {
	Source        string `json:"source"` // "embedded" or "database_url"
	ServerVersion string `json:"server_version"`
	Major         int    `json:"major"`
	Client        string `json:"client"` // pg_dump --version
}

// Blob is one content-addressed file of the backup.
type Blob struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// KeyInfo says where the secret key is: "sealed" (DIR/secret.key.sealed, passphrase) or
// "separate" (a file the operator chose, outside DIR). KeyID identifies the key without revealing it.
type KeyInfo struct {
	Mode  string `json:"mode"`
	KeyID string `json:"key_id"`
}

// ImageLayer is one image version's layer tree, as a tar blob.
type ImageLayer struct {
	VersionID     string `json:"version_id"`
	EnvironmentID string `json:"environment_id"`
	Number        int    `json:"number"`
	Digest        string `json:"digest"` // the version's own digest (tree or OCI manifest digest)
	Blob
}

// OpenWorkspace is an execution workspace that was not closed at backup time.
type OpenWorkspace struct {
	ID        string `json:"id"`
	CompanyID string `json:"company_id"`
	ProjectID string `json:"project_id"`
	Status    string `json:"status"`
	Branch    string `json:"branch"`
	BaseRef   string `json:"base_ref"`
}

// LiveRun is a run that was queued, preparing or running at backup time.
type LiveRun struct {
	ID     string `json:"id"`
	TaskID string `json:"task_id"`
	Status string `json:"status"`
}

// Stats says what this backup copied into DIR and what was there already.
type Stats struct {
	CopiedBlobs int   `json:"copied_blobs"`
	CopiedBytes int64 `json:"copied_bytes"`
	ReusedBlobs int   `json:"reused_blobs"`
	ReusedBytes int64 `json:"reused_bytes"`
	DurationMS  int64 `json:"duration_ms"`
}

func (s *Stats) add(stored bool, size int64) {
	if stored {
		s.CopiedBlobs++
		s.CopiedBytes += size
	} else {
		s.ReusedBlobs++
		s.ReusedBytes += size
	}
}

// canonical is the manifest without its MAC, as signed.
func (m Manifest) canonical() ([]byte, error) {
	m.MAC = ""
	return json.Marshal(m)
}

// sign sets the MAC under key.
func (m *Manifest) sign(key []byte) error {
	c, err := m.canonical()
	if err != nil {
		return err
	}
	m.MAC = manifestMAC(key, c)
	return nil
}

// ErrManifest means a manifest is missing, unreadable, of another format or not signed by the key.
var ErrManifest = errors.New("backup manifest is not valid")

// readManifest reads DIR/<name> (name "" is manifest.json, the latest backup).
func readManifest(dir, name string) (Manifest, error) {
	if name == "" {
		name = "manifest.json"
	}
	if filepath.Base(name) != name {
		name = filepath.Join("manifests", filepath.Base(name))
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return Manifest{}, fmt.Errorf("%w: %v", ErrManifest, err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return Manifest{}, fmt.Errorf("%w: %v", ErrManifest, err)
	}
	if m.Format != FormatVersion {
		return Manifest{}, fmt.Errorf("%w: format %d, this berth reads %d", ErrManifest, m.Format, FormatVersion)
	}
	return m, nil
}

// checkMAC verifies the manifest's MAC under key.
func (m Manifest) checkMAC(key []byte) error {
	c, err := m.canonical()
	if err != nil {
		return err
	}
	if m.MAC == "" || m.MAC != manifestMAC(key, c) {
		return fmt.Errorf("%w: its signature does not match the key (edited, or another instance's key)", ErrManifest)
	}
	return nil
}

// writeManifest stores m as DIR/manifests/<time>.json and then as DIR/manifest.json.
func writeManifest(dir string, m Manifest) (string, error) {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return "", err
	}
	b = append(b, '\n')
	hist := filepath.Join(dir, "manifests")
	if err := os.MkdirAll(hist, 0o700); err != nil {
		return "", err
	}
	name := m.CreatedAt.UTC().Format("20060102T150405.000Z") + ".json"
	if err := writeFileAtomic(filepath.Join(hist, name), b, 0o600); err != nil {
		return "", err
	}
	return name, writeFileAtomic(filepath.Join(dir, "manifest.json"), b, 0o600)
}
