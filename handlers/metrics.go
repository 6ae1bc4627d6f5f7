package handlers

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"berth/db"
	"berth/handlers/metrics"
)

// metricsPath is where GET /metrics answers (routes.go).
const metricsPath = "/metrics"

// metricsTokenKey marks a request that presented BERTH_METRICS_TOKEN.
type metricsTokenKey struct{}

// initMetrics registers the scrape-time series of this server on its registry (d.Metrics, or a
// new one) and keeps the metrics token's digest.
func (s *Server) initMetrics(d Deps) error {
	s.metrics = d.Metrics
	if s.metrics == nil {
		s.metrics = metrics.New()
	}
	if d.MetricsToken != "" {
		sum := sha256.Sum256([]byte(d.MetricsToken))
		s.metricsToken = sum[:]
	}
	var terminals func() int
	if d.ImageSetup != nil && d.ImageSetup.Terminals != nil {
		terminals = d.ImageSetup.Terminals.LiveShells
	}
	return s.metrics.AddServer(s.pool, s.log, terminals)
}

// metricsEndpoint is GET /metrics: the Prometheus text exposition, for instance admins (session
// or API token) and the bearer BERTH_METRICS_TOKEN. Anyone else gets the same 404 as for a page
// that does not exist: the endpoint does not admit it is there.
func (s *Server) metricsEndpoint(w http.ResponseWriter, r *http.Request) error {
	p := principalFrom(r.Context())
	admin := p != nil && p.Run == nil && p.User.IsInstanceAdmin
	if token, _ := r.Context().Value(metricsTokenKey{}).(bool); !admin && !token {
		return errNotFound
	}
	s.metrics.Handler().ServeHTTP(w, r)
	return nil
}

// metricsAuth runs before identify for GET /metrics with a bearer token. The metrics token is not
// an API token (identify would refuse it with 401), so it is recognised here, in constant time,
// and the request goes on without it, marked. Any other bearer token there that identify would
// refuse is the endpoint's usual 404, so a scraper with a wrong token learns nothing.
func (s *Server) metricsAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		authz := r.Header.Get("Authorization")
		if r.URL.Path != metricsPath || authz == "" {
			next.ServeHTTP(w, r)
			return
		}
		token, ok := strings.CutPrefix(authz, "Bearer ")
		token = strings.TrimSpace(token)
		if ok && s.isMetricsToken(token) {
			r = r.Clone(context.WithValue(r.Context(), metricsTokenKey{}, true))
			r.Header.Del("Authorization")
			next.ServeHTTP(w, r)
			return
		}
		if !ok || token == "" {
			s.renderError(w, r, errNotFound)
			return
		}
		if _, err := s.tokenPrincipal(r.Context(), r, db.HashToken(token)); err != nil {
			if he, _ := classify(err); he.Status == http.StatusUnauthorized {
				err = errNotFound
			}
			s.renderError(w, r, err)
			return
		}
		next.ServeHTTP(w, r) // a valid token: identify resolves it again, metricsEndpoint decides
	})
}

// isMetricsToken compares digests, so neither the token's bytes nor its length leak through
// timing.
func (s *Server) isMetricsToken(token string) bool {
	if len(s.metricsToken) == 0 {
		return false
	}
	sum := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(sum[:], s.metricsToken) == 1
}
