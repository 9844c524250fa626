package projector

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	applied    prometheus.Counter
	duplicates prometheus.Counter
	fenced     prometheus.Counter
	gaps       prometheus.Counter
	parked     prometheus.Gauge
	errors     prometheus.Counter
	batch      prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer, consumer string) *metrics {
	l := prometheus.Labels{"consumer": consumer}
	m := &metrics{
		applied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "onceflow_projector_events_applied_total", Help: "Events applied to the read models.", ConstLabels: l,
		}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "onceflow_projector_duplicates_total", Help: "Events absorbed as duplicates by the inbox or a version guard.", ConstLabels: l,
		}),
		fenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "onceflow_projector_fenced_records_total", Help: "Records skipped because the stored offset was already past them (another member applied them).", ConstLabels: l,
		}),
		gaps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "onceflow_projector_version_gaps_total", Help: "Version gaps found; each parks its partition.", ConstLabels: l,
		}),
		parked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "onceflow_projector_parked_partitions", Help: "Partitions parked until an operator acts.", ConstLabels: l,
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "onceflow_projector_batch_errors_total", Help: "Batches that failed and were retried.", ConstLabels: l,
		}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "onceflow_projector_batch_duration_seconds", Help: "Time to apply one batch in Postgres.", ConstLabels: l,
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
	}
	reg.MustRegister(m.applied, m.duplicates, m.fenced, m.gaps, m.parked, m.errors, m.batch)
	return m
}
