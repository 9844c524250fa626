package processor

import (
	"github.com/onceflow/onceflow/pipeline"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

type metrics struct {
	commands     *prometheus.CounterVec
	dedup        prometheus.Counter
	dlq          *prometheus.CounterVec
	transactions *prometheus.CounterVec
	batch        prometheus.Histogram
	commit       prometheus.Histogram
	restore      prometheus.Histogram
	restoreWaits prometheus.Counter
	aggregates   prometheus.Gauge
	sessions     prometheus.Counter

	blocked       prometheus.Gauge
	rememberedIDs prometheus.Gauge
	dedupBytes    prometheus.Gauge
	snapshotBytes prometheus.Histogram
	age           prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		commands:      f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_processor_commands_total", Help: "Commands handled in committed transactions, by outcome (accepted, rejected)."}, []string{"outcome"}),
		dedup:         f.NewCounter(prometheus.CounterOpts{Name: "onceflow_command_dedup_total", Help: "Commands skipped because their aggregate had already handled their command id."}),
		dlq:           f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_dlq_records_total", Help: "Poison commands sent to the DLQ in committed transactions, by reason."}, []string{"reason"}),
		transactions:  f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_processor_transactions_total", Help: "Kafka transactions ended, by result (committed, aborted, unknown: EndTxn failed and a new session finds out)."}, []string{"result"}),
		batch:         f.NewHistogram(prometheus.HistogramOpts{Name: "onceflow_processor_batch_duration_seconds", Help: "Time from polling a batch to the end of its transaction.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		commit:        f.NewHistogram(prometheus.HistogramOpts{Name: "onceflow_processor_commit_duration_seconds", Help: "Time to end a batch's transaction once its records are acknowledged: offsets, heartbeat, EndTxn (the price of exactly-once per batch).", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
		restore:       f.NewHistogram(prometheus.HistogramOpts{Name: "onceflow_processor_restore_duration_seconds", Help: "Time to restore one partition's state from the state topic.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
		restoreWaits:  f.NewCounter(prometheus.CounterOpts{Name: "onceflow_processor_restore_waits_total", Help: "Reads of a state or dedup partition, at restore, that waited for a transaction still open on it to end (a zombie processor's, until the broker aborts it)."}),
		aggregates:    f.NewGauge(prometheus.GaugeOpts{Name: "onceflow_processor_aggregates", Help: "Aggregates held in memory for the assigned partitions."}),
		sessions:      f.NewCounter(prometheus.CounterOpts{Name: "onceflow_processor_session_restarts_total", Help: "Sessions restarted after a transaction of unknown outcome or a fenced producer (a zombie that woke up)."}),
		rememberedIDs: f.NewGauge(prometheus.GaugeOpts{Name: "onceflow_processor_remembered_ids", Help: "Command ids remembered for dedup (within the dedup window) over the assigned partitions."}),
		dedupBytes:    f.NewGauge(prometheus.GaugeOpts{Name: "onceflow_processor_dedup_memory_bytes", Help: "Memory held by the dedup memory of the assigned partitions: the remembered ids and their index."}),
		age:           f.NewHistogram(prometheus.HistogramOpts{Name: "onceflow_processor_command_age_seconds", Help: "Age of a command when the transaction that decided it committed, from its time (the record's timestamp: ingest's accept for commands from the outbox).", Buckets: pipeline.StageAgeBuckets}),
		snapshotBytes: f.NewHistogram(prometheus.HistogramOpts{Name: "onceflow_processor_snapshot_size_bytes", Help: "Size of the aggregate snapshots written to the state topic.", Buckets: prometheus.ExponentialBuckets(16, 4, 10)}),
		blocked:       f.NewGauge(prometheus.GaugeOpts{Name: "onceflow_processor_blocked_partitions", Help: "Commands partitions this processor stopped at a batch that decompresses beyond KAFKA_MAX_DECOMPRESS_BATCH_BYTES, until an operator skips it (onceflow commands skip-batch) or raises the bound."}),
	}
	return m
}
