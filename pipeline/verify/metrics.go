package verify

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// The metrics of the last recorded verification (docs/operations.md#verify).
const (
	LastRunMetric  = "onceflow_verify_last_run_timestamp_seconds"
	LastOKMetric   = "onceflow_verify_last_run_ok"
	FindingsMetric = "onceflow_verify_findings" // stage, kind
)

var (
	lastRunDesc = prometheus.NewDesc(LastRunMetric, "When the last recorded onceflow verify finished (verify_runs).", nil, nil)
	lastOKDesc  = prometheus.NewDesc(LastOKMetric, "1 when the last recorded onceflow verify found nothing lost or doubled, else 0.", nil, nil)
	findingDesc = prometheus.NewDesc(FindingsMetric, "What the last recorded onceflow verify found, by stage and kind (lost, doubled, pending, duplicate-record).",
		[]string{"stage", "kind"}, nil)
)

// Collector exports the newest row of verify_runs: a process with a
// database registers it, so every admin server's /metrics and status page
// show the last verification, whoever ran it. It reads the row at most
// once per its interval, whoever scrapes; without a row, or when the row
// cannot be read, it exports nothing.
type Collector struct {
	pool  *pgxpool.Pool
	every time.Duration

	mu     sync.Mutex
	readAt time.Time
	last   *Result
}

// NewCollector returns a collector reading pool at most once per every
// (default 10 s).
func NewCollector(pool *pgxpool.Pool, every time.Duration) *Collector {
	if every <= 0 {
		every = 10 * time.Second
	}
	return &Collector{pool: pool, every: every}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- lastRunDesc
	ch <- lastOKDesc
	ch <- findingDesc
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	if c.readAt.IsZero() || time.Since(c.readAt) >= c.every {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		last, err := Last(ctx, c.pool)
		cancel()
		if err == nil {
			c.last = last
		}
		c.readAt = time.Now()
	}
	last := c.last
	c.mu.Unlock()
	if last == nil {
		return
	}
	ok := 0.0
	if last.OK {
		ok = 1
	}
	ch <- prometheus.MustNewConstMetric(lastRunDesc, prometheus.GaugeValue, float64(last.FinishedAt.UnixMilli())/1000)
	ch <- prometheus.MustNewConstMetric(lastOKDesc, prometheus.GaugeValue, ok)
	for stage, kinds := range last.Findings {
		for kind, n := range kinds {
			ch <- prometheus.MustNewConstMetric(findingDesc, prometheus.GaugeValue, float64(n), stage, kind)
		}
	}
}
