package environment

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// uploadScript stores standard input as a tar file below the base and prints its path and its
// SHA-256 as the remote host computed it.
const uploadScript = `set -eu
mkdir -p "$base/.run"
t=$(mktemp "$base/.upload.XXXXXXXX")
cat >"$t"
printf '%s\n' "$t"
if command -v sha256sum >/dev/null 2>&1; then sha256sum <"$t"; else shasum -a 256 <"$t"; fi
`

// placeScript ($1 upload, $2 workspace name, $3 key) extracts a verified upload into a staging
// directory, renames it into place as <base>/<name> (an earlier copy is moved aside and removed),
// records the lease in <base>/<name>.lease and prints the workspace's absolute path.
const placeScript = `set -eu
t=$1 name=$2 key=$3
case "$t" in "$base"/.upload.*) ;; *) echo "not an upload of this base" >&2; exit 2 ;; esac
s=$(mktemp -d "$base/.stage.XXXXXXXX")
if ! tar -x -o -f "$t" -C "$s"; then rm -rf "$s" "$t"; exit 1; fi
rm -f "$t"
old=
if [ -e "$base/$name" ] || [ -L "$base/$name" ]; then
	old=$(mktemp -d "$base/.old.XXXXXXXX")
	mv "$base/$name" "$old/"
fi
mv "$s" "$base/$name"
printf '%s\n' "$key" >"$base/$name.lease"
if [ -n "$old" ]; then chmod -R u+rwx "$old" 2>/dev/null || :; rm -rf "$old"; fi
cd "$base/$name" && pwd -P
`

// discardScript ($1 upload) removes an upload that failed its verification.
const discardScript = `case "$1" in "$base"/.upload.*) rm -f "$1" ;; esac`

// Realize streams the workspace at HostPath (without .git) as a tar to the remote host, checks
// that the SHA-256 the host computed of what it stored is the one of what was sent, then
// extracts it into a staging directory and renames that into place at <base>/<WorkspaceRef>.
// A copy left there by an earlier lease is replaced. Root is the remote absolute path.
func (d *sshDriver) Realize(ctx context.Context, req RealizeRequest) (Realization, error) {
	key, err := d.keyOf(req.Instance)
	if err != nil {
		return Realization{}, fmt.Errorf("realize: %w", err)
	}
	if !namePattern.MatchString(req.WorkspaceRef) {
		return Realization{}, fmt.Errorf("realize: the workspace ref must be one path component: %w", ErrInvalidRequest)
	}
	p := req.HostPath
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return Realization{}, fmt.Errorf("realize: host path must be absolute and clean: %w", ErrInvalidRequest)
	}
	if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
		return Realization{}, fmt.Errorf("realize: host path is not a directory: %w", ErrInvalidRequest)
	}
	pr, pw := io.Pipe()
	sent := sha256.New()
	packed := make(chan error, 1)
	go func() {
		err := writeTree(ctx, p, pw)
		pw.CloseWithError(err)
		packed <- err
	}()
	ref := req.Instance.Ref
	out, err := d.run(ctx, ref, d.script(uploadScript), io.TeeReader(pr, sent), nil)
	pr.CloseWithError(errors.New("upload ended")) // unblocks the packer if the session ended early
	if perr := <-packed; perr != nil {
		return Realization{}, fmt.Errorf("realize: pack: %w", perr)
	}
	if err != nil {
		return Realization{}, fmt.Errorf("realize: upload: %w", err)
	}
	upload, remoteSum, ok := parseUpload(out)
	if !ok {
		return Realization{}, fmt.Errorf("realize: upload: unexpected answer from the remote host")
	}
	if want := hex.EncodeToString(sent.Sum(nil)); remoteSum != want {
		_, _ = d.run(context.WithoutCancel(ctx), ref, d.script(discardScript), nil, nil, upload)
		return Realization{}, fmt.Errorf("realize: the remote host stored sha256:%s, Berth sent sha256:%s", remoteSum, want)
	}
	out, err = d.run(ctx, ref, d.script(placeScript), nil, nil, upload, req.WorkspaceRef, key)
	if err != nil {
		return Realization{}, fmt.Errorf("realize: extract: %w", err)
	}
	root := strings.TrimSpace(string(out))
	if !path.IsAbs(root) || strings.ContainsAny(root, "\n\x00") {
		return Realization{}, fmt.Errorf("realize: the remote host answered no absolute directory")
	}
	d.mu.Lock()
	d.roots[root] = sshRoot{instance: req.Instance.Ref, name: req.WorkspaceRef}
	d.mu.Unlock()
	return Realization{Root: root}, nil
}

// parseUpload reads the upload script's answer: the upload's path, then "<hex>  -".
func parseUpload(out []byte) (upload, sum string, ok bool) {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		return "", "", false
	}
	f := strings.Fields(lines[1])
	if len(f) == 0 || len(f[0]) != 64 {
		return "", "", false
	}
	return lines[0], strings.ToLower(f[0]), true
}

// writeTree writes the tree at dir to w as a tar: directories, regular files (hard links as
// separate files) and symlinks as they are, everything named .git left out, devices, FIFOs and
// sockets too. Modes are 0755 for directories and 0644 or 0755 for files; owners are not
// recorded. Reads go through an os.Root, so nothing outside dir is read.
func writeTree(ctx context.Context, dir string, w io.Writer) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tw := tar.NewWriter(w)
	buf := make([]byte, 256<<10)
	err = fs.WalkDir(root.FS(), ".", func(name string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if name == "." {
			return nil
		}
		if e.Name() == ".git" {
			if e.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		fi, err := root.Lstat(name)
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: name, ModTime: fi.ModTime(), Format: tar.FormatPAX}
		switch mode := fi.Mode(); {
		case mode.IsDir():
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, name+"/", 0o755
			return tw.WriteHeader(hdr)
		case mode&fs.ModeSymlink != 0:
			target, err := root.Readlink(name)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, target, 0o777
			return tw.WriteHeader(hdr)
		case mode.IsRegular():
			return writeTreeFile(root, tw, hdr, buf)
		default:
			return nil // devices, FIFOs, sockets stay on this host
		}
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func writeTreeFile(root *os.Root, tw *tar.Writer, hdr *tar.Header, buf []byte) error {
	f, err := root.OpenFile(hdr.Name, os.O_RDONLY|noFollow, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return nil // replaced since the walk saw it
	}
	hdr.Typeflag, hdr.Size, hdr.Mode = tar.TypeReg, fi.Size(), 0o644
	if fi.Mode().Perm()&0o111 != 0 {
		hdr.Mode = 0o755
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.CopyBuffer(tw, io.LimitReader(f, hdr.Size), buf)
	if err != nil {
		return err
	}
	if n != hdr.Size {
		return fmt.Errorf("%s shrank while it was sent", hdr.Name)
	}
	return nil
}

// sameFile reports whether the regular file name under root holds exactly data's content.
func sameFile(root *os.Root, name string, size int64, sum []byte) bool {
	f, err := root.OpenFile(name, os.O_RDONLY|noFollow, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() || fi.Size() != size {
		return false
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return false
	}
	return bytes.Equal(h.Sum(nil), sum)
}
