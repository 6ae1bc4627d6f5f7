package environment

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"syscall"

	"berth/environment/driverpb"
	"berth/workspace"
)

// maxManifestBytes caps a capsule manifest a plugin sends back.
const maxManifestBytes = 64 << 20

// putImage sends the active image layer to the plugin: a tar of the layer directory (symlinks
// inside it kept) with its SHA-256 in the trailer; the plugin keeps it under the version's digest.
func (d *pluginDriver) putImage(ctx context.Context) error {
	return d.call(ctx, "put image", pluginDataTimeout, func(ctx context.Context, c driverpb.DriverClient) error {
		stream, err := c.PutImage(ctx)
		if err != nil {
			return err
		}
		if err := stream.Send(&driverpb.ImageChunk{Part: &driverpb.ImageChunk_Header{Header: &driverpb.ImageHeader{
			Settings: d.cfg.Settings, Digest: d.imageDigest}}}); err != nil {
			return err
		}
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(writeTree(ctx, d.image, pw)) }()
		sum := sha256.New()
		_, err = copyChunks(io.TeeReader(pr, sum), func(b []byte) error {
			return stream.Send(&driverpb.ImageChunk{Part: &driverpb.ImageChunk_Data{Data: b}})
		})
		pr.CloseWithError(errors.New("image stream ended"))
		if err != nil {
			return err
		}
		if err := stream.Send(&driverpb.ImageChunk{Part: &driverpb.ImageChunk_Trailer{Trailer: &driverpb.StreamTrailer{
			Sha256: hex.EncodeToString(sum.Sum(nil))}}}); err != nil {
			return err
		}
		_, err = stream.CloseAndRecv()
		return err
	})
}

// Realize packs the workspace at HostPath into a capsule (workspace.Pack: ordinary files and
// directories, .git left out), sends its manifest, the tar and the tar's SHA-256, and records the
// root the plugin answers as the instance's.
func (d *pluginDriver) Realize(ctx context.Context, req RealizeRequest) (Realization, error) {
	ref, err := refOf(req.Instance)
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
	f, err := os.CreateTemp(d.tmp, ".berth-capsule-*.tar")
	if err != nil {
		return Realization{}, fmt.Errorf("realize: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	capsule, err := workspace.Pack(ctx, p, f)
	if err != nil {
		return Realization{}, fmt.Errorf("realize: %w", err)
	}
	manifest, err := json.Marshal(capsule.Manifest)
	if err != nil {
		return Realization{}, fmt.Errorf("realize: %w", err)
	}
	var root string
	err = d.call(ctx, "realize", pluginDataTimeout, func(ctx context.Context, c driverpb.DriverClient) error {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		stream, err := c.Realize(ctx)
		if err != nil {
			return err
		}
		if err := stream.Send(&driverpb.RealizeChunk{Part: &driverpb.RealizeChunk_Header{Header: &driverpb.RealizeHeader{
			Settings: d.cfg.Settings, Ref: ref, WorkspaceRef: req.WorkspaceRef, Manifest: manifest,
			TreeDigest: capsule.TreeDigest}}}); err != nil {
			return err
		}
		sum := sha256.New()
		if _, err := copyChunks(io.TeeReader(f, sum), func(b []byte) error {
			return stream.Send(&driverpb.RealizeChunk{Part: &driverpb.RealizeChunk_Data{Data: b}})
		}); err != nil {
			return err
		}
		if err := stream.Send(&driverpb.RealizeChunk{Part: &driverpb.RealizeChunk_Trailer{Trailer: &driverpb.StreamTrailer{
			Sha256: hex.EncodeToString(sum.Sum(nil))}}}); err != nil {
			return err
		}
		resp, err := stream.CloseAndRecv()
		if err != nil {
			return err
		}
		root = resp.Root
		return nil
	})
	if err != nil {
		return Realization{}, err
	}
	if !path.IsAbs(root) || path.Clean(root) != root || root == "/" {
		return Realization{}, fmt.Errorf("realize: plugin %s answered no absolute directory", d.cfg.Name)
	}
	d.mu.Lock()
	d.roots[root] = ref
	d.mu.Unlock()
	return Realization{Root: root}, nil
}

// Sync receives the instance's workspace as a capsule, imports it into a staging directory on this
// host (workspace.Import checks every entry against the manifest, and Berth checks the manifest's
// digest and the stream's SHA-256), and only then applies it to HostPath: changed files written,
// files the capsule no longer has removed. What a capsule cannot carry (.git, symlinks,
// hard-linked files, devices) stays as it is here.
func (d *pluginDriver) Sync(ctx context.Context, req SyncRequest) error {
	ref, err := refOf(req.Instance)
	if err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	p := req.HostPath
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return fmt.Errorf("sync: host path must be absolute and clean: %w", ErrInvalidRequest)
	}
	if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
		return fmt.Errorf("sync: host path is not a directory: %w", ErrInvalidRequest)
	}
	staging, err := os.MkdirTemp(d.tmp, ".berth-sync-")
	if err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	defer os.RemoveAll(staging)
	tree := filepath.Join(staging, "tree")
	err = d.call(ctx, "sync", pluginDataTimeout, func(ctx context.Context, c driverpb.DriverClient) error {
		stream, err := c.Sync(ctx, &driverpb.SyncRequest{Settings: d.cfg.Settings, Ref: ref, Root: req.Root})
		if err != nil {
			return err
		}
		return receiveCapsule(ctx, d.cfg.Name, stream.Recv, tree)
	})
	if err != nil {
		return err
	}
	if err := applyCapsuleTree(ctx, tree, p); err != nil {
		return fmt.Errorf("sync: apply: %w", err)
	}
	return nil
}

// ErrCapsuleMismatch means a capsule a plugin sent is not what its header claimed: an entry, the
// manifest's digest or the stream's SHA-256 differs. Nothing of it was applied.
var ErrCapsuleMismatch = errors.New("capsule does not match its digest")

// receiveCapsule reads a capsule stream (header, data, trailer) into target, verified.
func receiveCapsule(ctx context.Context, plugin string, recv func() (*driverpb.CapsuleChunk, error), target string) error {
	first, err := recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil || len(h.Manifest) > maxManifestBytes {
		return fmt.Errorf("plugin %s sent a capsule stream without its manifest first: %w", plugin, ErrCapsuleMismatch)
	}
	var m workspace.Manifest
	if err := json.Unmarshal(h.Manifest, &m); err != nil {
		return fmt.Errorf("plugin %s sent an unreadable manifest: %w", plugin, ErrCapsuleMismatch)
	}
	if got := m.Digest(); got != h.TreeDigest {
		return fmt.Errorf("plugin %s lied about the tree digest: the manifest's digest is %s, it claimed %s: %w", plugin, got, h.TreeDigest, ErrCapsuleMismatch)
	}
	pr, pw := io.Pipe()
	imported := make(chan error, 1)
	go func() {
		err := workspace.Import(ctx, pr, m, target, workspace.Limits{})
		pr.CloseWithError(err)
		imported <- err
	}()
	sum := sha256.New()
	var trailer *driverpb.StreamTrailer
	var streamErr error
	for trailer == nil {
		msg, err := recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = fmt.Errorf("plugin %s ended the capsule stream without its trailer: %w", plugin, ErrCapsuleMismatch)
			}
			streamErr = err
			break
		}
		switch part := msg.Part.(type) {
		case *driverpb.CapsuleChunk_Data:
			sum.Write(part.Data)
			if _, err := pw.Write(part.Data); err != nil {
				streamErr = err
			}
		case *driverpb.CapsuleChunk_Trailer:
			trailer = part.Trailer
		default:
			streamErr = fmt.Errorf("plugin %s sent a second header in the capsule stream: %w", plugin, ErrCapsuleMismatch)
		}
		if streamErr != nil {
			break
		}
	}
	if streamErr == nil && trailer.Sha256 != hex.EncodeToString(sum.Sum(nil)) {
		streamErr = fmt.Errorf("plugin %s lied about the capsule's sha256: it is %s, it claimed %s: %w", plugin,
			hex.EncodeToString(sum.Sum(nil)), trailer.Sha256, ErrCapsuleMismatch)
	}
	if streamErr != nil {
		pw.CloseWithError(streamErr)
		<-imported
		_ = os.RemoveAll(target)
		return streamErr
	}
	pw.Close()
	if err := <-imported; err != nil {
		return fmt.Errorf("plugin %s sent a capsule that does not match its manifest: %w: %w", plugin, err, ErrCapsuleMismatch)
	}
	return nil
}

// applyCapsuleTree applies the verified tree at src onto dst: as applyTree does for a downloaded
// tar, but what a capsule cannot hold (symlinks, hard-linked files, devices and other special
// files in dst) is kept rather than removed.
func applyCapsuleTree(ctx context.Context, src, dst string) error {
	root, err := os.OpenRoot(dst)
	if err != nil {
		return err
	}
	defer root.Close()
	kept, err := uncarried(ctx, root)
	if err != nil {
		return err
	}
	a := &applier{root: root, seen: map[string]bool{}, kept: kept, dirs: map[string]bool{"": true}, buf: make([]byte, 256<<10)}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTree(ctx, src, pw)) }()
	defer pr.Close()
	tr := tar.NewReader(pr)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if err := a.entry(tr, hdr); err != nil {
			return err
		}
	}
	return a.removeRest(ctx)
}

// uncarried lists the entries below root that a capsule leaves out (symlinks, files with more
// than one link, special files), so applying a capsule does not delete them.
func uncarried(ctx context.Context, root *os.Root) (map[string]bool, error) {
	kept := map[string]bool{}
	err := fs.WalkDir(root.FS(), ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p == "." {
			return nil
		}
		if e.Name() == ".git" {
			if e.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		switch t := e.Type(); {
		case t.IsDir():
		case t.IsRegular():
			fi, err := e.Info()
			if err != nil {
				return err
			}
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
				kept[p] = true
			}
		default:
			kept[p] = true
		}
		return nil
	})
	return kept, err
}
