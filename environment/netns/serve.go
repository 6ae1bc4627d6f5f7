package netns

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"
)

// Egress serves the egress proxy on listeners in a workspace's namespace (package egress): an
// HTTP forward and CONNECT proxy on one, SOCKS5 on the other, for the jails of key.
type Egress interface {
	ServeHTTPProxy(l net.Listener, key string)
	ServeSOCKS(l net.Listener, key string)
}

// Serve is the Setup of a node: in every workspace namespace, Berth's API bridged to api (this
// node's or a web node's base URL) at APIAddr, and the egress proxy at ProxyAddr and SocksAddr
// (none when egress is nil: every connection out is refused).
func Serve(api *url.URL, egress Egress) Setup {
	bridge := APIBridge(api)
	return func(key string, ns *Namespace) (io.Closer, error) {
		var ls listeners
		for _, addr := range []string{APIAddr, ProxyAddr, SocksAddr} {
			l, err := ns.Listen("tcp", addr)
			if err != nil {
				ls.Close()
				return nil, err
			}
			ls = append(ls, l)
		}
		srv := &http.Server{Handler: bridge, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
		go srv.Serve(ls[0]) //nolint:errcheck // ends when the listener closes
		if egress != nil {
			go egress.ServeHTTPProxy(ls[1], key)
			go egress.ServeSOCKS(ls[2], key)
		} else {
			go refuseAll(ls[1])
			go refuseAll(ls[2])
		}
		return ls, nil
	}
}

type listeners []net.Listener

func (ls listeners) Close() error {
	var errs []error
	for _, l := range ls {
		errs = append(errs, l.Close())
	}
	return errors.Join(errs...)
}

func refuseAll(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		c.Close()
	}
}

// APIBridge is what a jail reaches at BERTH_API_URL: Berth's JSON API and MCP endpoint (/api/…,
// /mcp), nothing else of Berth (no pages, previews, events, metrics or internal routes), proxied
// to target. Cookies never cross it: a run authenticates with its run token.
func APIBridge(target *url.URL) http.Handler {
	if target == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "Berth's API is not reachable from this node", http.StatusServiceUnavailable)
		})
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = target.Host
			pr.Out.Header.Del("Cookie")
		},
		FlushInterval: -1,
		Transport:     &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16, IdleConnTimeout: 90 * time.Second},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if !strings.HasPrefix(p, "/api/") && p != "/mcp" && !strings.HasPrefix(p, "/mcp/") {
			http.NotFound(w, r)
			return
		}
		rp.ServeHTTP(w, r)
	})
}
