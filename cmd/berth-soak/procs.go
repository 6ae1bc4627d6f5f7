package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a berth process the soak started.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// startBerth starts `berth args…` with the soak's environment plus extra, appending its output
// to <root>/<name>.log.
func (s *soak) startBerth(name string, extra []string, args ...string) (*proc, error) {
	logFile, err := os.OpenFile(filepath.Join(s.root, name+".log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(s.opts.bin, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL=", "BERTH_DATA_DIR="+s.dataDir(), "BERTH_ADDR="+s.addr,
		"BERTH_ADMIN_EMAIL=admin@soak.example", "BERTH_ADMIN_PASSWORD=soak admin password 0123", "BERTH_LOG_LEVEL=warn")
	cmd.Env = append(cmd.Env, extra...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kill SIGKILLs the process alone (not its group, as the OOM killer would) and waits for it.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop asks the process to stop (SIGTERM) and kills it after grace.
func (p *proc) stop(grace time.Duration) {
	if p == nil || !p.alive() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		fmt.Printf("soak: %s did not stop within %s of SIGTERM; killing it\n", p.name, grace)
		p.kill()
	}
}

func (s *soak) dataDir() string { return filepath.Join(s.root, "data") }

// start launches serve (the cluster's owner) and, once it answers, the worker.
func (s *soak) start(ctx context.Context) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	s.addr = ln.Addr().String()
	ln.Close()
	s.base = "http://" + s.addr
	if s.serve, err = s.startBerth("serve", []string{"BERTH_NODE_ID=soak-serve"}, "serve"); err != nil {
		return err
	}
	if err := s.waitHealthy(ctx, 2*time.Minute); err != nil {
		return fmt.Errorf("serve: %w (see %s)", err, filepath.Join(s.root, "serve.log"))
	}
	return s.startWorker()
}

func (s *soak) startWorker() error {
	w, err := s.startBerth("worker", []string{"BERTH_NODE_ID=soak-worker"}, "worker")
	if err != nil {
		return err
	}
	s.worker = w
	return nil
}

// waitHealthy polls /api/health until it says 200.
func (s *soak) waitHealthy(ctx context.Context, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		if s.serve != nil && !s.serve.alive() {
			return fmt.Errorf("berth serve exited")
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.base+"/api/health", nil)
		resp, err := s.http.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not healthy within %s", within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// killPostmaster SIGKILLs the embedded postmaster (serve must restart it) and measures how long
// until /api/health answers 200 again.
func (s *soak) killPostmaster(ctx context.Context) {
	b, err := os.ReadFile(filepath.Join(s.dataDir(), "pg", "data", "postmaster.pid"))
	if err != nil {
		fmt.Println("soak: no postmaster.pid to kill:", err)
		return
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return
	}
	killed := time.Now()
	s.pgKills = append(s.pgKills, killed)
	if err := s.waitHealthy(ctx, 60*time.Second); err != nil {
		s.pgNotBack++
		fmt.Printf("soak: PostgreSQL not back within 60 s of its SIGKILL: %v\n", err)
		return
	}
	s.pgDown = max(s.pgDown, time.Since(killed))
}

// killWorker SIGKILLs the worker and starts a new one after a short pause, as a supervisor
// (systemd, Kubernetes) would.
func (s *soak) killWorker() {
	s.worker.kill()
	s.workerKills = append(s.workerKills, time.Now())
	time.Sleep(time.Duration(500+s.rng.IntN(2500)) * time.Millisecond)
	if err := s.startWorker(); err != nil {
		fmt.Println("soak: restart the worker:", err)
	}
}

// shutdown stops the worker, then serve (which stops PostgreSQL); calling it again is a no-op.
func (s *soak) shutdown() {
	s.worker.stop(time.Minute)
	s.serve.stop(time.Minute)
}
