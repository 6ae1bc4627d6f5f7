package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"berth/environment/driverpb"
	"berth/workspace"
)

// PutImage stores an image layer: extracted into a staging directory, kept under its digest only
// when the stream's SHA-256 matches the trailer.
func (s *server) PutImage(stream driverpb.Driver_PutImageServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil || !digestPattern.MatchString(h.Digest) {
		return status.Error(codes.InvalidArgument, "put image: the stream must start with a header naming the image digest")
	}
	s.images.Lock()
	defer s.images.Unlock()
	final := s.imageDir(h.Digest)
	if _, err := os.Stat(filepath.Join(final, "rootfs")); err == nil {
		return drain(stream, func() error { return stream.SendAndClose(&driverpb.PutImageResponse{}) })
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o700); err != nil {
		return errorf("put image: %v", err)
	}
	staging, err := os.MkdirTemp(filepath.Dir(final), ".staging-")
	if err != nil {
		return errorf("put image: %v", err)
	}
	defer os.RemoveAll(staging)
	rootfs := filepath.Join(staging, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return errorf("put image: %v", err)
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := untar(pr, rootfs, "", true)
		if err == nil {
			_, _ = io.Copy(io.Discard, pr)
		}
		pr.CloseWithError(err)
		done <- err
	}()
	sum, trailer, err := receiveData(func() (data []byte, t *driverpb.StreamTrailer, err error) {
		m, err := stream.Recv()
		if err != nil {
			return nil, nil, err
		}
		return m.GetData(), m.GetTrailer(), nil
	}, pw)
	pw.CloseWithError(err)
	if uerr := <-done; err == nil && uerr != nil {
		err = uerr
	}
	if err != nil {
		return errorf("put image: %v", err)
	}
	if trailer.Sha256 != sum {
		return status.Errorf(codes.DataLoss, "put image: received sha256 %s, the trailer says %s", sum, trailer.Sha256)
	}
	if err := os.Chmod(staging, 0o755); err != nil {
		return errorf("put image: %v", err)
	}
	if err := os.Rename(staging, final); err != nil {
		return errorf("put image: %v", err)
	}
	return stream.SendAndClose(&driverpb.PutImageResponse{})
}

// receiveData copies data messages to w until the trailer, returning the hex SHA-256 of the data.
func receiveData(recv func() ([]byte, *driverpb.StreamTrailer, error), w io.Writer) (string, *driverpb.StreamTrailer, error) {
	h := sha256.New()
	for {
		data, trailer, err := recv()
		if errors.Is(err, io.EOF) {
			return "", nil, errShortStream
		}
		if err != nil {
			return "", nil, err
		}
		if trailer != nil {
			return hex.EncodeToString(h.Sum(nil)), trailer, nil
		}
		h.Write(data)
		if _, err := w.Write(data); err != nil {
			return "", nil, err
		}
	}
}

// drain reads a client stream to its end, then answers.
func drain(stream interface {
	Recv() (*driverpb.ImageChunk, error)
}, answer func() error) error {
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return answer()
			}
			return err
		}
	}
}

// Realize verifies the capsule (every entry against the manifest, the manifest against its
// digest, the stream against its SHA-256) and only then copies it into the container at
// /workspace.
func (s *server) Realize(stream driverpb.Driver_RealizeServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return status.Error(codes.InvalidArgument, "realize: the stream must start with its header")
	}
	set, err := parseSettings(h.Settings)
	if err != nil {
		return err
	}
	if err := checkRef(h.Ref); err != nil {
		return err
	}
	var m workspace.Manifest
	if err := json.Unmarshal(h.Manifest, &m); err != nil || m.Digest() != h.TreeDigest {
		return status.Error(codes.DataLoss, "realize: the manifest does not match its tree digest")
	}
	tmp, err := os.MkdirTemp(filepath.Join(s.state, "tmp"), "realize-")
	if err != nil {
		return errorf("realize: %v", err)
	}
	defer os.RemoveAll(tmp)
	raw, err := os.Create(filepath.Join(tmp, "capsule.tar"))
	if err != nil {
		return errorf("realize: %v", err)
	}
	defer raw.Close()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := workspace.Import(stream.Context(), io.TeeReader(pr, raw), m, filepath.Join(tmp, "tree"), workspace.Limits{})
		pr.CloseWithError(err)
		done <- err
	}()
	sum, trailer, err := receiveData(func() ([]byte, *driverpb.StreamTrailer, error) {
		c, err := stream.Recv()
		if err != nil {
			return nil, nil, err
		}
		return c.GetData(), c.GetTrailer(), nil
	}, pw)
	if err == nil && trailer.Sha256 != sum {
		err = status.Errorf(codes.DataLoss, "realize: received sha256 %s, the trailer says %s", sum, trailer.Sha256)
	}
	pw.CloseWithError(err)
	if ierr := <-done; err == nil && ierr != nil {
		err = status.Errorf(codes.DataLoss, "realize: the capsule does not match its manifest: %v", ierr)
	}
	if err != nil {
		return err
	}
	if _, err := raw.Seek(0, io.SeekStart); err != nil {
		return errorf("realize: %v", err)
	}
	cmd := set.podmanCmd("cp", "-", h.Ref+":/workspace")
	cmd.Stdin = raw
	if _, err := run(stream.Context(), cmd, nil); err != nil {
		return errorf("realize: copy into the container: %v", err)
	}
	return stream.SendAndClose(&driverpb.RealizeResponse{Root: "/workspace"})
}

// Sync copies /workspace out of the container (podman cp to a tar stream, extracted here:
// directories and regular files), packs it into a capsule and sends manifest, data and trailer.
func (s *server) Sync(req *driverpb.SyncRequest, stream driverpb.Driver_SyncServer) error {
	set, err := parseSettings(req.Settings)
	if err != nil {
		return err
	}
	if err := checkRef(req.Ref); err != nil {
		return err
	}
	root := req.Root
	if root == "" {
		root = "/workspace"
	}
	if root != "/workspace" {
		return status.Error(codes.InvalidArgument, "sync: the workspace of a podman instance is /workspace")
	}
	ctx := stream.Context()
	tmp, err := os.MkdirTemp(filepath.Join(s.state, "tmp"), "sync-")
	if err != nil {
		return errorf("sync: %v", err)
	}
	defer os.RemoveAll(tmp)
	tree := filepath.Join(tmp, "tree")
	if err := os.Mkdir(tree, 0o700); err != nil {
		return errorf("sync: %v", err)
	}
	if err := copyOut(ctx, set, req.Ref, tree); err != nil {
		return errorf("sync: %v", err)
	}
	f, err := os.Create(filepath.Join(tmp, "capsule.tar"))
	if err != nil {
		return errorf("sync: %v", err)
	}
	defer f.Close()
	c, err := workspace.Pack(ctx, tree, f)
	if err != nil {
		return errorf("sync: %v", err)
	}
	return sendCapsule(stream, c, f)
}

// copyOut extracts the container's /workspace into dir.
func copyOut(ctx context.Context, set settings, ref, dir string) error {
	cmd := set.podmanCmd("cp", ref+":/workspace", "-")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var errOut tailWriter
	cmd.Stderr = &errOut
	stop, err := start(ctx, cmd)
	if err != nil {
		return err
	}
	defer stop()
	uerr := untar(out, dir, "workspace", false)
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("podman cp: %v: %s", err, errOut.String())
	}
	return uerr
}

// sendCapsule sends a packed capsule: header (manifest, digest), data, trailer.
func sendCapsule(stream driverpb.Driver_SyncServer, c workspace.Capsule, f *os.File) error {
	manifest, err := json.Marshal(c.Manifest)
	if err != nil {
		return errorf("sync: %v", err)
	}
	if err := stream.Send(&driverpb.CapsuleChunk{Part: &driverpb.CapsuleChunk_Header{Header: &driverpb.CapsuleHeader{
		Manifest: manifest, TreeDigest: c.TreeDigest}}}); err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return errorf("sync: %v", err)
	}
	h := sha256.New()
	buf := make([]byte, 256<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			h.Write(buf[:n])
			if serr := stream.Send(&driverpb.CapsuleChunk{Part: &driverpb.CapsuleChunk_Data{Data: buf[:n]}}); serr != nil {
				return serr
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return errorf("sync: %v", err)
		}
	}
	return stream.Send(&driverpb.CapsuleChunk{Part: &driverpb.CapsuleChunk_Trailer{Trailer: &driverpb.StreamTrailer{
		Sha256: hex.EncodeToString(h.Sum(nil))}}})
}

// tailWriter keeps the last 2 KiB written to it.
type tailWriter struct{ b []byte }

func (t *tailWriter) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 2048 {
		t.b = t.b[len(t.b)-2048:]
	}
	return len(p), nil
}

func (t *tailWriter) String() string { return string(t.b) }
