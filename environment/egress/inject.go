package egress

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Injection is a credential the proxy adds to requests for its hosts: Header set to Value (the
// secret already put into its format). The secret never enters the jail: not its environment,
// files or process arguments. A request that already carries Header for such a host is refused,
// so a run cannot replace the credential with its own.
type Injection struct {
	Hosts  []Rule // domain patterns (CIDRs are not accepted for injection)
	Header string // e.g. Authorization
	Value  string // e.g. "Bearer <secret>"
}

// injectionFor is the injection whose hosts name host, if any.
func (p Policy) injectionFor(host string) (Injection, bool) {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, in := range p.Inject {
		for _, r := range in.Hosts {
			if r.Domain != "" && (r.Wild && strings.HasSuffix(host, "."+r.Domain) || !r.Wild && host == r.Domain) {
				return in, true
			}
		}
	}
	return Injection{}, false
}

// CA is a per-install certificate authority: the jail trusts its certificate, and the proxy signs
// a certificate for each injected host with it, so TLS to exactly those hosts ends at the proxy.
// Every other host's TLS passes through untouched.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// NewCA makes a CA: an ECDSA P-256 key and a self-signed certificate valid for 10 years.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("egress ca: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("egress ca: %w", err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: name, Organization: []string{"Berth"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().AddDate(10, 0, 0), IsCA: true, BasicConstraintsValid: true,
		MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("egress ca: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("egress ca: %w", err)
	}
	return LoadCA(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
}

// LoadCA reads a CA from its certificate and key (PEM).
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("egress ca: not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("egress ca: %w", err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("egress ca: %w", err)
	}
	return &CA{cert: cert, key: key, pem: certPEM, leaves: map[string]*tls.Certificate{}}, nil
}

// CertPEM is the CA's certificate, which the jail trusts.
func (ca *CA) CertPEM() []byte { return ca.pem }

// KeyPEM is the CA's private key (the caller seals it at rest).
func (ca *CA) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(ca.key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// leaf is the certificate for host, made on first use and kept (valid one day, renewed after
// half of it).
func (ca *CA) leaf(host string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[host]; ok && time.Until(c.Leaf.NotAfter) > 12*time.Hour {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key, Leaf: leaf}
	ca.leaves[host] = c
	return c, nil
}

// mitm answers a CONNECT to an injected host: TLS from the jail ends here with a certificate of
// the CA, each request gets the credential and goes on over TLS to the host itself (verified as
// usual), its response comes back. Requests are read one after another (HTTP/1.1 keep-alive);
// whatever the request's Host says, it goes to the host the CONNECT named and was decided for.
func (p *Proxy) mitm(w http.ResponseWriter, r *http.Request, host string, port int, d Decision, inj Injection) {
	leaf, err := p.CA.leaf(host)
	if err != nil {
		http.Error(w, "egress: no certificate for the host", http.StatusBadGateway)
		return
	}
	client, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer client.Close()
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		return
	}
	var in net.Conn = client
	if n := buf.Reader.Buffered(); n > 0 {
		b, _ := buf.Reader.Peek(n)
		in = &prefixConn{Conn: client, prefix: b}
	}
	tc := tls.Server(in, &tls.Config{Certificates: []tls.Certificate{*leaf}, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
	if err := tc.HandshakeContext(r.Context()); err != nil {
		return
	}
	authority := net.JoinHostPort(host, fmt.Sprint(port))
	hostHeader := host // what a client sends for the default port
	if port != 443 {
		hostHeader = authority
	}
	up := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 4, IdleConnTimeout: 90 * time.Second, ForceAttemptHTTP2: false,
		TLSClientConfig: &tls.Config{ServerName: host, RootCAs: p.UpstreamRoots, MinVersion: tls.VersionTLS12},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return p.dialAddrs(ctx, d.Addrs, port)
		}}
	defer up.CloseIdleConnections()
	br := bufio.NewReader(tc)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if req.Header.Get(inj.Header) != "" {
			resp := &http.Response{StatusCode: http.StatusForbidden, ProtoMajor: 1, ProtoMinor: 1, Request: req,
				Header: http.Header{deniedHeader: {"denied request already carries " + inj.Header}}, Close: true,
				Body: io.NopCloser(strings.NewReader("egress denied: the request already carries " + inj.Header + "\n"))}
			_ = resp.Write(tc)
			return
		}
		req.URL.Scheme, req.URL.Host, req.Host, req.RequestURI = "https", authority, hostHeader, ""
		req.Header.Set(inj.Header, inj.Value)
		req.Header.Del("Proxy-Authorization")
		resp, err := up.RoundTrip(req.WithContext(r.Context()))
		if err != nil {
			resp = &http.Response{StatusCode: http.StatusBadGateway, ProtoMajor: 1, ProtoMinor: 1, Request: req, Close: true,
				Header: http.Header{}, Body: io.NopCloser(strings.NewReader("egress: the host did not answer\n"))}
		}
		err = resp.Write(tc)
		resp.Body.Close()
		if err != nil || resp.Close || req.Close {
			return
		}
	}
}

// prefixConn reads prefix before the connection's own bytes (what the HTTP server had buffered
// past the CONNECT request).
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(b []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(b, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}
