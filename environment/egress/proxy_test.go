package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// proxyFixture is a proxy on loopback whose policy the test edits, with names resolved from a
// table (test hosts are on 127.0.0.1, which the policy must allow by CIDR like any private range).
type proxyFixture struct {
	p      *Proxy
	http   string // host:port of the HTTP proxy
	socks  string
	mu     sync.Mutex
	policy Policy
	events []Event
}

func newProxyFixture(t *testing.T, names map[string]string) *proxyFixture {
	t.Helper()
	f := &proxyFixture{}
	f.p = &Proxy{
		Policy: func(ctx context.Context, key string) (Policy, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if key != "ws-1" {
				return Policy{}, fmt.Errorf("unknown key %q", key)
			}
			return f.policy, nil
		},
		Resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
			a, ok := names[host]
			if !ok {
				return nil, fmt.Errorf("no such host %s", host)
			}
			var out []netip.Addr
			for _, s := range strings.Split(a, ",") {
				out = append(out, netip.MustParseAddr(s))
			}
			return out, nil
		},
		Observe: func(key string, e Event) { f.mu.Lock(); f.events = append(f.events, e); f.mu.Unlock() },
	}
	for _, serve := range []func(net.Listener, string){f.p.ServeHTTPProxy, f.p.ServeSOCKS} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go serve(l, "ws-1")
		if f.http == "" {
			f.http = l.Addr().String()
		} else {
			f.socks = l.Addr().String()
		}
	}
	return f
}

func (f *proxyFixture) set(t *testing.T, mode Mode, allow, deny []string) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.policy = Policy{Mode: mode, Allow: rules(t, allow...), Deny: rules(t, deny...)}
}

func (f *proxyFixture) client(roots *x509.CertPool) *http.Client {
	u, _ := url.Parse("http://" + f.http)
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(u),
		TLSClientConfig: &tls.Config{RootCAs: roots}, DisableKeepAlives: true}}
}

func get(t *testing.T, c *http.Client, u string) (int, string, http.Header) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		return 0, err.Error(), nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// Test hosts are named under example.com: httptest's TLS certificate names *.example.com.

// TestProxyHTTPAndConnect: plain HTTP and CONNECT through the proxy follow the policy, a refusal
// is a 403 naming the rule, and a policy edit applies to the very next connection.
func TestProxyHTTPAndConnect(t *testing.T) {
	t.Parallel()
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "plain "+r.Host) }))
	defer plain.Close()
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "tls ok") }))
	defer tlsSrv.Close()
	_, plainPort, _ := net.SplitHostPort(strings.TrimPrefix(plain.URL, "http://"))
	_, tlsPort, _ := net.SplitHostPort(strings.TrimPrefix(tlsSrv.URL, "https://"))
	f := newProxyFixture(t, map[string]string{"web.example.com": "127.0.0.1", "site.example.com": "127.0.0.1"})
	roots := x509.NewCertPool()
	roots.AddCert(tlsSrv.Certificate())
	c := f.client(roots)

	f.set(t, ModeOpen, nil, nil)
	if code, body, h := get(t, c, "http://web.example.com:"+plainPort+"/"); code != 403 || h.Get(deniedHeader) != "denied private address 127.0.0.1" {
		t.Fatalf("open mode to a private address = %d %q %v", code, body, h)
	}
	f.set(t, ModeAllowlist, []string{"web.example.com", "127.0.0.0/8"}, nil)
	if code, body, _ := get(t, c, "http://web.example.com:"+plainPort+"/x"); code != 200 || body != "plain web.example.com:"+plainPort {
		t.Fatalf("allowed HTTP = %d %q", code, body)
	}
	// localhost-style hosts still need the CIDR: the name alone is not enough.
	f.set(t, ModeAllowlist, []string{"web.example.com"}, nil)
	if code, _, h := get(t, c, "http://web.example.com:"+plainPort+"/"); code != 403 || !strings.Contains(h.Get(deniedHeader), "private address") {
		t.Fatalf("allowed name on a private address = %d %v", code, h)
	}
	f.set(t, ModeAllowlist, []string{"web.example.com:" + tlsPort, "127.0.0.0/8:" + tlsPort}, nil)
	if code, body, _ := get(t, c, "https://web.example.com:"+tlsPort+"/"); code != 200 || body != "tls ok" {
		t.Fatalf("CONNECT = %d %q", code, body)
	}
	if code, _, _ := get(t, c, "http://web.example.com:"+plainPort+"/"); code != 403 {
		t.Fatalf("another port = %d", code)
	}
	// The edit applies to the next connection.
	f.set(t, ModeAllowlist, []string{"*.example.com", "127.0.0.0/8"}, []string{"web.example.com"})
	if code, _, h := get(t, c, "https://web.example.com:"+tlsPort+"/"); code != 0 && h.Get(deniedHeader) == "" {
		t.Fatalf("deny beats allow for CONNECT: %d %v", code, h)
	}
	if code, body, _ := get(t, c, "http://site.example.com:"+plainPort+"/"); code != 200 {
		t.Fatalf("a wildcard entry = %d %q", code, body)
	}
	f.set(t, ModeOff, nil, nil)
	if code, _, h := get(t, c, "http://site.example.com:"+plainPort+"/"); code != 403 || h.Get(deniedHeader) != "denied mode off" {
		t.Fatalf("mode off = %d %v", code, h)
	}
	// A raw CONNECT refusal carries the header on the 403 (curl shows it with -v).
	conn, err := net.Dial("tcp", f.http)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "CONNECT web.example.com:%s HTTP/1.1\r\nHost: web.example.com:%s\r\n\r\n", tlsPort, tlsPort)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	conn.Close()
	if err != nil || resp.StatusCode != 403 || resp.Header.Get(deniedHeader) != "denied mode off" {
		t.Fatalf("raw CONNECT refusal = %v %v", resp, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var denied int
	for _, e := range f.events {
		if !e.Allowed {
			denied++
		}
	}
	if denied < 6 {
		t.Fatalf("refusals observed: %d (%v)", denied, f.events)
	}
}

// TestProxySOCKS: SOCKS5 CONNECT by name and by address follows the policy; a refusal is
// reply 2 (not allowed by ruleset).
func TestProxySOCKS(t *testing.T) {
	t.Parallel()
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	port := echo.Addr().(*net.TCPAddr).Port
	f := newProxyFixture(t, map[string]string{"db.example.com": "127.0.0.1"})
	socks := func(host string) (byte, net.Conn) {
		t.Helper()
		c, err := net.Dial("tcp", f.socks)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte{5, 1, 0})
		var greet [2]byte
		io.ReadFull(c, greet[:])
		req := []byte{5, 1, 0}
		if a, err := netip.ParseAddr(host); err == nil {
			req = append(append(req, 1), a.AsSlice()...)
		} else {
			req = append(append(req, 3, byte(len(host))), host...)
		}
		req = append(req, byte(port>>8), byte(port))
		c.Write(req)
		var rep [10]byte
		if _, err := io.ReadFull(c, rep[:]); err != nil {
			t.Fatalf("socks reply: %v", err)
		}
		return rep[1], c
	}
	f.set(t, ModeAllowlist, []string{"127.0.0.0/8"}, nil)
	code, c := socks("db.example.com")
	if code != 0 {
		t.Fatalf("allowed by name: reply %d", code)
	}
	c.Write([]byte("ping"))
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
		t.Fatalf("echo through SOCKS: %q %v", b, err)
	}
	c.Close()
	f.set(t, ModeOpen, nil, nil)
	if code, c := socks("127.0.0.1"); code != socksNotAllowed {
		t.Fatalf("a private address in open mode: reply %d", code)
	} else {
		c.Close()
	}
	if code, c := socks("nowhere.example.com"); code != socksHostUnreach {
		t.Fatalf("an unknown name: reply %d", code)
	} else {
		c.Close()
	}
}

// TestProxyInjection: a credential declared for a host is added by the proxy, over HTTPS through
// TLS it terminates with the per-install CA; the client never holds it; a request that brings its
// own header for that host is refused; other hosts' TLS is not intercepted (the client sees the
// host's own certificate).
func TestProxyInjection(t *testing.T) {
	t.Parallel()
	api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "auth=%s", r.Header.Get("Authorization"))
	}))
	defer api.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(api.URL, "https://"))
	f := newProxyFixture(t, map[string]string{"api.example.com": "127.0.0.1", "other.example.com": "127.0.0.1"})
	ca, err := NewCA("Berth egress CA (test)")
	if err != nil {
		t.Fatal(err)
	}
	f.p.CA = ca
	upstream := x509.NewCertPool()
	upstream.AddCert(api.Certificate())
	f.p.UpstreamRoots = upstream
	f.set(t, ModeAllowlist, []string{"*.example.com", "127.0.0.0/8"}, nil)
	f.mu.Lock()
	f.policy.Inject = []Injection{{Hosts: rules(t, "api.example.com"), Header: "Authorization", Value: "Bearer s3cret"}}
	f.mu.Unlock()

	jailRoots := x509.NewCertPool()
	jailRoots.AppendCertsFromPEM(ca.CertPEM())
	c := f.client(jailRoots)
	if code, body, _ := get(t, c, "https://api.example.com:"+port+"/v1"); code != 200 || body != "auth=Bearer s3cret" {
		t.Fatalf("injected = %d %q", code, body)
	}
	req, _ := http.NewRequest(http.MethodGet, "https://api.example.com:"+port+"/v1", nil)
	req.Header.Set("Authorization", "Bearer mine")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 || !strings.Contains(resp.Header.Get(deniedHeader), "already carries Authorization") {
		t.Fatalf("own header = %d %v", resp.StatusCode, resp.Header)
	}
	// other.example.com is tunnelled: the jail's trust in the CA does not help, the host's own
	// certificate is what it sees (it does not verify against the CA alone)...
	if code, body, _ := get(t, c, "https://other.example.com:"+port+"/"); code != 0 {
		t.Fatalf("a tunnelled host verified against Berth's CA: %d %q", code, body)
	}
	// ...and with the host's own roots it works, without the credential.
	both := x509.NewCertPool()
	both.AddCert(api.Certificate())
	if code, body, _ := get(t, f.client(both), "https://other.example.com:"+port+"/"); code != 200 || body != "auth=" {
		t.Fatalf("tunnelled = %d %q", code, body)
	}
}
