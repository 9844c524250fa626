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

// LagCollector exports consumer lag with the names and labels of Kafka Lag
// Exporter, so dashboards and alerts written for it work unchanged; every
// figure is measured against the last stable offset, for groups that
// commit to Kafka and for consumers whose offsets live elsewhere alike
// (docs/projector.md, Lag):
//
//	kafka_consumergroup_group_offset{cluster_name,group,topic,partition,member_host,consumer_id,client_id}
//	kafka_consumergroup_group_lag{…the same}          records
//	kafka_consumergroup_group_lag_seconds{…the same}  age of the oldest record not consumed
//	kafka_consumergroup_group_max_lag{cluster_name,group}
//	kafka_consumergroup_group_max_lag_seconds{cluster_name,group}
//	kafka_consumergroup_group_sum_lag{cluster_name,group}
//	kafka_consumergroup_group_topic_sum_lag{cluster_name,group,topic}
//	kafka_partition_latest_offset{cluster_name,topic,partition}    the last stable offset
//	kafka_partition_earliest_offset{cluster_name,topic,partition}
//	kafka_consumergroup_poll_time_ms{cluster_name}                 how long the last measurement took
//
// A partition no member owns has member_host, consumer_id and client_id
// "unknown", as Kafka Lag Exporter reports them.
//
// It measures on scrape (at most once per MinInterval; a scrape in between
// gets the last figures), so a process exports lag only while something
// reads its /metrics. One collector per registry: components of one process
// Add their sources to it, or a Finder adds every consumer of the cluster.
type LagCollector struct {
	meter  *LagMeter
	logger *slog.Logger
	// ClusterName is the cluster_name label. Default: the cluster id the
	// brokers report.
	ClusterName string
	MinInterval time.Duration // default 5s
	Timeout     time.Duration // of one measurement; default 10s

	mu      sync.Mutex
	sources []LagSource
	finders []func(ctx context.Context) ([]LagSource, error)
	last    []PartitionLag
	took    time.Duration
	at      time.Time
}

// Label values of a partition no member owns.
const unknownMember = "unknown"

var (
	partitionLabels = []string{"cluster_name", "group", "topic", "partition", "member_host", "consumer_id", "client_id"}
	groupLabels     = []string{"cluster_name", "group"}

	groupOffsetDesc    = prometheus.NewDesc("kafka_consumergroup_group_offset", "The group's committed offset: the next offset it will read.", partitionLabels, nil)
	lagDesc            = prometheus.NewDesc("kafka_consumergroup_group_lag", "Records between the group's committed offset and the partition's last stable offset.", partitionLabels, nil)
	lagSecondsDesc     = prometheus.NewDesc("kafka_consumergroup_group_lag_seconds", "Age of the oldest record the group has not consumed yet (by its timestamp); 0 without lag.", partitionLabels, nil)
	maxLagDesc         = prometheus.NewDesc("kafka_consumergroup_group_max_lag", "The group's largest lag of a partition, in records.", groupLabels, nil)
	maxLagSecondsDesc  = prometheus.NewDesc("kafka_consumergroup_group_max_lag_seconds", "The group's largest lag of a partition, in seconds.", groupLabels, nil)
	sumLagDesc         = prometheus.NewDesc("kafka_consumergroup_group_sum_lag", "The group's lag summed over its partitions, in records.", groupLabels, nil)
	topicSumLagDesc    = prometheus.NewDesc("kafka_consumergroup_group_topic_sum_lag", "The group's lag summed over the partitions of a topic, in records.", []string{"cluster_name", "group", "topic"}, nil)
	latestOffsetDesc   = prometheus.NewDesc("kafka_partition_latest_offset", "The partition's last stable offset: as far as a read_committed consumer can read.", []string{"cluster_name", "topic", "partition"}, nil)
	earliestOffsetDesc = prometheus.NewDesc("kafka_partition_earliest_offset", "The partition's log start offset.", []string{"cluster_name", "topic", "partition"}, nil)
	pollTimeDesc       = prometheus.NewDesc("kafka_consumergroup_poll_time_ms", "How long the last lag measurement took, in milliseconds.", []string{"cluster_name"}, nil)
)

// NewLagCollector returns a collector measuring with cl (any client of the
// cluster; it is not closed).
func NewLagCollector(cl *kgo.Client, logger *slog.Logger) *LagCollector {
	return &LagCollector{meter: NewLagMeter(cl), logger: logger}
}

// Add adds a consumer to measure.
func (c *LagCollector) Add(s LagSource) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sources = append(c.sources, s)
}

// AddFinder adds consumers found anew at each measurement (Groups finds
// every group of the cluster). A consumer added with Add, or found by an
// earlier finder, wins over one of the same name found later.
func (c *LagCollector) AddFinder(find func(ctx context.Context) ([]LagSource, error)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.finders = append(c.finders, find)
}

// Describe implements prometheus.Collector.
func (c *LagCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{groupOffsetDesc, lagDesc, lagSecondsDesc, maxLagDesc, maxLagSecondsDesc,
		sumLagDesc, topicSumLagDesc, latestOffsetDesc, earliestOffsetDesc, pollTimeDesc} {
		ch <- d
	}
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
	if time.Since(c.at) >= minInterval && (len(c.sources) > 0 || len(c.finders) > 0) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		start := time.Now()
		rows, err := c.measure(ctx)
		cancel()
		if err != nil {
			if c.logger != nil {
				c.logger.Warn("measure consumer lag", "err", err)
			}
		} else {
			c.last, c.took, c.at = rows, time.Since(start), time.Now()
		}
	}
	if c.at.IsZero() {
		return
	}
	cluster := c.ClusterName
	ch <- prometheus.MustNewConstMetric(pollTimeDesc, prometheus.GaugeValue, float64(c.took.Milliseconds()), cluster)

	type groupTotals struct {
		maxLag, sumLag int64
		maxSeconds     float64
		seconds        bool // some partition's lag in seconds is known
	}
	groups := map[string]*groupTotals{}
	topicSums := map[[2]string]int64{}
	type tp struct {
		topic string
		part  int32
	}
	parts := map[tp]PartitionLag{}
	for _, r := range c.last {
		part := strconv.Itoa(int(r.Partition))
		host, member, client := orUnknown(r.Host), orUnknown(r.MemberID), orUnknown(r.ClientID)
		if r.Committed >= 0 {
			ch <- prometheus.MustNewConstMetric(groupOffsetDesc, prometheus.GaugeValue, float64(r.Committed), cluster, r.Group, r.Topic, part, host, member, client)
		}
		ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, float64(r.Lag), cluster, r.Group, r.Topic, part, host, member, client)
		if r.LagSeconds >= 0 {
			ch <- prometheus.MustNewConstMetric(lagSecondsDesc, prometheus.GaugeValue, r.LagSeconds, cluster, r.Group, r.Topic, part, host, member, client)
		}
		g := groups[r.Group]
		if g == nil {
			g = &groupTotals{}
			groups[r.Group] = g
		}
		g.maxLag, g.sumLag = max(g.maxLag, r.Lag), g.sumLag+r.Lag
		if r.LagSeconds >= 0 {
			g.maxSeconds, g.seconds = max(g.maxSeconds, r.LagSeconds), true
		}
		topicSums[[2]string{r.Group, r.Topic}] += r.Lag
		parts[tp{r.Topic, r.Partition}] = r
	}
	for name, g := range groups {
		ch <- prometheus.MustNewConstMetric(maxLagDesc, prometheus.GaugeValue, float64(g.maxLag), cluster, name)
		ch <- prometheus.MustNewConstMetric(sumLagDesc, prometheus.GaugeValue, float64(g.sumLag), cluster, name)
		if g.seconds {
			ch <- prometheus.MustNewConstMetric(maxLagSecondsDesc, prometheus.GaugeValue, g.maxSeconds, cluster, name)
		}
	}
	for k, sum := range topicSums {
		ch <- prometheus.MustNewConstMetric(topicSumLagDesc, prometheus.GaugeValue, float64(sum), cluster, k[0], k[1])
	}
	for p, r := range parts {
		part := strconv.Itoa(int(p.part))
		ch <- prometheus.MustNewConstMetric(latestOffsetDesc, prometheus.GaugeValue, float64(r.LastStable), cluster, p.topic, part)
		ch <- prometheus.MustNewConstMetric(earliestOffsetDesc, prometheus.GaugeValue, float64(r.LogStart), cluster, p.topic, part)
	}
}

// measure finds the sources and measures them; c.mu is held.
func (c *LagCollector) measure(ctx context.Context) ([]PartitionLag, error) {
	if c.ClusterName == "" {
		if md, err := c.meter.adm.BrokerMetadata(ctx); err == nil {
			c.ClusterName = md.Cluster
		}
	}
	sources := append([]LagSource(nil), c.sources...)
	seen := map[string]bool{}
	for _, s := range sources {
		seen[s.Group] = true
	}
	for _, find := range c.finders {
		found, err := find(ctx)
		if err != nil {
			return nil, err
		}
		for _, s := range found {
			if !seen[s.Group] {
				seen[s.Group] = true
				sources = append(sources, s)
			}
		}
	}
	return c.meter.Lag(ctx, sources)
}

func orUnknown(s string) string {
	if s == "" {
		return unknownMember
	}
	return s
}
