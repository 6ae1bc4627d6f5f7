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
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// benchProxy is a proxy on loopback whose policy allows loopback by CIDR, with an injection for
// inject.example.com, over upstream.
func benchProxy(b *testing.B, upstream *httptest.Server) (*Proxy, string, string) {
	b.Helper()
	ca, err := NewCA("bench")
	if err != nil {
		b.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(upstream.Certificate())
	allow, _ := ParseRule("127.0.0.0/8")
	host, _ := ParseRule("inject.example.com")
	pol := Policy{Mode: ModeOpen, Allow: []Rule{allow}, Inject: []Injection{{Hosts: []Rule{host}, Header: "Authorization", Value: "Bearer x"}}}
	p := &Proxy{CA: ca, UpstreamRoots: roots,
		Policy: func(context.Context, string) (Policy, error) { return pol, nil },
		Resolve: func(context.Context, string) ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	go p.ServeHTTPProxy(l, "bench")
	return p, l.Addr().String(), string(ca.CertPEM())
}

func p50(d []time.Duration) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[len(d)/2]
}

// BenchmarkEgressConnectSetup: the time from dialing to a usable tunnel through the proxy
// (dial the proxy, CONNECT, the proxy's decision and its own dial, 200) against dialing the host
// directly, alternating; it reports both p50s and what the proxy adds (goal: ≤ 1 ms).
func BenchmarkEgressConnectSetup(b *testing.B) {
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	_, proxyAddr, _ := benchProxy(b, up)
	target := strings.TrimPrefix(up.URL, "https://")
	var direct, proxied []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		c, err := net.Dial("tcp", target)
		if err != nil {
			b.Fatal(err)
		}
		direct = append(direct, time.Since(start))
		c.Close()
		start = time.Now()
		c, err = net.Dial("tcp", proxyAddr)
		if err != nil {
			b.Fatal(err)
		}
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 200 {
			b.Fatalf("CONNECT: %v %v", resp, err)
		}
		proxied = append(proxied, time.Since(start))
		c.Close()
	}
	b.StopTimer()
	d, p := p50(direct), p50(proxied)
	b.ReportMetric(float64(d.Microseconds())/1000, "direct-p50-ms")
	b.ReportMetric(float64(p.Microseconds())/1000, "proxy-p50-ms")
	b.ReportMetric(float64((p-d).Microseconds())/1000, "added-p50-ms")
}

// BenchmarkEgressDownload: a 200 MB HTTPS download through a CONNECT tunnel against the same
// download direct, each run twice, alternating; it reports MB/s and their ratio (goal ≥ 0.9×).
func BenchmarkEgressDownload(b *testing.B) {
	const size = 200 << 20
	chunk := make([]byte, 1<<20)
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(size))
		for n := 0; n < size; n += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	defer up.Close()
	_, proxyAddr, _ := benchProxy(b, up)
	roots := x509.NewCertPool()
	roots.AddCert(up.Certificate())
	pu, _ := url.Parse("http://" + proxyAddr)
	get := func(proxy bool) time.Duration {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, DisableKeepAlives: true}
		if proxy {
			tr.Proxy = http.ProxyURL(pu)
		}
		start := time.Now()
		resp, err := (&http.Client{Transport: tr}).Get(up.URL)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != size {
			b.Fatalf("download: %d bytes, %v", n, err)
		}
		return time.Since(start)
	}
	var direct, proxied time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for range 2 {
			direct += get(false)
			proxied += get(true)
		}
	}
	b.StopTimer()
	mb := float64(size) / (1 << 20) * float64(2*b.N)
	b.ReportMetric(mb/direct.Seconds(), "direct-MBps")
	b.ReportMetric(mb/proxied.Seconds(), "proxy-MBps")
	b.ReportMetric(direct.Seconds()/proxied.Seconds(), "ratio")
}

// BenchmarkEgressInjected: one HTTPS request on a kept-alive connection, through the proxy with
// a credential injected (TLS terminated at the proxy) against direct; it reports the p50s and
// what the proxy adds (goal: ≤ 2 ms).
func BenchmarkEgressInjected(b *testing.B) {
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "" && r.Host == "inject.example.com" {
			http.Error(w, "no credential", 401)
		}
	}))
	defer up.Close()
	_, proxyAddr, caPEM := benchProxy(b, up)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(up.URL, "https://"))
	upRoots := x509.NewCertPool()
	upRoots.AddCert(up.Certificate())
	jailRoots := x509.NewCertPool()
	jailRoots.AppendCertsFromPEM([]byte(caPEM))
	pu, _ := url.Parse("http://" + proxyAddr)
	direct := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: upRoots}}}
	proxied := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu), TLSClientConfig: &tls.Config{RootCAs: jailRoots}}}
	do := func(c *http.Client, u string) time.Duration {
		start := time.Now()
		resp, err := c.Get(u)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
		return time.Since(start)
	}
	injectedURL := "https://inject.example.com:" + port + "/"
	do(direct, up.URL) // warm both connections up
	do(proxied, injectedURL)
	var ds, ps []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ds = append(ds, do(direct, up.URL))
		ps = append(ps, do(proxied, injectedURL))
	}
	b.StopTimer()
	d, p := p50(ds), p50(ps)
	b.ReportMetric(float64(d.Microseconds())/1000, "direct-p50-ms")
	b.ReportMetric(float64(p.Microseconds())/1000, "injected-p50-ms")
	b.ReportMetric(float64((p-d).Microseconds())/1000, "added-p50-ms")
}

// BenchmarkEgressConcurrentTunnels: 1,000 tunnels open at once through one proxy, each echoing a
// message; it reports how many failed (goal: 0).
func BenchmarkEgressConcurrentTunnels(b *testing.B) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
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
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	_, proxyAddr, _ := benchProxy(b, up)
	target := echo.Addr().String()
	const n = 1000
	var failed atomic.Int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var wg sync.WaitGroup
		opened := make(chan net.Conn, n)
		var ready sync.WaitGroup
		ready.Add(n)
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := net.DialTimeout("tcp", proxyAddr, 30*time.Second)
				if err != nil {
					failed.Add(1)
					ready.Done()
					return
				}
				fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
				br := bufio.NewReader(c)
				resp, err := http.ReadResponse(br, nil)
				if err != nil || resp.StatusCode != 200 {
					failed.Add(1)
					c.Close()
					ready.Done()
					return
				}
				opened <- c
				ready.Done()
				ready.Wait() // every tunnel is open at the same time
				msg := "ping through the tunnel\n"
				io.WriteString(c, msg)
				got, err := br.ReadString('\n')
				if err != nil || got != msg {
					failed.Add(1)
				}
			}()
		}
		wg.Wait()
		close(opened)
		for c := range opened {
			c.Close()
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(n), "tunnels")
	b.ReportMetric(float64(failed.Load()), "failed")
}
