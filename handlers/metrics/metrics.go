// Package metrics is one process's Prometheus registry (docs/metrics.md lists the series): the
// Go and process collectors, the HTTP request histogram, run admission and egress refusals, which
// the job workers and the egress proxy observe, and the series read at scrape time (database
// counts through db.MetricCounts, pool statistics, live terminals). It owns no HTTP route:
// handlers serves GET /metrics from Handler and decides who may read it. It may read db; it
// imports nothing of handlers or jobs.
package metrics

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Registry is one process's registry. Nothing is registered globally: each Registry is its own.
type Registry struct {
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
func (m *Registry) EgressDeniedInc(environment, reason string) {
	m.EgressDenied.WithLabelValues(environment, reason).Inc()
}

// New makes a registry with the process-wide series.
func New() *Registry {
	m := &Registry{
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

// Handler is the Prometheus text exposition of the registry.
func (m *Registry) Handler() http.Handler { return m.handler }

// ObserveRequest counts one HTTP request of route (a route pattern, never a raw path), method and
// status code that took d.
func (m *Registry) ObserveRequest(route, method string, code int, d time.Duration) {
	m.requests.WithLabelValues(route, method, strconv.Itoa(code)).Observe(d.Seconds())
}

// AddServer registers the series a web server's scrape reads: the database counts and pool
// statistics of pool, and terminals (live setup shells on this node; nil reads 0).
func (m *Registry) AddServer(pool *pgxpool.Pool, log *slog.Logger, terminals func() int) error {
	err := errors.Join(
		m.reg.Register(&dbCollector{pool: pool, log: log}),
		m.reg.Register(poolCollector{pool: pool}),
		m.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
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
		return fmt.Errorf("metrics: %w", err)
	}
	return nil
}
