package projector

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pipeline"
)

type metrics struct {
	applied    prometheus.Counter
	duplicates prometheus.Counter
	fenced     prometheus.Counter
	gaps       prometheus.Counter
	rewinds    prometheus.Counter
	parked     *prometheus.GaugeVec   // by reason (parkReasons)
	errors     *prometheus.CounterVec // by class (retryClasses)
	retrying   *prometheus.GaugeVec   // by class (retryClasses)
	batch      prometheus.Histogram
	age        prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer, consumer string) *metrics {
	l := prometheus.Labels{"consumer": consumer}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: l})
	}
	m := &metrics{
		applied: counter("onceflow_projector_events_applied_total",
			"Events applied to the read models."),
		duplicates: counter("onceflow_projector_duplicates_total",
			"Events absorbed as duplicates by the inbox or a version guard."),
		fenced: counter("onceflow_projector_fenced_records_total",
			"Records skipped because the stored offset was already past them (another member applied them)."),
		gaps: counter("onceflow_projector_version_gaps_total",
			"Version gaps found; each parks its partition."),
		rewinds: counter("onceflow_projector_rewinds_total",
			"Partitions read again from an earlier offset because the stored offset was behind what this projector had committed: the database lost commits (a crash after asynchronous commits) or an operator moved the offset back."),
		parked: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "onceflow_projector_parked_partitions", Help: "Partitions parked until an operator acts, by reason (version-gap, undecodable, rejected-by-projection, data-error, projection-error, batch-too-large).", ConstLabels: l,
		}, []string{"reason"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_projector_batch_errors_total", Help: "Batches that failed with a transient error and were retried, by class of error.", ConstLabels: l,
		}, []string{"class"}),
		retrying: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "onceflow_projector_retrying_partitions", Help: "Partitions whose last batch failed with a transient error and is being retried, by class of error.", ConstLabels: l,
		}, []string{"class"}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "onceflow_projector_batch_duration_seconds", Help: "Time to apply one batch in Postgres.", ConstLabels: l,
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		age: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "onceflow_projector_event_age_seconds", Help: "Age of an event when the transaction that applied it to the read models committed, from its time (its command's): the last stage of a command's way.", ConstLabels: l,
			Buckets: pipeline.StageAgeBuckets,
		}),
	}
	// Every series exists from the start, at zero, so a rate or an alert
	// sees the first increase.
	for _, r := range parkReasons {
		m.parked.WithLabelValues(r)
	}
	for _, c := range retryClasses {
		m.errors.WithLabelValues(c)
		m.retrying.WithLabelValues(c)
	}
	reg.MustRegister(m.applied, m.duplicates, m.fenced, m.gaps, m.rewinds, m.parked, m.errors, m.retrying, m.batch, m.age)
	return m
}
