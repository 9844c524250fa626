package jobs

import "github.com/prometheus/client_golang/prometheus"

type WorkerMetrics struct{ Fenced, Dead, Skipped *prometheus.CounterVec }

func (w *Worker) Metrics() WorkerMetrics {
	return WorkerMetrics{Fenced: w.metrics.fenced, Dead: w.metrics.dead, Skipped: w.metrics.idempotentSkipped}
}

type ProjectionMetrics struct{ Enqueued, Duplicates *prometheus.CounterVec }

func (p *Projection) Metrics() ProjectionMetrics {
	return ProjectionMetrics{Enqueued: p.enqueued, Duplicates: p.dups}
}
