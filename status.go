package onceflow

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/admin"
	"github.com/onceflow/onceflow/pipeline/admin/status"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/processor"
	"github.com/onceflow/onceflow/pipeline/verify"
)

// batchBlocker is a processor as the status page sees it: the commands
// partitions it stopped at a batch too large to decompress, and the skip.
type batchBlocker interface {
	Blocked() []kafka.BlockedPartition
	SkipBatch(ctx context.Context, topic string, partition int32, offset int64, note, operator string) (int64, error)
}

// statusPage adds the status page (pipeline/admin/status) to the
// process's admin server, reading the process's metrics, the database if
// it has one, and the deployment's DLQ topics; Run the page for its
// samples, and call done when the process ends.
func statusPage(rc RunConfig, adm *admin.Server, metrics *prometheus.Registry, pool *pgxpool.Pool, dep *Deployment, blockers []batchBlocker) (page *status.Page, done func(), err error) {
	// The DLQs are read with the process's Kafka client; a process of no
	// Kafka component (a worker) has none and shows none.
	var cl *kgo.Client
	closeClient := func() {}
	if rc.Components.kafka() {
		if cl, err = rc.Kafka.NewClient(); err != nil {
			return nil, nil, err
		}
		closeClient = cl.Close
	}
	cfg := status.Config{
		Gatherer: metrics,
		Pool:     pool,
		Kafka:    cl,
		Interval: rc.StatusInterval,
		Logger:   rc.Logger.With("component", "status"),
	}
	c := rc.Components
	for _, on := range []struct {
		run  bool
		name string
	}{{c.Ingest, "ingest"}, {c.Relay, "relay"}, {c.Processor, "processor"}, {c.Projector, "projector"}, {c.Worker, "worker"}, {c.NATSink, "natsink"}} {
		if on.run {
			cfg.Components = append(cfg.Components, on.name)
		}
	}
	for _, a := range dep.Aggregates() {
		cfg.DLQs = append(cfg.DLQs, status.DLQTopicConfig{Topic: a.Topics.DLQ(), Commands: a.Topics.Commands()})
		cfg.CommandTopics = append(cfg.CommandTopics, a.Topics.Commands())
	}
	for _, d := range dep.Domains {
		cfg.EventTopics = append(cfg.EventTopics, d.EventsTopic())
	}
	if len(blockers) > 0 {
		cfg.Blocked = func() []kafka.BlockedPartition {
			var out []kafka.BlockedPartition
			for _, b := range blockers {
				out = append(out, b.Blocked()...)
			}
			return out
		}
		cfg.SkipBatch = func(ctx context.Context, topic string, partition int32, offset int64, note, operator string) (int64, error) {
			for _, b := range blockers {
				to, err := b.SkipBatch(ctx, topic, partition, offset, note, operator)
				if !errors.Is(err, processor.ErrNotBlocked) {
					return to, err
				}
			}
			return 0, processor.ErrNotBlocked
		}
	}
	if pool != nil {
		// The last `onceflow verify` on every admin server: its gauges on
		// /metrics, and the page's line (docs/operations.md#verify).
		if err := metrics.Register(verify.NewCollector(pool, 0)); err != nil {
			closeClient()
			return nil, nil, err
		}
	}
	if page, err = status.New(cfg); err != nil {
		closeClient()
		return nil, nil, err
	}
	page.Register(adm)
	return page, closeClient, nil
}
