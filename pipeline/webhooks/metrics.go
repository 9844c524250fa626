package webhooks

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

type metrics struct {
	deliveries     *prometheus.CounterVec // outcome
	latency        prometheus.Histogram
	requestSeconds prometheus.Histogram
	disabled       prometheus.Counter
	breakerOpen    prometheus.Counter
	batchSize      prometheus.Histogram
	fanouts        *prometheus.CounterVec // outcome
	capped         prometheus.Gauge
	retained       *prometheus.CounterVec // table
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		deliveries:     f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_webhooks_deliveries_total", Help: "Webhook delivery attempts by outcome: delivered, failed (will retry), dead (permanent refusal, 410, out of attempts, subscription gone), skipped (already delivered), deferred-breaker (the endpoint's circuit breaker is open), deferred-fairness (the tenant has its share of workers), refused (made dead by the fan-out: its event came past the capped tenant's bound of queued events, MaxQueued)."}, []string{"outcome"}),
		latency:        f.NewHistogram(prometheus.HistogramOpts{Name: "onceflow_webhooks_delivery_latency_seconds", Help: "From the event projected (its delivery enqueued) to the receiver's acknowledgement.", Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}}),
		requestSeconds: f.NewHistogram(prometheus.HistogramOpts{Name: "onceflow_webhooks_request_duration_seconds", Help: "How long a delivery's request took, answered or not.", Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}),
		disabled:       f.NewCounter(prometheus.CounterOpts{Name: "onceflow_webhooks_endpoints_disabled_total", Help: "Endpoints disabled because they answered 410 Gone."}),
		breakerOpen:    f.NewCounter(prometheus.CounterOpts{Name: "onceflow_webhooks_breaker_opened_total", Help: "Failures that left an endpoint's circuit breaker open."}),
		batchSize:      f.NewHistogram(prometheus.HistogramOpts{Name: "onceflow_webhooks_record_batch_size", Help: "Deliveries recorded by one statement (the attempts that finished while the previous write ran).", Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128}}),
		fanouts:        f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_webhooks_fanouts_total", Help: "Fan-outs of an event into its deliveries, by outcome: expanded, capped (the tenant's deliveries in flight are at ONCEFLOW_WEBHOOK_MAX_PENDING: the fan-out waits), left (another fan-out of the tenant waits: its events are left to that one)."}, []string{"outcome"}),
		capped:         f.NewGauge(prometheus.GaugeOpts{Name: "onceflow_webhooks_capped_tenants", Help: "Tenants this worker found at their cap of deliveries in flight within the last minute."}),
		retained:       f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_webhooks_retention_deleted_rows_total", Help: "Rows the retention deleted, older than ONCEFLOW_WEBHOOK_RETENTION: finished deliveries (webhook_deliveries) and fanned-out events (webhook_events)."}, []string{"table"}),
	}
	return m
}
