package metrics

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"berth/db"
)

// metricsQueryTimeout bounds the scrape-time database query: a slow database makes a scrape
// report berth_metrics_db_up 0, never hang.
const metricsQueryTimeout = 2 * time.Second

var (
	descRuns   = prometheus.NewDesc("berth_runs", "Runs by status (all companies).", []string{"status"}, nil)
	descLeases = prometheus.NewDesc("berth_leases", "Environment leases by status (all companies).",
		[]string{"status"}, nil)
	descLeaseHeartbeatAge = prometheus.NewDesc("berth_lease_heartbeat_age_seconds",
		"Seconds since the stalest active lease's last heartbeat (its creation if none yet); 0 with no active lease.", nil, nil)
	descJobs = prometheus.NewDesc("berth_jobs", "River jobs in the river_job table by kind and state.",
		[]string{"kind", "state"}, nil)
	descServices = prometheus.NewDesc("berth_runtime_services", "Runtime services by status and health.",
		[]string{"status", "health"}, nil)
	descDBUp = prometheus.NewDesc("berth_metrics_db_up",
		"1 when this scrape's database query succeeded; 0 when it failed or timed out (the database series are then absent).", nil, nil)
)

// dbCollector reads the database-backed gauges at scrape time in one query (db.MetricCounts).
type dbCollector struct {
	pool *pgxpool.Pool
	log  *slog.Logger
}

// Describe sends the series' descriptions.
func (c *dbCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRuns, descLeases, descLeaseHeartbeatAge, descJobs, descServices, descDBUp} {
		ch <- d
	}
}

// Collect runs the query, bounded by metricsQueryTimeout.
func (c *dbCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), metricsQueryTimeout)
	defer cancel()
	counts, err := db.MetricCounts(ctx, c.pool)
	if err != nil {
		c.log.Warn("metrics: database counts", "err", err)
		ch <- prometheus.MustNewConstMetric(descDBUp, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(descDBUp, prometheus.GaugeValue, 1)
	for _, m := range counts {
		switch m.Series {
		case db.MetricRuns:
			ch <- prometheus.MustNewConstMetric(descRuns, prometheus.GaugeValue, m.Value, m.Label1)
		case db.MetricLeases:
			ch <- prometheus.MustNewConstMetric(descLeases, prometheus.GaugeValue, m.Value, m.Label1)
		case db.MetricLeaseHeartbeatAge:
			ch <- prometheus.MustNewConstMetric(descLeaseHeartbeatAge, prometheus.GaugeValue, m.Value)
		case db.MetricJobs:
			ch <- prometheus.MustNewConstMetric(descJobs, prometheus.GaugeValue, m.Value, m.Label1, m.Label2)
		case db.MetricRuntimeServices:
			ch <- prometheus.MustNewConstMetric(descServices, prometheus.GaugeValue, m.Value, m.Label1, m.Label2)
		}
	}
}

// poolDesc is one berth_db_pool_* series and how it reads pgxpool's statistics.
type poolDesc struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(*pgxpool.Stat) float64
}

func newPoolDesc(name, help string, kind prometheus.ValueType, value func(*pgxpool.Stat) float64) poolDesc {
	return poolDesc{desc: prometheus.NewDesc("berth_db_pool_"+name, help, nil, nil), kind: kind, value: value}
}

var poolDescs = []poolDesc{
	newPoolDesc("acquired_conns", "Connections checked out of the pool now.", prometheus.GaugeValue,
		func(s *pgxpool.Stat) float64 { return float64(s.AcquiredConns()) }),
	newPoolDesc("idle_conns", "Idle connections in the pool now.", prometheus.GaugeValue,
		func(s *pgxpool.Stat) float64 { return float64(s.IdleConns()) }),
	newPoolDesc("constructing_conns", "Connections being opened now.", prometheus.GaugeValue,
		func(s *pgxpool.Stat) float64 { return float64(s.ConstructingConns()) }),
	newPoolDesc("total_conns", "Connections in the pool now (acquired, idle and constructing).", prometheus.GaugeValue,
		func(s *pgxpool.Stat) float64 { return float64(s.TotalConns()) }),
	newPoolDesc("max_conns", "The pool's connection limit.", prometheus.GaugeValue,
		func(s *pgxpool.Stat) float64 { return float64(s.MaxConns()) }),
	newPoolDesc("acquires_total", "Successful connection acquisitions.", prometheus.CounterValue,
		func(s *pgxpool.Stat) float64 { return float64(s.AcquireCount()) }),
	newPoolDesc("acquire_duration_seconds_total", "Total time spent acquiring connections.", prometheus.CounterValue,
		func(s *pgxpool.Stat) float64 { return s.AcquireDuration().Seconds() }),
	newPoolDesc("empty_acquires_total", "Acquisitions that had to wait for a connection (none was idle).", prometheus.CounterValue,
		func(s *pgxpool.Stat) float64 { return float64(s.EmptyAcquireCount()) }),
	newPoolDesc("canceled_acquires_total", "Acquisitions whose context ended while waiting for a connection.", prometheus.CounterValue,
		func(s *pgxpool.Stat) float64 { return float64(s.CanceledAcquireCount()) }),
}

// poolCollector reports the pgx pool's statistics at scrape time (no query).
type poolCollector struct{ pool *pgxpool.Pool }

// Describe sends the series' descriptions.
func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range poolDescs {
		ch <- d.desc
	}
}

// Collect reads one snapshot of the pool's statistics.
func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.pool.Stat()
	for _, d := range poolDescs {
		ch <- prometheus.MustNewConstMetric(d.desc, d.kind, d.value(st))
	}
}
