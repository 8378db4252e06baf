package api

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are cube-api's Prometheus metrics (GET /metrics).
type metrics struct {
	reg       *prometheus.Registry
	requests  *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	snapshots *prometheus.HistogramVec
	rollbacks *prometheus.HistogramVec
	handler   http.Handler
}

// sandboxCollector counts the sandboxes by state at each scrape.
type sandboxCollector struct {
	s    *Server
	desc *prometheus.Desc
}

func (c sandboxCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c sandboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cs, err := c.s.be.List(ctx)
	if err != nil {
		c.s.log.WithError(err).Warn("metrics: list sandboxes")
		return
	}
	n := map[string]int{"running": 0, "paused": 0}
	for _, ct := range cs {
		n[stateOf(ct.Status)]++
	}
	for st, v := range n {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(v), st)
	}
}

func newMetrics(s *Server) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cube_api_requests_total", Help: "HTTP requests by route and status code.",
	}, []string{"route", "code"})
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "cube_api_request_duration_seconds", Help: "HTTP request latency by route (a command's stream until its end).",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	}, []string{"route"})
	m.snapshots = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "cube_api_snapshot_duration_seconds", Help: "Snapshots taken through the API, by result.",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
	}, []string{"result"})
	m.rollbacks = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "cube_api_rollback_duration_seconds", Help: "Rollbacks done through the API, by result.",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
	}, []string{"result"})
	m.reg.MustRegister(m.requests, m.latency, m.snapshots, m.rollbacks,
		sandboxCollector{s: s, desc: prometheus.NewDesc("cube_api_sandboxes", "Sandboxes by state.", []string{"state"}, nil)},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
	return m
}

func (m *metrics) observe(route string, code int, d time.Duration) {
	if code == 0 {
		code = http.StatusOK
	}
	m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
	m.latency.WithLabelValues(route).Observe(d.Seconds())
}

func (m *metrics) snapshot(err error, d time.Duration) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.snapshots.WithLabelValues(result).Observe(d.Seconds())
}

func (m *metrics) rollback(err error, d time.Duration) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.rollbacks.WithLabelValues(result).Observe(d.Seconds())
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) error {
	s.metrics.handler.ServeHTTP(w, r)
	return nil
}
