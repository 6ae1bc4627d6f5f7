package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"berth/db"
	"berth/db/dbtest"
	"berth/environment/jail/jailtest"
)

// TestMain doubles as the berth binary: with BERTH_TEST_AS_MAIN=1 the test binary runs main(),
// so end-to-end tests start real berth processes without a separate build.
func TestMain(m *testing.M) {
	if os.Getenv("BERTH_TEST_AS_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	dbtest.Main(m)
}

// env is a getenv over a map.
func env(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

// runCLI runs one berth command in-process and returns its streams.
func runCLI(t *testing.T, vars map[string]string, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = run(ctx, args, env(vars), strings.NewReader(stdin), &out, &errb)
	return out.String(), errb.String(), err
}

func TestUserAndTokenCommands(t *testing.T) {
	t.Parallel()
	conn := dbtest.ConnString(t)
	vars := map[string]string{"DATABASE_URL": conn}

	if _, _, err := runCLI(t, vars, "correct horse battery\n", "user", "add", "--email", "Ada@Example.com", "--admin"); err != nil {
		t.Fatalf("user add: %v", err)
	}
	_, _, err := runCLI(t, vars, "another password\n", "user", "add", "--email", "ada@example.com")
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("duplicate user add: err = %v, want 'already exists'", err)
	}
	if _, _, err := runCLI(t, vars, "another password\n", "user", "add", "--email", "ada@example.com", "--update"); err != nil {
		t.Fatalf("user add --update: %v", err)
	}
	pool, err := db.Open(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	u, err := db.UserByEmail(context.Background(), pool, "ada@example.com")
	if err != nil || !u.IsInstanceAdmin || db.CheckPassword(u.PasswordHash, "another password") != nil {
		t.Fatalf("after --update: user %+v, err %v; want admin with the new password", u, err)
	}

	// Company membership: the company must exist.
	_, _, err = runCLI(t, vars, "viewer password\n", "user", "add", "--email", "v@example.com", "--company", "acme", "--role", "viewer")
	if err == nil || !strings.Contains(err.Error(), `no company with slug "acme"`) {
		t.Fatalf("unknown company: %v", err)
	}
	if _, err := db.UserByEmail(context.Background(), pool, "v@example.com"); !errors.Is(err, db.ErrNotFound) {
		t.Fatal("a refused user add left a user behind")
	}
	if _, err := db.CreateCompany(context.Background(), pool, "Acme", "acme"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCLI(t, vars, "viewer password\n", "user", "add", "--email", "v@example.com", "--company", "acme", "--role", "viewer"); err != nil {
		t.Fatalf("user add with company: %v", err)
	}
	ms, err := db.UserMemberships(context.Background(), pool, mustUser(t, pool, "v@example.com").ID)
	if err != nil || len(ms) != 1 || ms[0].Role != "viewer" || ms[0].CompanySlug != "acme" {
		t.Fatalf("memberships = %+v (%v)", ms, err)
	}

	stdout, stderr, err := runCLI(t, vars, "", "token", "add", "--email", "ada@example.com", "--name", "ci")
	if err != nil {
		t.Fatalf("token add: %v (%s)", err, stderr)
	}
	tok := strings.TrimSpace(stdout)
	if strings.Count(stdout, "\n") != 1 || !strings.HasPrefix(tok, "berth_") {
		t.Fatalf("token add stdout = %q, want only the token", stdout)
	}
	got, _, err := db.TokenUser(context.Background(), pool, db.HashToken(tok))
	if err != nil || got.Email != "ada@example.com" {
		t.Fatalf("printed token resolves to %+v (%v)", got, err)
	}
	var stored int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM api_tokens WHERE token_hash = $1`, db.HashToken(tok)).Scan(&stored); err != nil || stored != 1 {
		t.Fatalf("token stored as its hash: %d (%v)", stored, err)
	}
	var plain int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM api_tokens WHERE encode(token_hash, 'escape') LIKE '%' || $1 || '%'`, tok).Scan(&plain); err != nil || plain != 0 {
		t.Fatal("the token is stored in plain text")
	}
}

func mustUser(t *testing.T, q db.Querier, email string) db.User {
	t.Helper()
	u, err := db.UserByEmail(context.Background(), q, email)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestCLIErrors(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none"} // never reached: every case fails first
	cases := []struct {
		name  string
		stdin string
		args  []string
		want  string
	}{
		{"no command", "", nil, "no command given"},
		{"unknown command", "", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"user without add", "", []string{"user", "remove"}, `did you mean "user add"`},
		{"missing email", "password123456\n", []string{"user", "add"}, "--email is required"},
		{"bad email", "password123456\n", []string{"user", "add", "--email", "not-an-email"}, "is not an email address"},
		{"no password", "", []string{"user", "add", "--email", "a@b.c"}, "first line of stdin"},
		{"short password", "short\n", []string{"user", "add", "--email", "a@b.c"}, "at least 10 characters"},
		{"role without company", "password123456\n", []string{"user", "add", "--email", "a@b.c", "--role", "board"}, "go together"},
		{"bad role", "password123456\n", []string{"user", "add", "--email", "a@b.c", "--company", "x", "--role", "owner"}, "want board or viewer"},
		{"unknown flag", "", []string{"token", "add", "--mail", "a@b.c"}, "flag provided but not defined"},
		{"token without email", "", []string{"token", "add"}, "--email is required"},
		{"stray argument", "", []string{"migrate", "now"}, `unexpected argument "now"`},
	}
	for _, tc := range cases {
		_, _, err := runCLI(t, vars, tc.stdin, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: err = %v, want one line containing %q", tc.name, err, tc.want)
		}
	}
	out, _, err := runCLI(t, vars, "", "version")
	if err != nil || !strings.HasPrefix(out, "berth ") {
		t.Fatalf("version = %q, %v", out, err)
	}
}

func TestMigrateTwice(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"DATABASE_URL": dbtest.ConnString(t)}
	for i := 0; i < 2; i++ {
		if out, stderr, err := runCLI(t, vars, "", "migrate"); err != nil || !strings.Contains(out, "migrations applied") {
			t.Fatalf("migrate #%d: %q %v (%s)", i+1, out, err, stderr)
		}
	}
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// waitHealthy polls /api/health until it answers 200 or the deadline passes.
func waitHealthy(t testing.TB, base string, deadline time.Duration) {
	t.Helper()
	end := time.Now().Add(deadline)
	for time.Now().Before(end) {
		resp, err := http.Get(base + "/api/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s did not become healthy within %s", base, deadline)
}

func TestServeInProcess(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	vars := map[string]string{"DATABASE_URL": dbtest.ConnString(t), "BERTH_ADDR": addr, "BERTH_DATA_DIR": jailtest.Dir(t),
		"BERTH_ADMIN_EMAIL": "root@example.com", "BERTH_ADMIN_PASSWORD": "a long admin password", "BERTH_LOG_LEVEL": "warn"}
	ctx, cancel := context.WithCancel(context.Background())
	var out, errb bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve", "--demo"}, env(vars), strings.NewReader(""), &out, &errb) }()
	base := "http://" + addr
	waitHealthy(t, base, time.Minute)

	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	resp, err := c.PostForm(base+"/login", url.Values{"email": {"root@example.com"}, "password": {"a long admin password"}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "Demo Company") {
		t.Fatalf("login then dashboard = %d; demo company shown: %v", resp.StatusCode, strings.Contains(string(body), "Demo Company"))
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("serve did not stop within a minute of cancellation")
	}
	if !strings.Contains(out.String(), "Berth is running at "+base) || !strings.Contains(out.String(), "root@example.com") ||
		strings.Contains(out.String(), "a long admin password") {
		t.Fatalf("serve printed %q", out.String())
	}
}

// berthProc starts the test binary as `berth args…` with the given environment.
func berthProc(t testing.TB, vars map[string]string, stdin string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "BERTH_TEST_AS_MAIN=1", "DATABASE_URL=")
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = strings.NewReader(stdin)
	return cmd
}

// TestEmbeddedServerAndCLI is the newcomer path on the embedded default: a real `berth serve`
// process on its own cluster, `berth user add` and `berth token add` from other processes while
// it serves, a token that works against the server, and all of it still there after a restart.
func TestEmbeddedServerAndCLI(t *testing.T) {
	t.Parallel()
	dataDir := jailtest.Dir(t)
	addr := freeAddr(t)
	base := "http://" + addr
	vars := map[string]string{"BERTH_DATA_DIR": dataDir, "BERTH_ADDR": addr, "BERTH_LOG_LEVEL": "warn"}

	startServer := func() (*exec.Cmd, *syncBuffer) {
		cmd := berthProc(t, vars, "", "serve")
		out := &syncBuffer{}
		cmd.Stdout = out
		cmd.Stderr = out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		waitHealthy(t, base, 2*time.Minute)
		return cmd, out
	}
	stopServer := func(cmd *exec.Cmd) {
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- cmd.Wait() }()
		select {
		case err := <-errc:
			if err != nil {
				t.Fatalf("server exit: %v", err)
			}
		case <-time.After(time.Minute):
			t.Fatal("server did not stop within a minute of SIGTERM")
		}
	}

	srv, out := startServer()
	if !strings.Contains(out.String(), "password:") || !strings.Contains(out.String(), "admin@localhost") {
		t.Fatalf("first start did not print the generated admin login:\n%s", out.String())
	}

	cli := func(stdin string, args ...string) string {
		t.Helper()
		cmd := berthProc(t, vars, stdin, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("berth %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return stdout.String()
	}
	cli("operator password\n", "user", "add", "--email", "op@example.com")
	tok := strings.TrimSpace(cli("", "token", "add", "--email", "op@example.com"))

	me := func() int {
		req, _ := http.NewRequest(http.MethodGet, base+"/api/me", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := me(); code != http.StatusOK {
		t.Fatalf("token from the CLI against the running server: /api/me = %d", code)
	}
	// The CLI borrowed the server's cluster: the server still answers after the CLI exited.
	waitHealthy(t, base, 10*time.Second)

	stopServer(srv)
	pid := postmasterPID(t, filepath.Join(dataDir, "pg", "data"))
	if pid != 0 && syscall.Kill(pid, 0) == nil {
		t.Fatalf("postgres (pid %d) still runs after the server stopped", pid)
	}

	srv, out = startServer()
	if strings.Contains(out.String(), "password:") {
		t.Fatal("second start generated another admin password")
	}
	if code := me(); code != http.StatusOK {
		t.Fatalf("after restart: /api/me = %d, want 200 (data kept)", code)
	}
	stopServer(srv)
}

// syncBuffer is a bytes.Buffer a child process writes to while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// postmasterPID reads postmaster.pid, or 0 when it is gone.
func postmasterPID(t *testing.T, dataDir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	fmt.Sscanf(string(b), "%d", &pid)
	return pid
}

func TestParseTrustedProxies(t *testing.T) {
	t.Parallel()
	got, err := parseTrustedProxies(" 10.0.0.0/8, 192.168.1.7 ,::1/128,")
	if err != nil || len(got) != 3 || got[0].String() != "10.0.0.0/8" || got[1].String() != "192.168.1.7/32" || got[2].String() != "::1/128" {
		t.Fatalf("parse: %v, %v", got, err)
	}
	for _, bad := range []string{"10.0.0.0/33", "proxy.example", "10.0.0.1/8/2"} {
		if _, err := parseTrustedProxies(bad); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}

func TestParseSize(t *testing.T) {
	t.Parallel()
	cases := map[string]int64{"": 0, "1024": 1024, "2GiB": 2 << 30, "500M": 500 << 20, "64k": 64 << 10, "3 MiB": 3 << 20, "1T": 1 << 40}
	for in, want := range cases {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"-1", "0", "lots", "2PB", "1.5G", "9999999999T"} {
		if _, err := parseSize(bad); err == nil {
			t.Errorf("parseSize(%q) accepted", bad)
		}
	}
}
