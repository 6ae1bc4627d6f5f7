package handlers

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// clientAddrKey keys the resolved client address in a request's context.
type clientAddrKey struct{}

// clientAddress resolves the caller's address once per request, for the sign-in throttle, audit
// events and the request log. The TCP peer is the client unless it is a trusted proxy
// (BERTH_TRUSTED_PROXIES); then the client is the rightmost X-Forwarded-For hop that is not a
// trusted proxy, since everything left of that hop is whatever the client chose to send.
func (s *Server) clientAddress(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		addr := forwardedClient(peerAddr(r), r.Header.Values("X-Forwarded-For"), s.proxies)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), clientAddrKey{}, addr)))
	})
}

// clientIP is the caller's address as clientAddress resolved it (the TCP peer outside the
// middleware chain).
func clientIP(r *http.Request) string {
	if a, ok := r.Context().Value(clientAddrKey{}).(string); ok {
		return a
	}
	return peerAddr(r)
}

// peerAddr is the TCP peer's host.
func peerAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// forwardedClient walks X-Forwarded-For from the right while the hop it came from is trusted.
// A malformed entry stops the walk at the last hop known to be real.
func forwardedClient(peer string, xff []string, trusted []netip.Prefix) string {
	if !isTrusted(peer, trusted) {
		return peer
	}
	var hops []string
	for _, h := range xff {
		hops = append(hops, strings.Split(h, ",")...)
	}
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			return client
		}
		client = a.Unmap().String()
		if !isTrusted(client, trusted) {
			return client
		}
	}
	return client
}

func isTrusted(addr string, trusted []netip.Prefix) bool {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return false
	}
	a = a.Unmap()
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
