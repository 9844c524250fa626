package kafka

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

// LagCollector exports consumer lag under the names Kafka Lag Exporter made
// common, measured against the last stable offset, for groups that commit
// to Kafka and for consumers whose offsets live elsewhere alike:
//
//	kafka_consumergroup_group_lag{group,topic,partition}          records
//	kafka_consumergroup_group_lag_seconds{group,topic,partition}  seconds
//
// It measures on scrape (at most once per MinInterval; a scrape in between
// gets the last figures), so a process exports lag only while something
// reads its /metrics. One collector per registry: components of one process
// Add their sources to it.
type LagCollector struct {
	cl          *kgo.Client
	logger      *slog.Logger
	MinInterval time.Duration // default 5s
	Timeout     time.Duration // of one measurement; default 10s

	mu      sync.Mutex
	sources []LagSource
	last    []PartitionLag
	at      time.Time
}

var (
	lagDesc = prometheus.NewDesc("kafka_consumergroup_group_lag",
		"Records between the group's committed offset and the partition's last stable offset.",
		[]string{"group", "topic", "partition"}, nil)
	lagSecondsDesc = prometheus.NewDesc("kafka_consumergroup_group_lag_seconds",
		"Age of the oldest record the group has not consumed yet (by its timestamp); 0 without lag.",
		[]string{"group", "topic", "partition"}, nil)
)

// NewLagCollector returns a collector measuring with cl (any client of the
// cluster; it is not closed).
func NewLagCollector(cl *kgo.Client, logger *slog.Logger) *LagCollector {
	return &LagCollector{cl: cl, logger: logger}
}

// Add adds a consumer to measure.
func (c *LagCollector) Add(s LagSource) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sources = append(c.sources, s)
}

// Describe implements prometheus.Collector.
func (c *LagCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- lagDesc
	ch <- lagSecondsDesc
}

// Collect implements prometheus.Collector.
func (c *LagCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	minInterval, timeout := c.MinInterval, c.Timeout
	if minInterval == 0 {
		minInterval = 5 * time.Second
	}
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	if time.Since(c.at) >= minInterval && len(c.sources) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		rows, err := Lag(ctx, c.cl, c.sources)
		cancel()
		if err != nil {
			if c.logger != nil {
				c.logger.Warn("measure consumer lag", "err", err)
			}
		} else {
			c.last, c.at = rows, time.Now()
		}
	}
	for _, r := range c.last {
		part := strconv.Itoa(int(r.Partition))
		ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, float64(r.Lag), r.Group, r.Topic, part)
		if r.LagSeconds >= 0 {
			ch <- prometheus.MustNewConstMetric(lagSecondsDesc, prometheus.GaugeValue, r.LagSeconds, r.Group, r.Topic, part)
		}
	}
}
