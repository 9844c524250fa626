package relay

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	shipped prometheus.Counter
	errors  prometheus.Counter
	publish prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer, pool *pgxpool.Pool) *metrics {
	m := &metrics{
		shipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "onceflow_outbox_shipped_rows_total",
			Help: "Outbox rows acknowledged by Kafka and deleted.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "onceflow_outbox_ship_errors_total",
			Help: "Outbox batches that failed to ship and were retried.",
		}),
		publish: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "onceflow_outbox_publish_duration_seconds",
			Help:    "Time from producing an outbox batch to the broker's acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
	}
	reg.MustRegister(m.shipped, m.errors, m.publish, &backlogCollector{pool: pool})
	return m
}

// backlogCollector reads the outbox backlog from Postgres at scrape time,
// so every relay (and the dev stack) reports the same truth.
type backlogCollector struct{ pool *pgxpool.Pool }

var (
	backlogDesc = prometheus.NewDesc("onceflow_outbox_backlog_rows",
		"Rows waiting in the outbox.", nil, nil)
	oldestDesc = prometheus.NewDesc("onceflow_outbox_oldest_age_seconds",
		"Age of the oldest row waiting in the outbox (0 when empty); alert on this, not on the count.", nil, nil)
)

func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- backlogDesc
	ch <- oldestDesc
}

func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var rows int64
	var age float64
	err := c.pool.QueryRow(ctx,
		`SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8 FROM outbox`).Scan(&rows, &age)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(backlogDesc, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(backlogDesc, prometheus.GaugeValue, float64(rows))
	ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, age)
}
