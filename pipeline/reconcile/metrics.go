package reconcile

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

type metrics struct {
	findings    *prometheus.GaugeVec
	corrections *prometheus.CounterVec
	lastRun     prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		findings:    f.NewGaugeVec(prometheus.GaugeOpts{Name: "onceflow_reconcile_findings", Help: "What the last reconcile run found stuck or ambiguous, by kind (pending, outbox-dead, dlq, inbound, job), corrected or not."}, []string{"kind"}),
		corrections: f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_reconcile_corrections_total", Help: "Corrections reconcile made, by kind and action (resend, command); failed ones are not counted."}, []string{"kind", "action"}),
		lastRun:     f.NewGauge(prometheus.GaugeOpts{Name: "onceflow_reconcile_last_run_timestamp_seconds", Help: "When the last reconcile run that read everything finished (Unix seconds)."}),
	}
	for _, k := range Kinds {
		m.findings.WithLabelValues(k)
	}
	return m
}
