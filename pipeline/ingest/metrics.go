package ingest

import (
	"github.com/onceflow/onceflow/pipeline"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

type metrics struct {
	requests  *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	hits      *prometheus.CounterVec
	conflicts *prometheus.CounterVec
	accepted  prometheus.Counter

	keyLookups   *prometheus.CounterVec
	authFailures *prometheus.CounterVec
	waits        prometheus.Gauge
	waitsRefused *prometheus.CounterVec
	commandReads prometheus.Counter

	batchSize     prometheus.Histogram
	batchDuration prometheus.Histogram
	age           prometheus.Histogram

	inbound         *prometheus.CounterVec
	inboundDuration prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		inbound:         f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_api_inbound_deliveries_total", Help: "Webhook deliveries answered, by provider and outcome: enqueued, recorded, superseded, ignored, duplicate, bad-signature, stale, invalid, refused, error."}, []string{"provider", "outcome"}),
		inboundDuration: f.NewHistogram(prometheus.HistogramOpts{Name: "onceflow_api_inbound_duration_seconds", Help: "Time to answer a webhook delivery, verification and the transaction that stored it included.", Buckets: []float64{.001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5}}),
		age:             f.NewHistogram(prometheus.HistogramOpts{Name: "onceflow_api_command_age_seconds", Help: "Age of a command when the transaction that accepted it committed, from its request's arrival: the first stage of its way.", Buckets: pipeline.StageAgeBuckets}),
		requests:        f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_api_requests_total", Help: "HTTP requests answered, by route and status code."}, []string{"route", "code"}),
		duration:        f.NewHistogramVec(prometheus.HistogramOpts{Name: "onceflow_api_request_duration_seconds", Help: "Time to answer an HTTP request, by route.", Buckets: []float64{.001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5}}, []string{"route"}),
		hits:            f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_api_idempotency_hits_total", Help: "Requests answered with a stored response because their Idempotency-Key was seen with the same request."}, []string{"route"}),
		conflicts:       f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_api_idempotency_conflicts_total", Help: "Requests refused because their Idempotency-Key was seen with a different request."}, []string{"route"}),
		accepted:        f.NewCounter(prometheus.CounterOpts{Name: "onceflow_api_commands_accepted_total", Help: "Commands accepted into the outbox."}),
		keyLookups:      f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_api_key_lookups_total", Help: "API keys looked up in the database (keys this process did not know valid), by result: found or unknown."}, []string{"result"}),
		authFailures:    f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_api_auth_failures_total", Help: "Requests refused before reaching a route, by reason: missing, unknown or revoked key (401), throttled client address (429), too many key lookups at once (busy, 503)."}, []string{"reason"}),
		waits:           f.NewGauge(prometheus.GaugeOpts{Name: "onceflow_api_command_waits", Help: "GET /v1/commands/{id}?wait= long-polls in flight."}),
		waitsRefused:    f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_api_command_waits_refused_total", Help: "Long-polls answered at once because too many were in flight, by the bound that refused them: total or tenant."}, []string{"limit"}),
		commandReads:    f.NewCounter(prometheus.CounterOpts{Name: "onceflow_api_command_reads_total", Help: "Reads of a command's row for GET /v1/commands/{id}: one per answer, and one per wake-up of a wait that found it still pending."}),
		batchSize:       f.NewHistogram(prometheus.HistogramOpts{Name: "onceflow_api_accept_batch_size", Help: "Requests per accept transaction (group commit).", Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256}}),
		batchDuration:   f.NewHistogram(prometheus.HistogramOpts{Name: "onceflow_api_accept_batch_duration_seconds", Help: "Time of one accept transaction, from BEGIN to COMMIT.", Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5}}),
	}
	return m
}
