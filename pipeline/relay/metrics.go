package relay

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

type metrics struct {
	shipped prometheus.Counter
	errors  prometheus.Counter
	publish prometheus.Histogram
	latency prometheus.Histogram
	dead    *prometheus.CounterVec
	fenced  *prometheus.CounterVec
	leases  *prometheus.CounterVec
	owned   prometheus.Gauge

	commitWaits prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, pool *pgxpool.Pool, backlogTTL time.Duration) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		shipped:     f.NewCounter(prometheus.CounterOpts{Name: "onceflow_outbox_shipped_rows_total", Help: "Outbox rows acknowledged by Kafka and deleted."}),
		errors:      f.NewCounter(prometheus.CounterOpts{Name: "onceflow_outbox_ship_errors_total", Help: "Outbox batches (and lease rounds) that failed and were retried."}),
		publish:     f.NewHistogram(prometheus.HistogramOpts{Name: "onceflow_outbox_publish_duration_seconds", Help: "Time from producing an outbox batch to the broker's acknowledgement of its transaction.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		latency:     f.NewHistogram(prometheus.HistogramOpts{Name: "onceflow_outbox_ship_latency_seconds", Help: "Time from a row's acceptance (its created_at, database clock) to the broker's acknowledgement: what the outbox adds to a command's way.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		dead:        f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_outbox_dead_rows_total", Help: "Outbox rows that cannot be shipped, moved to outbox_dead, by reason: the broker's error code for a row it refused for good, or INVALID_HEADERS for headers that are not a JSON object of strings."}, []string{"reason"}),
		fenced:      f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_outbox_fenced_total", Help: "Times this relay found a shard's lease had moved and stopped: at the check before producing, at a renewal, at the delete after the acknowledgement, or by Kafka refusing its fenced producer."}, []string{"stage"}),
		leases:      f.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_outbox_lease_changes_total", Help: "Shard leases this relay acquired, lost to another relay, or released."}, []string{"change"}),
		owned:       f.NewGauge(prometheus.GaugeOpts{Name: "onceflow_outbox_shards_owned", Help: "Outbox shards whose lease this relay holds."}),
		commitWaits: f.NewCounter(prometheus.CounterOpts{Name: "onceflow_outbox_commit_waits_total", Help: "Batches whose commit waited until the producer's metadata held the partitions it had just written to: without the wait franz-go v1.22.3 may turn the commit into an abort (docs/decisions/0026-relay-commit-waits-for-partitions.md)."}),
	}
	for _, s := range []string{"check", "renew", "delete", "kafka"} {
		m.fenced.WithLabelValues(s)
	}
	for _, c := range []string{"acquired", "lost", "released"} {
		m.leases.WithLabelValues(c)
	}
	reg.MustRegister(&backlogCollector{pool: pool, ttl: backlogTTL})
	return m
}

// backlogCollector reads the outbox backlog from Postgres at scrape time,
// so every relay (and the dev stack) reports the same truth: aggregate it
// with max(), not sum(), across relays.
//
// The read counts every row of the outbox, which costs in proportion to
// the backlog, exactly when the outbox is behind. Scrapes are not under
// the relay's control (two Prometheus servers, a dashboard, anyone who
// reaches the admin port), so a reading is reused for ttl: at most one
// count per ttl whatever the scrape rate. Concurrent scrapes of a stale
// reading wait for one read rather than each starting its own.
//
// It also reports the commands waiting for an outcome (status pending in
// command_status): how many, and how long the oldest has waited. Every
// command ends accepted, rejected or failed (the DLQ, outbox_dead), so one
// that stays pending was lost between ingest and the read models. They are
// here, in the relay, because it already reports the pipeline's backlog
// from Postgres for the whole deployment; ingest scales with requests, and
// more replicas would ask the same question more often. Their read walks
// the pending rows through command_status's partial index (pendingSQL),
// never the table, once per ttl.
type backlogCollector struct {
	pool *pgxpool.Pool
	ttl  time.Duration

	mu         sync.Mutex
	readAt     time.Time // zero before the first read
	shards     []ShardStatus
	err        error // the backlog read's
	dead       int64
	deadErr    error
	pending    int64
	pendingAge float64 // the oldest pending command's, in seconds of the database clock
	pendingErr error
}

// pendingSQL uses command_status_status_created_at_idx (sql/00035).
const pendingSQL = `SELECT count(*), coalesce(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8
	FROM command_status WHERE status = 'pending'`

var (
	backlogDesc       = prometheus.NewDesc("onceflow_outbox_backlog_rows", "Rows waiting in the outbox.", nil, nil)
	oldestDesc        = prometheus.NewDesc("onceflow_outbox_oldest_age_seconds", "Age of the oldest row waiting at the head of an outbox shard (0 when empty); alert on this, not on the count.", nil, nil)
	shardBacklogDesc  = prometheus.NewDesc("onceflow_outbox_shard_backlog_rows", "Rows waiting in one outbox shard.", []string{"shard"}, nil)
	shardOldestDesc   = prometheus.NewDesc("onceflow_outbox_shard_oldest_age_seconds", "Age of the row at the head of one outbox shard (0 when empty).", []string{"shard"}, nil)
	deadDesc          = prometheus.NewDesc("onceflow_outbox_dead_rows", "Rows in outbox_dead: rows that cannot be shipped, waiting for an operator.", nil, nil)
	pendingDesc       = prometheus.NewDesc("onceflow_commands_pending", "Commands waiting for an outcome (pending in command_status).", nil, nil)
	oldestPendingDesc = prometheus.NewDesc("onceflow_commands_oldest_pending_age_seconds", "Age of the oldest command waiting for an outcome (0 when none); alert on this.", nil, nil)
)

func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- backlogDesc
	ch <- oldestDesc
	ch <- shardBacklogDesc
	ch <- shardOldestDesc
	ch <- deadDesc
	ch <- pendingDesc
	ch <- oldestPendingDesc
}

func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.readAt.IsZero() || time.Since(c.readAt) >= c.ttl {
		c.read()
	}
	if c.err != nil {
		for _, d := range []*prometheus.Desc{backlogDesc, oldestDesc, shardBacklogDesc, shardOldestDesc} {
			ch <- prometheus.NewInvalidMetric(d, c.err)
		}
	} else {
		var rows int64
		var oldest time.Duration
		for _, s := range c.shards {
			rows += s.Backlog
			oldest = max(oldest, s.OldestAge)
			label := strconv.Itoa(s.Shard)
			ch <- prometheus.MustNewConstMetric(shardBacklogDesc, prometheus.GaugeValue, float64(s.Backlog), label)
			ch <- prometheus.MustNewConstMetric(shardOldestDesc, prometheus.GaugeValue, s.OldestAge.Seconds(), label)
		}
		ch <- prometheus.MustNewConstMetric(backlogDesc, prometheus.GaugeValue, float64(rows))
		ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, oldest.Seconds())
	}
	if c.pendingErr != nil {
		ch <- prometheus.NewInvalidMetric(pendingDesc, c.pendingErr)
		ch <- prometheus.NewInvalidMetric(oldestPendingDesc, c.pendingErr)
	} else {
		ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(c.pending))
		ch <- prometheus.MustNewConstMetric(oldestPendingDesc, prometheus.GaugeValue, c.pendingAge)
	}
	if c.deadErr != nil {
		ch <- prometheus.NewInvalidMetric(deadDesc, c.deadErr)
		return
	}
	ch <- prometheus.MustNewConstMetric(deadDesc, prometheus.GaugeValue, float64(c.dead))
}

// read refreshes the reading; a failed read is kept for ttl too, so a
// database in trouble is not asked again at every scrape.
func (c *backlogCollector) read() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c.shards, c.err = readBacklog(ctx, c.pool)
	c.deadErr = c.pool.QueryRow(ctx, countDeadSQL).Scan(&c.dead)
	c.pendingErr = c.pool.QueryRow(ctx, pendingSQL).Scan(&c.pending, &c.pendingAge)
	c.readAt = time.Now()
}
