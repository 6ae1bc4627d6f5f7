package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// settings are the "settings" object of a podman environment's config (docs/plugins.md).
type settings struct {
	// Socket is the rootful podman service's socket (podman system service), which the plugin's
	// user must be allowed to connect to. Empty: run podman directly (only as root).
	Socket string `json:"socket"`
	// Network is "none" (the default: only the container's own loopback) or "bridge" (podman's
	// default network, with egress). Services need "bridge" to publish their port.
	Network string `json:"network"`
	// ServicePorts are the container ports published on the host's 127.0.0.1 for runtime
	// services (each service gets one of them as $PORT). Needs network "bridge".
	ServicePorts []int `json:"service_ports"`
	MemoryMB     int   `json:"memory_mb"`
	PidsMax      int   `json:"pids_max"`
	// Podman is the podman executable (default "podman" on PATH).
	Podman string `json:"podman"`
}

// parseSettings reads and checks a settings object; a bad one is an InvalidArgument.
func parseSettings(raw []byte) (settings, error) {
	s := settings{Network: "none", PidsMax: 512, MemoryMB: 1024, Podman: "podman"}
	if len(bytes.TrimSpace(raw)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&s); err != nil {
			return s, status.Errorf(codes.InvalidArgument, "settings: %v", err)
		}
	}
	switch {
	case s.Network != "none" && s.Network != "bridge":
		return s, status.Error(codes.InvalidArgument, `settings: network must be "none" or "bridge"`)
	case len(s.ServicePorts) > 0 && s.Network != "bridge":
		return s, status.Error(codes.InvalidArgument, `settings: service_ports need network "bridge"`)
	case len(s.ServicePorts) > 16:
		return s, status.Error(codes.InvalidArgument, "settings: at most 16 service ports")
	case s.MemoryMB < 0 || s.MemoryMB > 1<<20 || s.PidsMax < 0 || s.PidsMax > 1<<22:
		return s, status.Error(codes.InvalidArgument, "settings: memory_mb or pids_max out of range")
	case s.Socket != "" && (s.Socket[0] != '/' || len(s.Socket) > 100):
		return s, status.Error(codes.InvalidArgument, "settings: socket must be an absolute path")
	}
	for _, p := range s.ServicePorts {
		if p < 1 || p > 65535 {
			return s, status.Error(codes.InvalidArgument, "settings: service ports must be from 1 to 65535")
		}
	}
	return s, nil
}

// podmanCmd is a podman command line against the configured service.
func (s settings) podmanCmd(args ...string) *exec.Cmd {
	full := args
	if s.Socket != "" {
		full = append([]string{"--remote", "--url", "unix://" + s.Socket}, args...)
	}
	cmd := exec.Command(s.Podman, full...)
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=" + os.Getenv("HOME"), "LANG=C.UTF-8",
		"TMPDIR=" + os.Getenv("TMPDIR")}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd
}

// ulimits are the container's file and process limits: modest values at most the plugin's own
// (podman's defaults are higher than some hosts let a container raise them to, and the podman
// service may run with lower limits than the plugin; --pids-limit bounds processes anyway).
func ulimits() []string {
	var out []string
	for _, l := range []struct {
		name string
		res  int
		max  uint64
	}{{"nofile", syscall.RLIMIT_NOFILE, 16384}, {"nproc", 6 /* RLIMIT_NPROC */, 4096}} {
		var r syscall.Rlimit
		if err := syscall.Getrlimit(l.res, &r); err != nil {
			continue
		}
		n := min(r.Max, l.max, r.Cur)
		out = append(out, "--ulimit", fmt.Sprintf("%s=%s:%s", l.name, strconv.FormatUint(n, 10), strconv.FormatUint(n, 10)))
	}
	return out
}
