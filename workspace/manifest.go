package workspace

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strconv"
)

// Entry types in a manifest.
const (
	TypeFile = "file"
	TypeDir  = "dir"
)

// ManifestEntry describes one capsule entry: a directory, or a regular file with its size and content
// hash. Modes are normalized: 0644 or 0755 for files, 0755 for directories.
type ManifestEntry struct {
	Path   string `json:"path"`             // slash-separated, relative, no trailing slash
	Type   string `json:"type"`             // TypeFile or TypeDir
	Size   int64  `json:"size"`             // bytes; 0 for directories
	Mode   uint32 `json:"mode"`             // 0644 or 0755
	SHA256 string `json:"sha256,omitempty"` // hex content hash; files only
}

// Manifest lists a tree's entries in canonical order (byte-wise by path, so parents precede their
// children); its Digest identifies the tree regardless of times, owners or where it lives.
type Manifest struct {
	Entries []ManifestEntry `json:"entries"` // canonical order
}

// Digest returns the tree digest, "sha256:" plus the hex SHA-256 of the canonical manifest encoding
// (a version line, then per entry: path, type, octal mode, size and hash, each NUL-terminated; paths
// cannot contain NUL, so the encoding is unambiguous).
func (m Manifest) Digest() string {
	h := sha256.New()
	h.Write([]byte("berth-tree-v1\n"))
	var buf []byte
	for _, e := range m.Entries {
		buf = buf[:0]
		buf = append(buf, e.Path...)
		buf = append(buf, 0)
		buf = append(buf, e.Type...)
		buf = append(buf, 0)
		buf = strconv.AppendUint(buf, uint64(e.Mode), 8)
		buf = append(buf, 0)
		buf = strconv.AppendInt(buf, e.Size, 10)
		buf = append(buf, 0)
		buf = append(buf, e.SHA256...)
		buf = append(buf, 0)
		h.Write(buf)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// TotalSize returns the sum of the file sizes in the manifest.
func (m Manifest) TotalSize() int64 {
	var n int64
	for _, e := range m.Entries {
		n += e.Size
	}
	return n
}

// validate checks that m is canonical and safe to materialize within lim: sorted unique valid paths,
// known types, normalized modes, well-formed hashes, every parent a directory listed earlier, no two
// paths equal under case folding or Unicode normalization, and count and bytes within the limits.
func (m Manifest) validate(lim Limits) error {
	if len(m.Entries) > lim.MaxEntries {
		return fmt.Errorf("manifest has %d entries, limit %d: %w", len(m.Entries), lim.MaxEntries, ErrQuota)
	}
	var total int64
	dirs := map[string]bool{}
	folded := make(map[string]string, len(m.Entries))
	for i, e := range m.Entries {
		if !capsuleNameOK(e.Path) {
			return fmt.Errorf("manifest entry %.200q: bad path: %w", e.Path, ErrCapsule)
		}
		if i > 0 && e.Path <= m.Entries[i-1].Path {
			return fmt.Errorf("manifest entry %.200q: not sorted or duplicate: %w", e.Path, ErrCapsule)
		}
		if prev, ok := folded[foldKey(e.Path)]; ok {
			return fmt.Errorf("manifest entry %.200q collides with %.200q: %w", e.Path, prev, ErrCapsule)
		}
		folded[foldKey(e.Path)] = e.Path
		if parent := parentOf(e.Path); parent != "" && !dirs[parent] {
			return fmt.Errorf("manifest entry %.200q: parent is not a listed directory: %w", e.Path, ErrCapsule)
		}
		switch e.Type {
		case TypeDir:
			if e.Size != 0 || e.SHA256 != "" || e.Mode != 0o755 {
				return fmt.Errorf("manifest entry %.200q: bad directory fields: %w", e.Path, ErrCapsule)
			}
			dirs[e.Path] = true
		case TypeFile:
			if e.Mode != 0o644 && e.Mode != 0o755 {
				return fmt.Errorf("manifest entry %.200q: mode %o not normalized: %w", e.Path, e.Mode, ErrCapsule)
			}
			if e.Size < 0 || !validHexDigest(e.SHA256) {
				return fmt.Errorf("manifest entry %.200q: bad size or hash: %w", e.Path, ErrCapsule)
			}
			total += e.Size
			if e.Size > lim.MaxBytes || total > lim.MaxBytes {
				return fmt.Errorf("manifest holds more than %d bytes: %w", lim.MaxBytes, ErrQuota)
			}
		default:
			return fmt.Errorf("manifest entry %.200q: type %q: %w", e.Path, e.Type, ErrCapsule)
		}
	}
	return nil
}

func parentOf(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[:i]
		}
	}
	return ""
}

// validHexDigest reports whether s is 64 lowercase hex digits.
func validHexDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Changes lists what differs between a base manifest and a later one; each list is sorted.
type Changes struct {
	Added    []string `json:"added"`    // only in the later manifest
	Modified []string `json:"modified"` // in both, with another type, mode, size or hash
	Removed  []string `json:"removed"`  // only in the base manifest
}

// Diff compares two manifests: a path is added or removed when only one side lists it, modified when
// both do with a different type, mode, size or hash.
func Diff(base, cur Manifest) Changes {
	old := make(map[string]ManifestEntry, len(base.Entries))
	for _, e := range base.Entries {
		old[e.Path] = e
	}
	var c Changes
	for _, e := range cur.Entries {
		b, ok := old[e.Path]
		switch {
		case !ok:
			c.Added = append(c.Added, e.Path)
		case b != e:
			c.Modified = append(c.Modified, e.Path)
		}
		delete(old, e.Path)
	}
	for p := range old {
		c.Removed = append(c.Removed, p)
	}
	sort.Strings(c.Added)
	sort.Strings(c.Modified)
	sort.Strings(c.Removed)
	return c
}
