package handlers

import (
	"net"
	"net/http"
	"strings"
)

// errMisdirected answers a request whose Host is not a name this server answers to.
var errMisdirected = &httpError{Status: http.StatusMisdirectedRequest, Code: "misdirected_request",
	Message: "This server does not answer to that host name. Use the address in BERTH_BASE_URL."}

// hostCheck refuses requests whose Host header does not name BERTH_BASE_URL's host with 421,
// against DNS rebinding: a page on another site whose name the attacker re-points at Berth's
// address would otherwise be same-origin with its own requests. Only the name is compared (the
// attack brings its own name; a port names the listener the connection already reached). When
// the base URL is a loopback name (the default, derived from BERTH_ADDR) the other loopback
// spellings pass too. /api/health is exempt, so load balancers may probe by address.
func (s *Server) hostCheck(next http.Handler) http.Handler {
	allowed := allowedHosts(s.baseURL.Hostname())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/health" && !allowed[requestHostname(r.Host)] {
			s.renderError(w, r, errMisdirected)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// requestHostname is a Host header's name, lowercased, without port or IPv6 brackets.
func requestHostname(hostport string) string {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	return strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
}

// allowedHosts is the set of names that stand for the base URL's host: the host itself, or every
// loopback spelling when it is one of them.
func allowedHosts(host string) map[string]bool {
	host = requestHostname(host)
	switch host {
	case "localhost", "127.0.0.1", "::1":
		return map[string]bool{"localhost": true, "127.0.0.1": true, "::1": true}
	}
	return map[string]bool{host: true}
}
