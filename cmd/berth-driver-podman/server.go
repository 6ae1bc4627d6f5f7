package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"berth/environment/driverpb"
)

// server implements the driver protocol on podman.
type server struct {
	driverpb.UnimplementedDriverServer
	state string // the plugin's own directory (BERTH_PLUGIN_STATE)
	self  string // this executable, bind-mounted into every container as the helper

	mu       sync.Mutex
	services map[string]map[string]int // container → service name → container port
	images   sync.Mutex                // one image import at a time
}

func newServer(state string) *server {
	if state == "" {
		state = filepath.Join(os.TempDir(), "berth-driver-podman")
	}
	self, _ := os.Executable()
	return &server{state: state, self: self, services: map[string]map[string]int{}}
}

// Info names the plugin.
func (s *server) Info(context.Context, *driverpb.InfoRequest) (*driverpb.InfoResponse, error) {
	return &driverpb.InfoResponse{Name: "berth-driver-podman", Version: version, ProtocolVersion: driverpb.ProtocolVersion,
		Capabilities: []string{"services", "terminal"}}, nil
}

// run runs a podman command to its end and returns its standard output; a failure carries the
// end of its standard error.
func run(ctx context.Context, cmd *exec.Cmd, stdin []byte) ([]byte, error) {
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	stop, err := start(ctx, cmd)
	if err != nil {
		return nil, err
	}
	defer stop()
	if err := cmd.Wait(); err != nil {
		msg := strings.TrimSpace(errOut.String())
		if len(msg) > 2000 {
			msg = msg[len(msg)-2000:]
		}
		if ctx.Err() != nil {
			return out.Bytes(), status.FromContextError(ctx.Err()).Err()
		}
		return out.Bytes(), fmt.Errorf("%s: %v: %s", filepath.Base(cmd.Path), err, msg)
	}
	return out.Bytes(), nil
}

// start starts cmd and kills its process group when ctx ends before the returned stop is called
// (after cmd.Wait).
func start(ctx context.Context, cmd *exec.Cmd) (stop func() bool, err error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	pid := cmd.Process.Pid
	return context.AfterFunc(ctx, func() { _ = syscall.Kill(-pid, syscall.SIGKILL) }), nil
}

// Probe checks that podman answers and can run the helper from the plugin.
func (s *server) Probe(ctx context.Context, req *driverpb.ProbeRequest) (*driverpb.ProbeResponse, error) {
	set, err := parseSettings(req.Settings)
	if err != nil {
		return nil, err
	}
	r := &driverpb.ProbeResponse{Ok: true}
	check := func(name string, ok bool, detail string) {
		st := "pass"
		if !ok {
			st, r.Ok = "fail", false
		}
		r.Checks = append(r.Checks, &driverpb.Check{Name: name, Status: st, Detail: detail})
	}
	out, err := run(ctx, set.podmanCmd("info", "--format", "{{.Version.Version}} {{.Host.OCIRuntime.Name}} cgroups {{.Host.CgroupsVersion}} {{.Store.GraphDriverName}} rootless={{.Host.Security.Rootless}}"), nil)
	if err != nil {
		check("podman", false, "podman does not answer: "+err.Error())
	} else {
		info := strings.TrimSpace(string(out))
		check("podman", !strings.Contains(info, "rootless=true"), "podman "+info)
	}
	check("state", writable(s.state), "the plugin's state directory is writable")
	if fi, err := os.Stat(s.self); err != nil || fi.Mode().Perm()&0o005 != 0o005 {
		check("helper", false, "the plugin executable must be readable and executable by all (it is mounted into containers)")
	} else {
		check("helper", true, "the plugin is mounted into each container at "+helperPath)
	}
	r.Summary = "Podman runs containers (network " + set.Network + ")."
	for _, c := range r.Checks {
		if c.Status == "fail" {
			r.Summary = "Podman probe failed: " + c.Detail
			break
		}
	}
	return r, nil
}

func writable(dir string) bool {
	f, err := os.CreateTemp(dir, ".probe-")
	if err != nil {
		return false
	}
	f.Close()
	return os.Remove(f.Name()) == nil
}

var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// imageDir is where an image version's root filesystem is kept.
func (s *server) imageDir(digest string) string {
	return filepath.Join(s.state, "images", strings.TrimPrefix(digest, "sha256:"))
}

// containerName is a lease key's container: the same key, the same container.
func containerName(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "berth-" + hex.EncodeToString(sum[:12])
}

// Acquire creates (or finds) the lease's container: the image layer as its root under an
// overlay that is thrown away with it, the helper as pid 1, /workspace as working directory.
func (s *server) Acquire(ctx context.Context, req *driverpb.AcquireRequest) (*driverpb.AcquireResponse, error) {
	set, err := parseSettings(req.Settings)
	if err != nil {
		return nil, err
	}
	if req.Key == "" || len(req.Key) > 256 {
		return nil, status.Error(codes.InvalidArgument, "acquire: a key is required")
	}
	if !digestPattern.MatchString(req.ImageDigest) {
		return nil, status.Error(codes.InvalidArgument, "acquire: podman environments need an image version (sha256 digest)")
	}
	rootfs := filepath.Join(s.imageDir(req.ImageDigest), "rootfs")
	if _, err := os.Stat(rootfs); err != nil {
		return &driverpb.AcquireResponse{NeedImage: true}, nil
	}
	name := containerName(req.Key)
	args := []string{"run", "-d", "--name", name, "--label", "berth.key=" + req.Key, "--label", "berth.image=" + req.ImageDigest,
		"--network", set.Network, "--workdir", "/workspace", "--pids-limit", strconv.Itoa(set.PidsMax),
		"--stop-signal", "SIGTERM", "--stop-timeout", "5",
		"-v", s.self + ":" + helperPath + ":ro", "-v", "/workspace", "--entrypoint", helperPath}
	if set.MemoryMB > 0 {
		args = append(args, "--memory", strconv.Itoa(set.MemoryMB)+"m")
	}
	for _, p := range set.ServicePorts {
		args = append(args, "-p", "127.0.0.1::"+strconv.Itoa(p))
	}
	args = append(args, ulimits()...)
	args = append(args, "--rootfs", rootfs+":O", "pause")
	// A new key (the common case) costs one podman call; a retry finds its container by name.
	_, err = run(ctx, set.podmanCmd(args...), nil)
	if err != nil && strings.Contains(err.Error(), "already in use") {
		out, ierr := run(ctx, set.podmanCmd("container", "inspect", "--format", "{{.State.Status}}", name), nil)
		if ierr == nil && strings.TrimSpace(string(out)) == "running" {
			return &driverpb.AcquireResponse{Ref: name}, nil
		}
		_, _ = run(ctx, set.podmanCmd("rm", "-f", "-v", "-t", "0", name), nil) // a stopped leftover: start afresh
		_, err = run(ctx, set.podmanCmd(args...), nil)
	}
	if err != nil {
		return nil, status.Errorf(codes.Unknown, "acquire: %v", err)
	}
	return &driverpb.AcquireResponse{Ref: name}, nil
}

// Release removes the lease's container (and everything in it). A container that is gone is
// released already.
func (s *server) Release(ctx context.Context, req *driverpb.ReleaseRequest) (*driverpb.ReleaseResponse, error) {
	set, err := parseSettings(req.Settings)
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(req.Ref, "berth-") {
		return nil, status.Error(codes.InvalidArgument, "release: not a container of this plugin")
	}
	if _, err := run(ctx, set.podmanCmd("rm", "-f", "-v", "-t", "2", "--ignore", req.Ref), nil); err != nil {
		return nil, status.Errorf(codes.Unknown, "release: %v", err)
	}
	s.mu.Lock()
	delete(s.services, req.Ref)
	s.mu.Unlock()
	return &driverpb.ReleaseResponse{}, nil
}

// checkRef refuses refs that are not this plugin's containers.
func checkRef(ref string) error {
	if !regexp.MustCompile(`^berth-[0-9a-f]{24}$`).MatchString(ref) {
		return status.Error(codes.InvalidArgument, "not a container of this plugin")
	}
	return nil
}

// errorf is an Unknown status with a message.
func errorf(format string, args ...any) error { return status.Errorf(codes.Unknown, format, args...) }

var errShortStream = errors.New("the stream ended early")
