// Package sshtest starts a real OpenSSH server on loopback for tests of the ssh driver and of
// runs on ssh environments: its own host key, one authorized client key, key-only auth.
package sshtest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// SSHD is where Debian's openssh-server installs the server.
const SSHD = "/usr/sbin/sshd"

// Server is a real OpenSSH server on loopback, started for one test: its own host key, one
// authorized client key, and a base directory for remote workspaces. The remote host is this
// machine, so tests look at remote files and processes directly.
type Server struct {
	Port      int
	HostKey   string // authorized_keys form
	ClientKey string // PEM
	Base      string // a directory for remote workspaces
	PID       int
	log       *bytes.Buffer
}

// Start starts sshd -D on a free loopback port and stops it when the test ends. Without
// sshd the test is skipped, except under CI, where that is a failure.
func Start(t testing.TB) *Server {
	t.Helper()
	if _, err := os.Stat(SSHD); err != nil {
		if os.Getenv("CI") == "" {
			t.Skip("openssh-server is not installed (" + SSHD + ")")
		}
		t.Fatalf("CI needs openssh-server: %v", err)
	}
	dir := t.TempDir()
	keygen := func(name string) {
		out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", filepath.Join(dir, name)).CombinedOutput()
		if err != nil {
			t.Fatalf("ssh-keygen: %v: %s", err, out)
		}
	}
	keygen("host_key")
	keygen("client_key")
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	s := &Server{ClientKey: read("client_key"), Base: filepath.Join(t.TempDir(), "workspaces")}
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(read("host_key.pub")))
	if err != nil {
		t.Fatal(err)
	}
	s.HostKey = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub)))
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), []byte(read("client_key.pub")), 0o600); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for attempt := 0; ; attempt++ {
		err := s.start(t, dir)
		if err == nil {
			return s
		}
		if attempt == 2 {
			t.Fatalf("sshd did not start: %v\n%s", err, s.log)
		}
	}
}

// start writes the config for a fresh port and runs sshd until it accepts connections.
func (s *Server) start(t testing.TB, dir string) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	cfg := filepath.Join(dir, "sshd_config")
	conf := fmt.Sprintf(`ListenAddress 127.0.0.1
Port %d
HostKey %s
AuthorizedKeysFile %s
PidFile %s
UsePAM no
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
MaxStartups 100
MaxSessions 100
LogLevel ERROR
`, s.Port, filepath.Join(dir, "host_key"), filepath.Join(dir, "authorized_keys"), filepath.Join(dir, "sshd.pid"))
	// OpenSSH 9.8 and later penalize sources whose connections fail (as the wrong-key probe does);
	// older servers do not know the setting.
	if err := os.WriteFile(cfg, []byte(conf+"PerSourcePenalties no\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if exec.Command(SSHD, "-t", "-f", cfg).Run() != nil {
		if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s.log = &bytes.Buffer{}
	cmd := exec.Command(SSHD, "-D", "-e", "-f", cfg)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("sshd exited")
		default:
		}
		if c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)), time.Second); err == nil {
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			banner := make([]byte, 4)
			_, rerr := c.Read(banner)
			c.Close()
			if rerr == nil && string(banner) == "SSH-" {
				s.PID = cmd.Process.Pid
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	return errors.New("sshd did not accept connections before the deadline")
}
