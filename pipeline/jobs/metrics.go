package jobs

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// metrics are a worker's series. Labels are bounded: the job kind and an
// outcome from a fixed set, never a job or tenant id.
type metrics struct {
	attempts          *prometheus.CounterVec   // kind, outcome
	attemptSeconds    *prometheus.HistogramVec // kind
	dead              *prometheus.CounterVec   // kind, reason
	fenced            *prometheus.CounterVec   // kind
	idempotentSkipped *prometheus.CounterVec   // kind
}

// Attempt outcomes.
const (
	outcomeCompleted = "completed"
	outcomeRetry     = "retry"
	outcomeDead      = "dead"
	outcomeFenced    = "fenced"
	outcomeSnoozed   = "snoozed"
)

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		attempts:          f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_worker_attempts_total", Help: "Job attempts by kind and outcome: completed, retry (failed, will run again), dead (failed for good: permanent or out of attempts), fenced (a late attempt whose job another attempt already took over; its completion changed nothing), snoozed (put back without counting as an attempt: an open circuit breaker, a tenant over its share)."}, []string{"kind", "outcome"}),
		attemptSeconds:    f.NewHistogramVec(prometheus.HistogramOpts{Name: "onceflow_worker_attempt_duration_seconds", Help: "How long one job attempt ran, by kind.", Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}, []string{"kind"}),
		dead:              f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_worker_dead_jobs_total", Help: "Jobs that failed for good, by kind and reason: permanent (the attempt said retrying cannot help, e.g. a 4xx) or attempts (MaxAttempts ran out). Their errors are kept in river_job.errors (onceflow jobs list)."}, []string{"kind", "reason"}),
		fenced:            f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_worker_fenced_total", Help: "Attempts that finished after their lease expired and another attempt took the job: their outcome was refused (docs/jobs.md#what-it-guarantees)."}, []string{"kind"}),
		idempotentSkipped: f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_worker_idempotency_skipped_total", Help: "Job attempts that found their effect already recorded by an earlier attempt and did not repeat it."}, []string{"kind"}),
	}
	return m
}

// Skipped counts an attempt of kind that found its effect already done
// (a worker's own idempotency check) and did not repeat it.
func (w *Worker) Skipped(kind string) { w.metrics.idempotentSkipped.WithLabelValues(kind).Inc() }
