package natsink

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/onceflow/onceflow/pipeline"
)

// The classes of a failed publish (onceflow_natsink_publish_errors_total).
const (
	// classUnavailable: no answer — the connection is down or reconnecting,
	// no server serves the stream (no responders), or the acknowledgement
	// did not come within AckTimeout.
	classUnavailable = "unavailable"
	// classRefused: JetStream answered with an error (a message over the
	// stream's or the server's size limit, a stream that takes other
	// subjects, storage full). Retried as well: an operator fixes it and
	// the batch goes on; nothing is skipped.
	classRefused = "refused"
)

var publishClasses = []string{classUnavailable, classRefused}

type metrics struct {
	published  prometheus.Counter
	duplicates prometheus.Counter
	errors     *prometheus.CounterVec // by class (publishClasses)
	outOfOrder prometheus.Counter
	positional prometheus.Counter
	commits    *prometheus.CounterVec // by result: committed, failed
	connected  prometheus.Gauge
	stream     *prometheus.GaugeVec // 1 for the stream in use, by its storage and replicas
	batch      prometheus.Histogram
	age        prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		published:  f.NewCounter(prometheus.CounterOpts{Name: "onceflow_natsink_events_published_total", Help: "Events JetStream stored as new messages."}),
		duplicates: f.NewCounter(prometheus.CounterOpts{Name: "onceflow_natsink_duplicates_total", Help: "Events published again that JetStream dropped as duplicates of a message id in its duplicate window (a re-publish after a crash or a failed acknowledgement)."}),
		errors:     f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_natsink_publish_errors_total", Help: "Publishes that failed and are tried again, by class (unavailable: no answer in time; refused: JetStream answered with an error)."}, []string{"class"}),
		outOfOrder: f.NewCounter(prometheus.CounterOpts{Name: "onceflow_natsink_out_of_order_total", Help: "Events stored in the stream after a later event of their aggregate: a publish that failed and succeeded on a retry after one behind it had been stored."}),
		positional: f.NewCounter(prometheus.CounterOpts{Name: "onceflow_natsink_records_without_event_id_total", Help: "Records of the events topic without a valid event-id header, published with their topic position as message id."}),
		commits:    f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_natsink_commits_total", Help: "Offset commits to Kafka after JetStream acknowledged the records before them, by result (committed, failed)."}, []string{"result"}),
		connected:  f.NewGauge(prometheus.GaugeOpts{Name: "onceflow_natsink_connected", Help: "1 while the sink's connection to NATS is up, else 0."}),
		stream: f.NewGaugeVec(prometheus.GaugeOpts{Name: "onceflow_natsink_stream_info",
			Help: "1 for the JetStream stream the sink writes to, with its storage (file) and replicas, as the server reported them at start."}, []string{"stream", "storage", "replicas"}),
		batch: f.NewHistogram(prometheus.HistogramOpts{Name: "onceflow_natsink_batch_duration_seconds", Help: "Time from a batch's first publish to its offsets' commit.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		age:   f.NewHistogram(prometheus.HistogramOpts{Name: "onceflow_natsink_event_age_seconds", Help: "Age of an event when JetStream acknowledged it, from its time (its command's).", Buckets: pipeline.StageAgeBuckets}),
	}
	// Every series exists from the start, at zero, so a rate or an alert
	// sees the first increase.
	for _, c := range publishClasses {
		m.errors.WithLabelValues(c)
	}
	m.commits.WithLabelValues("committed")
	m.commits.WithLabelValues("failed")
	return m
}
