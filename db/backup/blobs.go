package backup

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// blobs is the content-addressed half of a backup directory: DIR/blobs/<sha256 hex>, each file
// immutable once renamed into place, so a second backup into the same DIR copies only what is new.
type blobs struct{ dir string }

// ErrCorrupt means a blob's content does not hash to its name (or has another size than the
// manifest says): the backup was damaged or tampered with.
var ErrCorrupt = errors.New("backup blob is damaged")

func openBlobs(backupDir string) (blobs, error) {
	dir := filepath.Join(backupDir, "blobs")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return blobs{}, err
	}
	return blobs{dir: dir}, nil
}

func validHex(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

func (b blobs) path(sum string) string { return filepath.Join(b.dir, sum) }

// has reports whether the blob sum is stored with the given size (its content is checked by
// verify, at restore time; a stored blob is never rewritten).
func (b blobs) has(sum string, size int64) bool {
	fi, err := os.Lstat(b.path(sum))
	return err == nil && fi.Mode().IsRegular() && fi.Size() == size
}

// write streams fill's output into a temporary file, hashes it, fsyncs it and renames it to its
// digest. It returns the digest, the size and whether a new blob was stored (false: the same
// content was there already).
func (b blobs) write(fill func(io.Writer) error) (string, int64, bool, error) {
	tmp, err := os.CreateTemp(b.dir, ".tmp-")
	if err != nil {
		return "", 0, false, err
	}
	defer os.Remove(tmp.Name()) // after a successful rename this is a no-op error
	h := sha256.New()
	cw := &counter{w: io.MultiWriter(tmp, h)}
	if err := fill(cw); err != nil {
		tmp.Close()
		return "", 0, false, err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return "", 0, false, err
	}
	if err := tmp.Close(); err != nil {
		return "", 0, false, err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if b.has(sum, cw.n) {
		return sum, cw.n, false, nil
	}
	if err := os.Rename(tmp.Name(), b.path(sum)); err != nil {
		return "", 0, false, err
	}
	return sum, cw.n, true, syncDir(b.dir)
}

// copyFile stores the file at src under the digest it claims (want, e.g. an artifact's name) and
// refuses it when its content hashes otherwise. An existing blob of that size is kept as it is.
func (b blobs) copyFile(src, want string, size int64) (bool, error) {
	if b.has(want, size) {
		return false, nil
	}
	f, err := os.Open(src)
	if err != nil {
		return false, err
	}
	defer f.Close()
	sum, n, stored, err := b.write(func(w io.Writer) error { _, err := io.Copy(w, f); return err })
	if err != nil {
		return false, err
	}
	if sum != want || n != size {
		_ = os.Remove(b.path(sum))
		return false, fmt.Errorf("%s: content hashes to %s (%d bytes), not its name: %w", src, sum, n, ErrCorrupt)
	}
	return stored, nil
}

// verify hashes the blob sum and checks it against its name and the manifest's size.
func (b blobs) verify(sum string, size int64) error {
	if !validHex(sum) {
		return fmt.Errorf("blob %q: not a sha256 digest: %w", sum, ErrCorrupt)
	}
	f, err := os.Open(b.path(sum))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blob %s is missing: %w", sum, ErrCorrupt)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum || n != size {
		return fmt.Errorf("blob %s: content hashes to %s, %d bytes (manifest: %d): %w", sum, got, n, size, ErrCorrupt)
	}
	return nil
}

// counter counts what passes through to w.
type counter struct {
	w io.Writer
	n int64
}

func (c *counter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// writeFileAtomic writes data to path through a temporary file, fsync and rename.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}
