package handlers

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/cgi"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"berth/db"
	"berth/environment/netns"
	"berth/jobs"
)

// testHostSeq numbers the test hosts' veth pairs and subnets across parallel tests.
var testHostSeq atomic.Int32

// testHost is a machine of its own for egress tests: a network namespace joined to Berth's by a
// veth pair, at 10.250.N.2, with servers the test starts in it (never anything off this host).
type testHost struct {
	ns   *netns.Namespace
	addr netip.Addr // the host's address, reached through the veth pair
	ca   *x509.CertPool
	cert tls.Certificate
	pem  []byte
}

func newTestHost(t *testing.T) *testHost {
	t.Helper()
	n := testHostSeq.Add(1)
	ns, err := netns.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	outer, inner := fmt.Sprintf("bth%dh", n), fmt.Sprintf("bth%dn", n)
	h := &testHost{ns: ns, addr: netip.MustParseAddr(fmt.Sprintf("10.250.%d.2", n))}
	ip := func(in bool, args ...string) {
		t.Helper()
		run := func() error {
			out, err := exec.Command("ip", args...).CombinedOutput()
			if err != nil {
				return fmt.Errorf("ip %v: %v %s", args, err, out)
			}
			return nil
		}
		var err error
		if in {
			err = ns.Do(run)
		} else {
			err = run()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	ip(false, "link", "add", outer, "type", "veth", "peer", "name", inner)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", outer).Run() })
	// Move the inner end: ip takes the namespace of a process in it.
	var sleeper *exec.Cmd
	if err := ns.Do(func() error { sleeper = exec.Command("sleep", "600"); return sleeper.Start() }); err != nil {
		t.Fatal(err)
	}
	ip(false, "link", "set", inner, "netns", fmt.Sprint(sleeper.Process.Pid))
	_ = sleeper.Process.Kill()
	_ = sleeper.Wait()
	ip(false, "addr", "add", fmt.Sprintf("10.250.%d.1/24", n), "dev", outer)
	ip(false, "link", "set", outer, "up")
	ip(true, "addr", "add", h.addr.String()+"/24", "dev", inner)
	ip(true, "link", "set", inner, "up")

	// A CA of the test host's own and a certificate for every name under berth.test.
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test host CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	h.ca = x509.NewCertPool()
	h.ca.AddCert(caCert)
	h.pem = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "berth.test"}, DNSNames: []string{"*.berth.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &leafKey.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	h.cert = tls.Certificate{Certificate: [][]byte{leafDER, caDER}, PrivateKey: leafKey}
	return h
}

// serve serves handler on the test host's port (TLS with its certificate when secure).
func (h *testHost) serve(t *testing.T, port int, secure bool, handler http.Handler) {
	t.Helper()
	l, err := h.ns.Listen("tcp", netip.AddrPortFrom(h.addr, uint16(port)).String())
	if err != nil {
		t.Fatal(err)
	}
	if secure {
		l = tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{h.cert}})
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l) //nolint:errcheck
	t.Cleanup(func() { srv.Close() })
}

// TestEgressByPolicy (DESIGN §15, issue 22): real clients in a real run (curl, git over https,
// Python's urllib, Node) reach test hosts on a host of their own only as the environment's policy
// says, through Berth's egress proxy: allowed and denied domains and CIDRs, a name resolving to a
// private address, a policy edit applied mid-run, SOCKS for raw TCP, tools that ignore the proxy
// variables (no route at all), and a credential the proxy injects (seen by the server, never in
// the jail). Every refusal is a 403 with X-Berth-Egress, a line of the run's log, a ledger step, an
// audit event and a counter; the run records the hosts it reached.
func TestEgressByPolicy(t *testing.T) {
	if !netns.Available() {
		t.Skip("egress tests need network namespaces (root)")
	}
	t.Parallel()
	host := newTestHost(t)
	const secret = "s3cr3t-api-token"
	var sawAuth atomic.Value
	sawAuth.Store("")
	host.serve(t, 443, true, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Host == "api.berth.test" && r.URL.Path == "/whoami":
			sawAuth.Store(r.Header.Get("Authorization"))
			if r.Header.Get("Authorization") == "Bearer "+secret {
				io.WriteString(w, "authorized\n")
			} else {
				http.Error(w, "who are you", http.StatusUnauthorized)
			}
		case strings.HasPrefix(r.URL.Path, "/repo.git"):
			(&cgi.Handler{Path: "/usr/lib/git-core/git-http-backend", Env: []string{"GIT_PROJECT_ROOT=" + gitRoot(t),
				"GIT_HTTP_EXPORT_ALL=1"}}).ServeHTTP(w, r)
		default:
			fmt.Fprintf(w, "hello from %s\n", r.Host)
		}
	}))
	host.serve(t, 80, false, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello from %s\n", r.Host) }))
	raw, err := host.ns.Listen("tcp", netip.AddrPortFrom(host.addr, 7000).String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	go func() {
		for {
			c, err := raw.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	names := map[string]string{"pkg.berth.test": host.addr.String(), "git.berth.test": host.addr.String(),
		"api.berth.test": host.addr.String(), "blocked.berth.test": host.addr.String(),
		"raw.berth.test": host.addr.String(), "private.berth.test": "10.99.0.1",
		"other.berth.test": "1.2.3.4"} // public, and never dialed: the allowlist refuses it first
	var egress *jobs.Egress
	re := setupRunsWorkers(t, func(d *jobs.Deps) {
		egress = d.Egress
		egress.Proxy.Resolve = func(ctx context.Context, name string) ([]netip.Addr, error) {
			if a, ok := names[name]; ok {
				return []netip.Addr{netip.MustParseAddr(a)}, nil
			}
			return nil, fmt.Errorf("no such host %s", name)
		}
		egress.Proxy.UpstreamRoots = host.ca
	})
	var denied sync.Map
	egress.Denied = func(env, reason string) { denied.Store(reason, true) }
	re.workspaceWith("")
	if err := os.WriteFile(filepath.Join(re.repo, "hostca.pem"), host.pem, 0o644); err != nil {
		t.Fatal(err)
	}
	gitCommitAll(t, re.repo)
	cidr := netip.PrefixFrom(host.addr, 32).String() // the test host is on a private address: allowed by CIDR
	re.setEgress(t, map[string]any{"mode": "allowlist", "allow": []string{"pkg.berth.test", "git.berth.test", "api.berth.test",
		"raw.berth.test", "private.berth.test", cidr}, "deny": []string{"blocked.berth.test"}},
		[]map[string]any{{"name": "API_TOKEN", "secret": true, "value": secret, "inject": map[string]any{"hosts": []string{"api.berth.test"}}}})

	cmd := `set +e
CA=$PWD/hostca.pem
echo "pkg: $(curl -sS --max-time 10 --cacert $CA https://pkg.berth.test/hello)"
echo "blocked: $(curl -s -o /dev/null -w '%{http_code}' --max-time 10 --cacert $CA https://blocked.berth.test/ ; echo " exit $?")"
curl -sv --max-time 10 --cacert $CA https://blocked.berth.test/ 2>&1 | grep -i 'x-berth-egress' | sed 's/^/header: /'
echo "other: $(curl -s -o /dev/null --max-time 10 --cacert $CA https://other.berth.test/; echo "exit $?")"
echo "private: $(curl -s -o /dev/null --max-time 10 --cacert $CA https://private.berth.test/; echo "exit $?")"
echo "plain-http: $(curl -sS --max-time 10 http://pkg.berth.test/plain)"
GIT_SSL_CAINFO=$CA git clone -q https://git.berth.test/repo.git cloned && echo "git: $(cat cloned/README.md)"
echo "python: $(python3 -c 'import urllib.request,ssl,sys; print(urllib.request.urlopen("https://pkg.berth.test/py", context=ssl.create_default_context(cafile=sys.argv[1])).read().decode().strip())' $CA)"
echo "socks: $(printf 'ping\n' | curl -s --max-time 5 telnet://raw.berth.test:7000 2>&1 | head -1)"
echo "node-fetch: $(node -e 'fetch("https://pkg.berth.test/").then(()=>console.log("reached")).catch(e=>console.log("no route", e.cause && e.cause.code))' 2>&1 | tail -1)"
echo "noproxy: $(curl -s -o /dev/null --max-time 5 --noproxy '*' -k https://` + host.addr.String() + `/; echo "exit $?")"
echo "direct: $(python3 -c 'import socket,sys; socket.create_connection((sys.argv[1], 443), 3); print("connected")' ` + host.addr.String() + ` 2>&1 | tail -1)"
echo "inject: $(curl -sS --max-time 10 https://api.berth.test/whoami)"
echo "own-header: $(curl -s -o /dev/null -w '%{http_code}' --max-time 10 -H 'Authorization: Bearer mine' https://api.berth.test/whoami)"
# The secret is assembled inside awk, so no command line of this script holds it.
find_secret() { awk 'BEGIN { p = "` + secret[:6] + `" "` + secret[6:] + `" } index($0, p) { n++ } END { print n + 0 }' "$@"; }
echo "secret-in-env: $(env | find_secret)"
echo "secret-in-files: $(find "$HOME" /tmp . -type f -size -1M 2>/dev/null | while read f; do find_secret "$f"; done | awk '{ s += $1 } END { print s + 0 }')"
echo "secret-in-procs: $(cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' '\n' | find_secret)"
echo "mid-run: first $(curl -s -o /dev/null -w '%{http_code}' --max-time 10 --cacert $CA https://pkg.berth.test/again)"
for i in $(seq 200); do
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 --cacert $CA https://pkg.berth.test/again)
  [ "$code" = 000 ] && { echo "mid-run: refused after the edit"; break; }
  sleep 0.2
done
true`
	task := re.task(cmd)
	id := re.start(task.ID, nil)
	re.waitLog(id, "mid-run: first 200")
	// The policy edit applies to the next connection of the running run.
	re.setEgress(t, map[string]any{"mode": "allowlist", "allow": []string{"git.berth.test", "api.berth.test", cidr},
		"deny": []string{"blocked.berth.test", "pkg.berth.test"}}, nil)
	run := re.waitRun(id, "the end", ended)
	log := re.log(id)
	for _, want := range []string{
		"pkg: hello from pkg.berth.test",
		"blocked: 000 exit 56",
		"header: < X-Berth-Egress: denied deny blocked.berth.test",
		"other: exit 56",
		"private: exit 56",
		"plain-http: hello from pkg.berth.test",
		"git: hello",
		"python: hello from pkg.berth.test",
		"socks: ping",
		"node-fetch: no route",
		"noproxy: exit 7",
		"inject: authorized",
		"own-header: 403",
		"secret-in-env: 0",
		"secret-in-files: 0",
		"secret-in-procs: 0",
		"mid-run: refused after the edit",
		"egress denied: blocked.berth.test:443 (deny blocked.berth.test)",
		"egress denied: other.berth.test:443 (not on the allowlist)",
		"egress denied: private.berth.test:443 (private address 10.99.0.1)",
		"egress denied: pkg.berth.test:443 (deny pkg.berth.test)",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("run log lacks %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, "direct: connected") {
		t.Errorf("a tool that ignores the proxy reached the host directly:\n%s", log)
	}
	if got := sawAuth.Load().(string); got != "Bearer "+secret {
		t.Errorf("the server saw Authorization %q", got)
	}
	if strings.Contains(log, secret) {
		t.Errorf("the secret reached the run's log")
	}
	// Ledger, audit, metrics, and the run's record of hosts.
	if n := re.count(`SELECT count(*) FROM workspace_operations WHERE run_id = $1 AND phase = 'egress' AND status = 'failed'`, id); n < 3 {
		t.Errorf("egress ledger steps: %d", n)
	}
	waitFor(t, 30*time.Second, "egress audit events", func() bool {
		return re.count(`SELECT count(*) FROM audit_events WHERE action = 'egress.denied' AND target_id = $1`, id) >= 3
	})
	for _, r := range []string{"deny", "not_on_the_allowlist", "private_address"} {
		if _, ok := denied.Load(r); !ok {
			t.Errorf("no denial counted for %s", r)
		}
	}
	doc, err := db.RunEgress(context.Background(), re.pool, re.r.A.ID, id)
	var rec struct{ Hosts []jobs.EgressHost }
	if err == nil {
		err = json.Unmarshal(doc, &rec)
	}
	seen := map[string]bool{}
	for _, h := range rec.Hosts {
		seen[fmt.Sprintf("%s:%d %v", h.Host, h.Port, h.Allowed)] = true
	}
	for _, want := range []string{"pkg.berth.test:443 true", "pkg.berth.test:443 false", "blocked.berth.test:443 false", "raw.berth.test:7000 true"} {
		if !seen[want] {
			t.Errorf("run egress record lacks %s: %s %v", want, doc, err)
		}
	}
	_ = run
}

// setEgress sets the project environment's egress setting (and env entries) through the API.
func (re *runEnv) setEgress(t *testing.T, egress map[string]any, env []map[string]any) {
	t.Helper()
	cfg := map[string]any{"egress": egress}
	if env != nil {
		cfg["env"] = env
	} else {
		cfg["env"] = []map[string]any{{"name": "API_TOKEN", "secret": true, "value": map[string]bool{"set": true},
			"inject": map[string]any{"hosts": []string{"api.berth.test"}}}}
	}
	if code, out := re.call(re.r.Admin, http.MethodPatch, "/api/environments/"+runEnvEnvironment, map[string]any{"config": cfg}); code != http.StatusOK {
		t.Fatalf("set egress = %d %v", code, out)
	}
}

// waitLog waits until run id's log holds want.
func (re *runEnv) waitLog(id, want string) {
	re.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		if strings.Contains(re.log(id), want) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	re.t.Fatalf("run %s's log never showed %q:\n%s", id, want, re.log(id))
}

// gitRoot is a directory holding a bare repo.git with one commit (README.md "hello").
func gitRoot(t *testing.T) string {
	t.Helper()
	root := filepath.Join(os.TempDir(), "berth-egress-git-"+fmt.Sprint(os.Getpid()))
	if _, err := os.Stat(filepath.Join(root, "repo.git")); err == nil {
		return root
	}
	work := t.TempDir()
	for _, args := range [][]string{{"init", "-q", "-b", "main", work}, {"-C", work, "-c", "user.name=T", "-c", "user.email=t@e",
		"commit", "-q", "--allow-empty", "-m", "x"}} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	if err := os.WriteFile(filepath.Join(work, "README.md"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"-C", work, "add", "-A"}, {"-C", work, "-c", "user.name=T", "-c", "user.email=t@e", "commit", "-q", "-m", "readme"},
		{"clone", "-q", "--bare", work, filepath.Join(root, "repo.git")}} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	return root
}

// gitCommitAll commits everything in repo.
func gitCommitAll(t *testing.T, repo string) {
	t.Helper()
	for _, args := range [][]string{{"-C", repo, "add", "-A"}, {"-C", repo, "-c", "user.name=T", "-c", "user.email=t@e", "commit", "-q", "-m", "more"}} {
		cmd := exec.Command("git", args...)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
}
