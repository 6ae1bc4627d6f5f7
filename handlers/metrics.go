package handlers

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"berth/db"
)

// metricsPath is where GET /metrics answers (routes.go).
const metricsPath = "/metrics"

// Metrics is one process's Prometheus registry: the Go and process collectors, the HTTP request
// histogram, and the run admission histogram the job workers observe. New adds the series read
// at scrape time (database counts, pool statistics, terminal sessions). Nothing is registered
// globally: each Metrics is its own registry (docs/metrics.md lists the series).
type Metrics struct {
	reg      *prometheus.Registry
	handler  http.Handler // the exposition of reg
	requests *prometheus.HistogramVec
	// RunAdmission observes, in seconds, how long a run waited from its creation (admission) to
	// the start of its command; give it to jobs.Deps.Admission on the node that runs the workers.
	RunAdmission prometheus.Histogram
	// EgressDenied counts connections the egress proxy refused, by environment and reason class
	// (berth_egress_denied_total); give EgressDeniedInc to jobs.Egress.Denied.
	EgressDenied *prometheus.CounterVec
}

// EgressDeniedInc counts one refused connection of environment, for reason.
func (m *Metrics) EgressDeniedInc(environment, reason string) {
	m.EgressDenied.WithLabelValues(environment, reason).Inc()
}

// NewMetrics makes a registry with the process-wide series.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "berth_http_request_duration_seconds",
			Help:    "HTTP requests by route pattern (\"unmatched\" when none), method and status code.",
			Buckets: prometheus.DefBuckets,
		}, []string{"route", "method", "code"}),
		RunAdmission: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "berth_run_admission_to_start_seconds",
			Help:    "Time from a run's creation to the start of its command, observed when it starts.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600},
		}),
		EgressDenied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_egress_denied_total",
			Help: "Connections the egress proxy refused, by environment id and reason (deny, private_address, not_on_the_allowlist, mode_off, no_address, request_already_carries, other).",
		}, []string{"environment", "reason"}),
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.requests,
		m.RunAdmission,
		m.EgressDenied,
	)
	m.handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	return m
}

// metricsTokenKey marks a request that presented BERTH_METRICS_TOKEN.
type metricsTokenKey struct{}

// initMetrics registers the scrape-time collectors of this server on its registry (d.Metrics,
// or a new one) and keeps the metrics token's digest.
func (s *Server) initMetrics(d Deps) error {
	s.metrics = d.Metrics
	if s.metrics == nil {
		s.metrics = NewMetrics()
	}
	if d.MetricsToken != "" {
		sum := sha256.Sum256([]byte(d.MetricsToken))
		s.metricsToken = sum[:]
	}
	var terminals func() int
	if d.ImageSetup != nil && d.ImageSetup.Terminals != nil {
		terminals = d.ImageSetup.Terminals.LiveShells
	}
	err := errors.Join(
		s.metrics.reg.Register(&dbCollector{pool: s.pool, log: s.log}),
		s.metrics.reg.Register(poolCollector{pool: s.pool}),
		s.metrics.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "berth_terminal_sessions",
			Help: "Image setup sessions with a shell running on this node.",
		}, func() float64 {
			if terminals == nil {
				return 0
			}
			return float64(terminals())
		})),
	)
	if err != nil {
		return fmt.Errorf("handlers: metrics: %w", err)
	}
	return nil
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
	s.metrics.handler.ServeHTTP(w, r)
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
