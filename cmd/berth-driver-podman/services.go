package main

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/creack/pty"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"berth/environment/driverpb"
)

var serviceName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// StartService starts a runtime service in the container on one of the published service ports
// (given to it in port_env) and answers the host address podman published it on (127.0.0.1).
func (s *server) StartService(ctx context.Context, req *driverpb.StartServiceRequest) (*driverpb.StartServiceResponse, error) {
	set, err := parseSettings(req.Settings)
	if err != nil {
		return nil, err
	}
	if err := checkRef(req.Ref); err != nil {
		return nil, err
	}
	if !serviceName.MatchString(req.Name) || req.Command == "" || req.PortEnv == "" || !filepath.IsAbs(req.Dir) {
		return nil, status.Error(codes.InvalidArgument, "start service: a name, a command, a port variable and an absolute dir are required")
	}
	s.mu.Lock()
	used := s.services[req.Ref]
	port := used[req.Name]
	if port == 0 {
		taken := map[int]bool{}
		for _, p := range used {
			taken[p] = true
		}
		for _, p := range set.ServicePorts {
			if !taken[p] {
				port = p
				break
			}
		}
	}
	if port == 0 {
		s.mu.Unlock()
		return nil, status.Error(codes.ResourceExhausted, "start service: every service port of the environment is in use (settings.service_ports)")
	}
	if used == nil {
		used = map[string]int{}
		s.services[req.Ref] = used
	}
	used[req.Name] = port
	s.mu.Unlock()
	tag := "svc-" + req.Name
	_, _ = run(ctx, set.podmanCmd("exec", req.Ref, helperPath, "kill", tag, "2000"), nil) // a restart replaces it
	env := map[string]string{}
	for k, v := range req.Env {
		env[k] = v
	}
	env[req.PortEnv] = strconv.Itoa(port)
	file, err := envFile(filepath.Join(s.state, "tmp"), env)
	if err != nil {
		return nil, err
	}
	defer os.Remove(file)
	if _, err := run(ctx, set.podmanCmd("exec", "-d", "--workdir", req.Dir, "--env-file", file, req.Ref, helperPath, "run", tag, "--",
		req.Command), nil); err != nil {
		return nil, errorf("start service: %v", err)
	}
	out, err := run(ctx, set.podmanCmd("port", req.Ref, strconv.Itoa(port)+"/tcp"), nil)
	if err != nil {
		return nil, errorf("start service: published port: %v", err)
	}
	addr := strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		return nil, errorf("start service: podman published %q, not a loopback address", addr)
	}
	return &driverpb.StartServiceResponse{Address: addr}, nil
}

// StopService ends every process of the service.
func (s *server) StopService(ctx context.Context, req *driverpb.StopServiceRequest) (*driverpb.StopServiceResponse, error) {
	set, err := parseSettings(req.Settings)
	if err != nil {
		return nil, err
	}
	if err := checkRef(req.Ref); err != nil {
		return nil, err
	}
	if !serviceName.MatchString(req.Name) {
		return nil, status.Error(codes.InvalidArgument, "stop service: bad name")
	}
	if _, err := run(ctx, set.podmanCmd("exec", req.Ref, helperPath, "kill", "svc-"+req.Name, "5000"), nil); err != nil &&
		!strings.Contains(err.Error(), "no such container") {
		return nil, errorf("stop service: %v", err)
	}
	s.mu.Lock()
	delete(s.services[req.Ref], req.Name)
	s.mu.Unlock()
	return &driverpb.StopServiceResponse{}, nil
}

// Terminal is podman exec -it of a shell in the container, on a pty of the plugin's.
func (s *server) Terminal(stream driverpb.Driver_TerminalServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	open := first.GetOpen()
	if open == nil {
		return status.Error(codes.InvalidArgument, "terminal: the stream must start with open")
	}
	set, err := parseSettings(open.Settings)
	if err != nil {
		return err
	}
	if err := checkRef(open.Ref); err != nil {
		return err
	}
	dir := open.Dir
	if dir == "" {
		dir = "/workspace"
	}
	env := map[string]string{"TERM": "xterm-256color"}
	for k, v := range open.Env {
		env[k] = v
	}
	file, err := envFile(filepath.Join(s.state, "tmp"), env)
	if err != nil {
		return err
	}
	defer os.Remove(file)
	cmd := set.podmanCmd("exec", "-it", "--workdir", dir, "--env-file", file, open.Ref, helperPath, "run", "terminal", "--",
		`if [ -x /bin/bash ]; then exec /bin/bash -i; fi; exec /bin/sh -i`)
	cmd.SysProcAttr = nil // pty.Start makes its own session
	size := &pty.Winsize{Cols: uint16(max(open.Cols, 20)), Rows: uint16(max(open.Rows, 5))}
	tty, err := pty.StartWithSize(cmd, size)
	if err != nil {
		return errorf("terminal: %v", err)
	}
	defer tty.Close()
	go func() {
		for {
			in, err := stream.Recv()
			if err != nil {
				_ = cmd.Process.Kill()
				return
			}
			switch p := in.Part.(type) {
			case *driverpb.TerminalInput_Data:
				_, _ = tty.Write(p.Data)
			case *driverpb.TerminalInput_Resize:
				_ = pty.Setsize(tty, &pty.Winsize{Cols: uint16(p.Resize.Cols), Rows: uint16(p.Resize.Rows)})
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := tty.Read(buf)
		if n > 0 {
			if serr := stream.Send(&driverpb.TerminalOutput{Part: &driverpb.TerminalOutput_Data{Data: append([]byte(nil), buf[:n]...)}}); serr != nil {
				_ = cmd.Process.Kill()
				break
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				break
			}
			break
		}
	}
	code := 0
	if err := cmd.Wait(); err != nil {
		code = cmd.ProcessState.ExitCode()
	}
	return stream.Send(&driverpb.TerminalOutput{Part: &driverpb.TerminalOutput_Exit{Exit: &driverpb.Exited{ExitCode: int32(code)}}})
}
