// Command testplugin is a driver plugin for Berth's own tests, never for use: each instance is a
// directory in its state dir and commands run on the host in it. Its file name picks how it
// behaves: "...-hang" never answers Info, "...-crash" exits in the middle of every Exec,
// "...-liar" claims a tree digest in Sync that its capsule does not have; any other name keeps
// the contract (the negative control of the contract suite's tests).
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"berth/environment/driverpb"
	"berth/workspace"
)

func main() {
	mode := ""
	for _, m := range []string{"hang", "crash", "liar"} {
		if strings.HasSuffix(filepath.Base(os.Args[0]), "-"+m) {
			mode = m
		}
	}
	state := os.Getenv("BERTH_PLUGIN_STATE")
	// Tests read who ran and how often: started-<pid> holds the uid.
	_ = os.WriteFile(filepath.Join(state, "started-"+strconv.Itoa(os.Getpid())), []byte(strconv.Itoa(os.Getuid())), 0o644)
	driverpb.Serve(&plugin{mode: mode, state: state, running: map[string]func(){}})
}

type plugin struct {
	driverpb.UnimplementedDriverServer
	mode  string
	state string

	mu      sync.Mutex
	running map[string]func() // tag → cancel
}

func (p *plugin) Info(ctx context.Context, _ *driverpb.InfoRequest) (*driverpb.InfoResponse, error) {
	if p.mode == "hang" {
		<-ctx.Done()
		select {} // never answers, even after the caller gave up
	}
	return &driverpb.InfoResponse{Name: "testplugin", Version: "1.0.0-" + p.mode, ProtocolVersion: driverpb.ProtocolVersion}, nil
}

func (p *plugin) Probe(context.Context, *driverpb.ProbeRequest) (*driverpb.ProbeResponse, error) {
	return &driverpb.ProbeResponse{Ok: true, Summary: "Test plugin ready.", Checks: []*driverpb.Check{{Name: "dir", Status: "pass", Detail: "ok"}}}, nil
}

var refPattern = regexp.MustCompile(`^i-[0-9a-f]{16}$`)

func (p *plugin) dir(ref string) (string, error) {
	if !refPattern.MatchString(ref) {
		return "", status.Error(codes.InvalidArgument, "bad ref")
	}
	return filepath.Join(p.state, "instances", ref), nil
}

func (p *plugin) Acquire(_ context.Context, req *driverpb.AcquireRequest) (*driverpb.AcquireResponse, error) {
	if req.ImageDigest != "" {
		if _, err := os.Stat(filepath.Join(p.state, "images", strings.TrimPrefix(req.ImageDigest, "sha256:"))); err != nil {
			return &driverpb.AcquireResponse{NeedImage: true}, nil
		}
	}
	sum := sha256.Sum256([]byte(req.Key))
	ref := "i-" + hex.EncodeToString(sum[:8])
	d, _ := p.dir(ref)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, err
	}
	return &driverpb.AcquireResponse{Ref: ref}, nil
}

func (p *plugin) PutImage(stream driverpb.Driver_PutImageServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return status.Error(codes.InvalidArgument, "no header")
	}
	sum := sha256.New()
	var size int64
	for {
		c, err := stream.Recv()
		if err != nil {
			return err
		}
		if t := c.GetTrailer(); t != nil {
			if t.Sha256 != hex.EncodeToString(sum.Sum(nil)) {
				return status.Error(codes.DataLoss, "image sha256 mismatch")
			}
			break
		}
		sum.Write(c.GetData())
		size += int64(len(c.GetData()))
	}
	dir := filepath.Join(p.state, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, strings.TrimPrefix(h.Digest, "sha256:")), []byte(hex.EncodeToString(sum.Sum(nil))), 0o644); err != nil {
		return err
	}
	return stream.SendAndClose(&driverpb.PutImageResponse{})
}

func (p *plugin) Realize(stream driverpb.Driver_RealizeServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return status.Error(codes.InvalidArgument, "no header")
	}
	inst, err := p.dir(h.Ref)
	if err != nil {
		return err
	}
	var m workspace.Manifest
	if err := json.Unmarshal(h.Manifest, &m); err != nil || m.Digest() != h.TreeDigest {
		return status.Error(codes.DataLoss, "manifest does not match its digest")
	}
	root := filepath.Join(inst, "ws")
	_ = os.RemoveAll(root)
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := workspace.Import(stream.Context(), pr, m, root, workspace.Limits{})
		pr.CloseWithError(err)
		done <- err
	}()
	sum := sha256.New()
	for {
		c, err := stream.Recv()
		if err != nil {
			pw.CloseWithError(err)
			<-done
			return err
		}
		if t := c.GetTrailer(); t != nil {
			if t.Sha256 != hex.EncodeToString(sum.Sum(nil)) {
				pw.CloseWithError(errors.New("sha256 mismatch"))
				<-done
				return status.Error(codes.DataLoss, "capsule sha256 mismatch")
			}
			break
		}
		sum.Write(c.GetData())
		if _, err := pw.Write(c.GetData()); err != nil {
			return err
		}
	}
	pw.Close()
	if err := <-done; err != nil {
		return status.Errorf(codes.DataLoss, "import: %v", err)
	}
	return stream.SendAndClose(&driverpb.RealizeResponse{Root: root})
}

func (p *plugin) Exec(req *driverpb.ExecRequest, stream driverpb.Driver_ExecServer) error {
	cmd := exec.Command("/bin/sh", "-c", req.Command)
	cmd.Dir = req.Dir
	for k, v := range req.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return err
	}
	pw.Close()
	pgid := cmd.Process.Pid
	_ = stream.Send(&driverpb.ExecEvent{Event: &driverpb.ExecEvent_Started{Started: &driverpb.Started{Pid: int64(pgid), UnixNano: time.Now().UnixNano()}}})
	if p.mode == "crash" { // in the middle of the command, after its start reached Berth
		time.Sleep(300 * time.Millisecond)
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		os.Exit(3)
	}
	var mu sync.Mutex
	var timedOut, cancelled bool
	kill := func(flag *bool) {
		mu.Lock()
		*flag = true
		mu.Unlock()
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		time.AfterFunc(time.Duration(req.GraceMs)*time.Millisecond, func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	}
	p.mu.Lock()
	p.running[req.Tag] = func() { kill(&cancelled) }
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.running, req.Tag)
		p.mu.Unlock()
	}()
	if req.TimeoutMs > 0 {
		t := time.AfterFunc(time.Duration(req.TimeoutMs)*time.Millisecond, func() { kill(&timedOut) })
		defer t.Stop()
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := pr.Read(buf)
		if n > 0 {
			_ = stream.Send(&driverpb.ExecEvent{Event: &driverpb.ExecEvent_Output{Output: append([]byte(nil), buf[:n]...)}})
		}
		if err != nil {
			break
		}
	}
	werr := cmd.Wait()
	_ = syscall.Kill(-pgid, syscall.SIGKILL) // whatever the command left behind ends with it
	code := 0
	signaled := false
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code, signaled = 128+int(ws.Signal()), true
		} else {
			code = ee.ExitCode()
		}
	}
	mu.Lock()
	defer mu.Unlock()
	return stream.Send(&driverpb.ExecEvent{Event: &driverpb.ExecEvent_Exited{Exited: &driverpb.Exited{ExitCode: int32(code),
		Signaled: signaled, TimedOut: timedOut, Cancelled: cancelled && !timedOut, UnixNano: time.Now().UnixNano()}}})
}

func (p *plugin) Cancel(_ context.Context, req *driverpb.CancelRequest) (*driverpb.CancelResponse, error) {
	p.mu.Lock()
	c := p.running[req.Tag]
	p.mu.Unlock()
	if c != nil {
		c()
	}
	return &driverpb.CancelResponse{}, nil
}

func (p *plugin) Sync(req *driverpb.SyncRequest, stream driverpb.Driver_SyncServer) error {
	inst, err := p.dir(req.Ref)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(p.state, "sync-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	c, err := workspace.Pack(stream.Context(), filepath.Join(inst, "ws"), f)
	if err != nil {
		return err
	}
	manifest, _ := json.Marshal(c.Manifest)
	digest := c.TreeDigest
	if p.mode == "liar" {
		digest = "sha256:" + strings.Repeat("0", 64)
	}
	if err := stream.Send(&driverpb.CapsuleChunk{Part: &driverpb.CapsuleChunk_Header{Header: &driverpb.CapsuleHeader{Manifest: manifest,
		TreeDigest: digest}}}); err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	sum := sha256.New()
	buf := make([]byte, 256<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			sum.Write(buf[:n])
			if err := stream.Send(&driverpb.CapsuleChunk{Part: &driverpb.CapsuleChunk_Data{Data: buf[:n]}}); err != nil {
				return err
			}
		}
		if err != nil {
			break
		}
	}
	return stream.Send(&driverpb.CapsuleChunk{Part: &driverpb.CapsuleChunk_Trailer{Trailer: &driverpb.StreamTrailer{Sha256: hex.EncodeToString(sum.Sum(nil))}}})
}

func (p *plugin) Release(_ context.Context, req *driverpb.ReleaseRequest) (*driverpb.ReleaseResponse, error) {
	inst, err := p.dir(req.Ref)
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(inst); err != nil {
		return nil, err
	}
	return &driverpb.ReleaseResponse{}, nil
}
