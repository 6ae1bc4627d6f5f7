// Package oci turns an OCI image a user already has into a Berth image layer: it reads an OCI
// layout (directory or tar), a `docker save` tarball (plain or gzip-compressed) or a registry
// reference with go-containerregistry, and flattens the image's layers into one directory tree,
// applying whiteouts and opaque whiteouts, refusing path escapes and device nodes, and giving
// every file Berth's own user. The image's manifest digest identifies the result.
package oci

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"berth/workspace"
)

// ErrSource means the source names no image Berth can read: not an OCI layout, not a docker
// save tarball, not a reference that resolves.
var ErrSource = errors.New("not an image source")

// Source kinds, as recorded with an imported version.
const (
	KindLayout   = "oci-layout"
	KindArchive  = "docker-archive"
	KindRegistry = "registry"
)

// Platform is the platform picked from a multi-platform image.
var Platform = v1.Platform{OS: "linux", Architecture: "amd64"}

// Image is an opened image and where it came from.
type Image struct {
	v1.Image
	Kind   string // KindLayout, KindArchive or KindRegistry
	Source string // the reference, or the file or directory name (never a host path)
	close  func()
}

// Close removes what opening the image unpacked.
func (i Image) Close() {
	if i.close != nil {
		i.close()
	}
}

// Open reads source: a directory holding an OCI layout, a tar of one, a docker save tarball
// (.tar or .tar.gz), or otherwise a registry reference (tag or digest; plain http only for
// loopback and private registries). scratch is a directory for what must be unpacked first.
func Open(ctx context.Context, source, scratch string) (Image, error) {
	if fi, err := os.Stat(source); err == nil {
		base := filepath.Base(source)
		if fi.IsDir() {
			img, err := fromLayout(source)
			return Image{Image: img, Kind: KindLayout, Source: base}, err
		}
		return openFile(source, base, scratch)
	}
	if strings.HasPrefix(source, "/") || strings.HasPrefix(source, ".") {
		return Image{}, fmt.Errorf("open %s: no such file or directory: %w", filepath.Base(source), ErrSource)
	}
	ref, err := name.ParseReference(source)
	if err != nil {
		return Image{}, fmt.Errorf("open: %q is neither a file nor an image reference: %w", source, ErrSource)
	}
	img, err := remote.Image(ref, remote.WithContext(ctx), remote.WithPlatform(Platform))
	if err != nil {
		return Image{}, fmt.Errorf("pull %s: %v: %w", ref.Name(), err, ErrSource)
	}
	return Image{Image: img, Kind: KindRegistry, Source: ref.Name()}, nil
}

// fromLayout picks the image of an OCI layout: its only manifest, or the one for Platform.
func fromLayout(dir string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("oci layout: %v: %w", err, ErrSource)
	}
	return pickImage(idx)
}

// pickImage descends an index to one image: the only one, or the one for Platform.
func pickImage(idx v1.ImageIndex) (v1.Image, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("oci index: %v: %w", err, ErrSource)
	}
	var pick *v1.Descriptor
	for i, d := range m.Manifests {
		if len(m.Manifests) == 1 || d.Platform == nil || d.Platform.Satisfies(Platform) {
			pick = &m.Manifests[i]
			break
		}
	}
	if pick == nil {
		return nil, fmt.Errorf("oci index: no image for %s: %w", Platform.String(), ErrSource)
	}
	if pick.MediaType.IsIndex() {
		child, err := idx.ImageIndex(pick.Digest)
		if err != nil {
			return nil, fmt.Errorf("oci index: %v: %w", err, ErrSource)
		}
		return pickImage(child)
	}
	img, err := idx.Image(pick.Digest)
	if err != nil {
		return nil, fmt.Errorf("oci image: %v: %w", err, ErrSource)
	}
	return img, nil
}

// openFile opens a tar (or gzip-compressed tar): an OCI layout if it holds an oci-layout file,
// else a docker save tarball. go-containerregistry reads neither from a .tar.gz directly, so a
// compressed one is decompressed into scratch first.
func openFile(path, base, scratch string) (Image, error) {
	f, err := os.Open(path)
	if err != nil {
		return Image{}, fmt.Errorf("open %s: %w", base, err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	tmpDir, err := os.MkdirTemp(scratch, workspace.StagingPattern("oci")) // swept if the process dies
	if err != nil {
		return Image{}, err
	}
	cleanup := func() { os.RemoveAll(tmpDir) }
	plain := path
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			cleanup()
			return Image{}, fmt.Errorf("open %s: gzip: %v: %w", base, err, ErrSource)
		}
		plain = filepath.Join(tmpDir, "image.tar")
		out, err := os.Create(plain)
		if err == nil {
			_, err = io.Copy(out, zr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			cleanup()
			return Image{}, fmt.Errorf("open %s: gunzip: %v: %w", base, err, ErrSource)
		}
	}
	isLayout, err := tarHas(plain, "oci-layout")
	if err != nil {
		cleanup()
		return Image{}, fmt.Errorf("open %s: %v: %w", base, err, ErrSource)
	}
	if isLayout {
		dir := filepath.Join(tmpDir, "layout")
		if err := untarLayout(plain, dir); err != nil {
			cleanup()
			return Image{}, fmt.Errorf("open %s: %v: %w", base, err, ErrSource)
		}
		img, err := fromLayout(dir)
		if err != nil {
			cleanup()
			return Image{}, err
		}
		return Image{Image: img, Kind: KindLayout, Source: base, close: cleanup}, nil
	}
	img, err := tarball.ImageFromPath(plain, nil)
	if err != nil {
		cleanup()
		return Image{}, fmt.Errorf("open %s: neither an OCI layout nor a docker save tarball: %v: %w", base, err, ErrSource)
	}
	return Image{Image: img, Kind: KindArchive, Source: base, close: cleanup}, nil
}

// tarHas reports whether the tar at path has an entry named name (at its top).
func tarHas(path, entry string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if strings.TrimPrefix(h.Name, "./") == entry {
			return true, nil
		}
	}
}

// untarLayout extracts an OCI layout tar (regular files and directories only, names below dir).
func untarLayout(path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		n, err := cleanName(h.Name)
		if err != nil {
			return err
		}
		if n == "" {
			continue
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := mkdirAll(root, n); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := mkdirAll(root, filepath.Dir(n)); err != nil {
				return err
			}
			out, err := root.OpenFile(n, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
	}
}
