package egress

import (
	"bufio"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Why Berth writes its own proxy rather than wrapping goproxy or a SOCKS5 server package: every
// connection must be decided by the jail's policy after Berth resolved the name itself, and then
// dialed to one of exactly the addresses that passed (no second resolution), which those
// packages leave to a resolver and a dialer they call separately; and the data path must stay
// plain *net.TCPConn to *net.TCPConn so the kernel splices tunnels (the throughput figure of
// docs/network.md). The protocols needed are small: HTTP/1.1 forward and CONNECT (net/http does
// the parsing) and SOCKS5 CONNECT without authentication (RFC 1928, socks.go).

// Event is one connection the proxy decided, for the run's log, the ledger, audit and metrics.
type Event struct {
	Via      string // "http", "connect" or "socks"
	Host     string
	Port     int
	Allowed  bool
	Rule     string // why (Decision.Rule)
	Injected bool   // a credential was added to it
}

// Proxy is one node's egress proxy; a listener in each workspace namespace is served with the
// workspace's key, and Policy maps the key to its environment's policy.
type Proxy struct {
	// Policy is the policy for the jails of key, looked up for every new connection.
	Policy func(ctx context.Context, key string) (Policy, error)
	// Resolve resolves a name (nil: the system resolver).
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// Dial connects to a checked address (nil: a net.Dialer in Berth's own network).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Observe, when set, hears of every decided connection.
	Observe func(key string, e Event)
	// CA signs the certificates of hosts whose requests get a credential (inject.go).
	CA *CA
	// UpstreamRoots verify injected hosts' own certificates (nil: the system's roots).
	UpstreamRoots *x509.CertPool

	once      sync.Once
	transport *http.Transport
}

// dialTimeout bounds a connection to an upstream host.
const dialTimeout = 15 * time.Second

type decisionKey struct{}

func (p *Proxy) init() {
	p.once.Do(func() {
		p.transport = &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16, IdleConnTimeout: 90 * time.Second,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				d, _ := ctx.Value(decisionKey{}).(dialPlan)
				if len(d.addrs) == 0 {
					return nil, errors.New("egress: no decided address")
				}
				return p.dialAddrs(ctx, d.addrs, d.port)
			}}
	})
}

// dialPlan is a decision's addresses and port, carried to the transport's dial.
type dialPlan struct {
	addrs []netip.Addr
	port  int
}

// decide resolves host (unless it is an IP literal) and applies key's policy.
func (p *Proxy) decide(ctx context.Context, key, host string, port int) (Decision, Policy) {
	pol, err := p.Policy(ctx, key)
	if err != nil {
		return Decision{Rule: "policy unavailable"}, Policy{}
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	if pol.Mode == ModeOff || pol.Mode == "" {
		return Decision{Rule: "mode off"}, pol
	}
	var addrs []netip.Addr
	if a, ok := literalAddr(host); ok {
		addrs = []netip.Addr{a}
	} else if validDomain(host) {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		addrs, err = p.resolve(rctx, host)
		cancel()
		if err != nil || len(addrs) == 0 {
			return Decision{Rule: "no address"}, pol
		}
	} else {
		return Decision{Rule: "not a host name"}, pol
	}
	return pol.Decide(host, port, addrs), pol
}

func (p *Proxy) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if p.Resolve != nil {
		return p.Resolve(ctx, host)
	}
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// dialAddrs connects to the first of addrs that answers on port.
func (p *Proxy) dialAddrs(ctx context.Context, addrs []netip.Addr, port int) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	dial := p.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	var errs []error
	for _, a := range addrs {
		c, err := dial(ctx, "tcp", netip.AddrPortFrom(a, uint16(port)).String())
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func (p *Proxy) observe(key string, e Event) {
	if p.Observe != nil {
		p.Observe(key, e)
	}
}

// ServeHTTPProxy serves the HTTP forward proxy and CONNECT on l for the jails of key, until l is
// closed.
func (p *Proxy) ServeHTTPProxy(l net.Listener, key string) {
	p.init()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { p.serveHTTP(w, r, key) }),
		ReadHeaderTimeout: 30 * time.Second}
	_ = srv.Serve(l)
}

// deniedHeader carries a refusal's reason to the client.
const deniedHeader = "X-Berth-Egress"

func (p *Proxy) refuse(w http.ResponseWriter, key string, e Event) {
	p.observe(key, e)
	w.Header().Set(deniedHeader, "denied "+e.Rule)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusForbidden)
	fmt.Fprintf(w, "egress denied: %s:%d (%s)\n", e.Host, e.Port, e.Rule)
}

func (p *Proxy) serveHTTP(w http.ResponseWriter, r *http.Request, key string) {
	ctx := r.Context()
	if r.Method == http.MethodConnect {
		host, port, err := splitHostPort(r.Host, 443)
		if err != nil {
			http.Error(w, "CONNECT needs host:port", http.StatusBadRequest)
			return
		}
		d, pol := p.decide(ctx, key, host, port)
		e := Event{Via: "connect", Host: host, Port: port, Allowed: d.Allowed, Rule: d.Rule}
		if !d.Allowed {
			p.refuse(w, key, e)
			return
		}
		if inj, ok := pol.injectionFor(host); ok && p.CA != nil {
			e.Injected = true
			p.observe(key, e)
			p.mitm(w, r, host, port, d, inj)
			return
		}
		p.observe(key, e)
		p.tunnel(w, d, port)
		return
	}
	if r.URL.Host == "" || !r.URL.IsAbs() {
		http.Error(w, "This is Berth's egress proxy: send absolute-URI requests or CONNECT.", http.StatusBadRequest)
		return
	}
	if r.URL.Scheme != "http" {
		http.Error(w, "Only http:// is forwarded as a request; use CONNECT for https.", http.StatusBadRequest)
		return
	}
	host, port, err := splitHostPort(r.URL.Host, 80)
	if err != nil {
		http.Error(w, "bad host", http.StatusBadRequest)
		return
	}
	d, pol := p.decide(ctx, key, host, port)
	e := Event{Via: "http", Host: host, Port: port, Allowed: d.Allowed, Rule: d.Rule}
	if !d.Allowed {
		p.refuse(w, key, e)
		return
	}
	inj, injected := pol.injectionFor(host)
	if injected && r.Header.Get(inj.Header) != "" {
		p.refuse(w, key, Event{Via: "http", Host: host, Port: port, Rule: "request already carries " + inj.Header})
		return
	}
	e.Injected = injected
	p.observe(key, e)
	rp := &httputil.ReverseProxy{Transport: p.transport, FlushInterval: -1,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = r.URL
			pr.Out.Host = r.URL.Host
			pr.Out.Header.Del("Proxy-Authorization")
			pr.Out.Header.Del("Proxy-Connection")
			if injected {
				pr.Out.Header.Set(inj.Header, inj.Value)
			}
			pr.Out = pr.Out.WithContext(context.WithValue(pr.Out.Context(), decisionKey{}, dialPlan{addrs: d.Addrs, port: port}))
		}}
	rp.ServeHTTP(w, r)
}

// tunnel answers an allowed CONNECT and copies bytes both ways until either side closes.
func (p *Proxy) tunnel(w http.ResponseWriter, d Decision, port int) {
	up, err := p.dialAddrs(context.Background(), d.Addrs, port)
	if err != nil {
		http.Error(w, "egress: the host did not answer", http.StatusBadGateway)
		return
	}
	client, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		up.Close()
		return
	}
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		client.Close()
		up.Close()
		return
	}
	pipe(client, buf.Reader, up)
}

// downBuffers hold the upstream→client copies. That direction is copied through user space
// rather than spliced: on loopback splice(2) wakes the reader per small chunk and measured
// 0.65–0.74× a direct download, a 64 KiB buffer 0.92–0.99× (BenchmarkEgressDownload). The
// client→upstream direction (requests, uploads) stays spliced and holds no buffer.
var downBuffers = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

// pipe copies client↔up (bytes the client sent ahead first) and closes both when done.
func pipe(client net.Conn, ahead *bufio.Reader, up net.Conn) {
	if n := ahead.Buffered(); n > 0 {
		b, _ := ahead.Peek(n)
		if _, err := up.Write(b); err != nil {
			client.Close()
			up.Close()
			return
		}
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, client); closeWrite(up); done <- struct{}{} }()
	go func() {
		buf := downBuffers.Get().(*[]byte)
		_, _ = io.CopyBuffer(struct{ io.Writer }{client}, struct{ io.Reader }{up}, *buf)
		downBuffers.Put(buf)
		closeWrite(client)
		done <- struct{}{}
	}()
	<-done
	<-done
	client.Close()
	up.Close()
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}

// splitHostPort splits "host[:port]" (IPv6 in brackets), defaulting the port.
func splitHostPort(hp string, def int) (string, int, error) {
	host, ps, err := net.SplitHostPort(hp)
	if err != nil {
		if strings.Contains(err.Error(), "missing port") {
			return strings.Trim(hp, "[]"), def, nil
		}
		return "", 0, err
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", ps)
	}
	return host, port, nil
}
