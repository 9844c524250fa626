package processor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
)

// Serde encodes and decodes the Kafka record values of one topic (the Avro
// serde of pipeline/avro).
type Serde interface {
	Encode(ctx context.Context, v any) ([]byte, error)
	Decode(ctx context.Context, b []byte) (any, error)
}

// Serdes are the serdes of the processor's topics.
type Serdes struct {
	Commands Serde // decodes commands, encodes commands for other aggregates
	Events   Serde
	State    Serde // snapshots (Snapshot[S])
}

// Processor runs a Decider over the commands topic with exactly-once
// effects. S is the aggregate state.
type Processor[S any] struct {
	cfg     Config
	kafka   kafka.Config
	decider pipeline.Decider[S]
	serdes  Serdes
	logger  *slog.Logger
	metrics *metrics

	// parts holds the state of each assigned partition. Rebalances are
	// blocked while a batch runs, so callbacks and batches never overlap;
	// the mutex guards readers outside the loop (Snapshot, metrics).
	mu    sync.Mutex
	parts map[int32]map[string]*aggregate[S]

	ready chan struct{}
	once  sync.Once
}

// New returns a processor.
func New[S any](cfg Config, kcfg kafka.Config, decider pipeline.Decider[S], serdes Serdes, logger *slog.Logger, reg prometheus.Registerer) (*Processor[S], error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Processor[S]{
		cfg: cfg, kafka: kcfg, decider: decider, serdes: serdes,
		logger:  logger.With("component", "processor", "instance", cfg.InstanceID),
		metrics: newMetrics(reg),
		parts:   make(map[int32]map[string]*aggregate[S]),
		ready:   make(chan struct{}),
	}, nil
}

// Ready is closed once the processor has joined its group and restored
// the state of its partitions.
func (p *Processor[S]) Ready() <-chan struct{} { return p.ready }

func (p *Processor[S]) markReady() { p.once.Do(func() { close(p.ready) }) }

// Run processes until ctx ends. It finishes the batch in flight (its
// transaction commits or aborts) and leaves the group before returning nil.
func (p *Processor[S]) Run(ctx context.Context) error {
	restoreCl, err := p.kafka.NewClient()
	if err != nil {
		return err
	}
	defer restoreCl.Close()

	t := p.cfg.Topics
	opts, err := p.kafka.Opts()
	if err != nil {
		return err
	}
	opts = append(opts,
		kgo.ConsumerGroup(p.cfg.Group),
		kgo.ConsumeTopics(t.Commands()),
		kgo.TransactionalID(p.cfg.TransactionalID()),
		kgo.TransactionTimeout(p.cfg.TransactionTimeout),
		kgo.SessionTimeout(p.cfg.SessionTimeout),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.BlockRebalanceOnPoll(),
		kgo.RecordPartitioner(statePartitioner{state: t.State(), keyed: kgo.StickyKeyPartitioner(nil)}),
		kgo.AdjustFetchOffsetsFn(func(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
			for part := range offsets[t.Commands()] {
				if err := p.restore(ctx, restoreCl, part); err != nil {
					return nil, fmt.Errorf("restore partition %d: %w", part, err)
				}
			}
			p.markReady()
			return offsets, nil
		}),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, added map[string][]int32) {
			if len(added[t.Commands()]) == 0 {
				p.markReady() // a member without partitions is ready at once
			}
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, revoked map[string][]int32) { p.drop(revoked[t.Commands()]) }),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, lost map[string][]int32) { p.drop(lost[t.Commands()]) }),
	)
	sess, err := kgo.NewGroupTransactSession(opts...)
	if err != nil {
		return fmt.Errorf("processor client: %w", err)
	}
	defer sess.Close()
	p.logger.Info("processor started", "group", p.cfg.Group, "transactional_id", p.cfg.TransactionalID())

	for {
		fetches := sess.PollRecords(ctx, p.cfg.MaxPollRecords)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			sess.AllowRebalance()
			return nil
		}
		fetches.EachError(func(topic string, part int32, err error) {
			if !errors.Is(err, context.Canceled) {
				p.logger.Warn("fetch error", "topic", topic, "partition", part, "err", err)
			}
		})
		if fetches.NumRecords() == 0 {
			sess.AllowRebalance()
			continue
		}
		err := p.processBatch(ctx, sess, fetches.Records())
		sess.AllowRebalance()
		if err != nil {
			return err
		}
	}
}

// processBatch handles one poll batch in one transaction.
func (p *Processor[S]) processBatch(ctx context.Context, sess *kgo.GroupTransactSession, records []*kgo.Record) error {
	start := time.Now()
	// The transaction is ended even when ctx is canceled meanwhile:
	// shutdown finishes the batch in flight.
	txCtx := context.WithoutCancel(ctx)
	if err := sess.Begin(); err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	b := newBatch(p, txCtx, sess.Client())
	for _, r := range records {
		b.handle(r)
	}
	b.snapshot()
	committed, err := sess.End(txCtx, kgo.TransactionEndTry(b.promise.Err() == nil))
	if err != nil {
		p.metrics.transactions.WithLabelValues("aborted").Inc()
		return fmt.Errorf("end transaction: %w", err)
	}
	if !committed {
		p.metrics.transactions.WithLabelValues("aborted").Inc()
		p.logger.Warn("transaction aborted; the batch will be decided again", "records", len(records), "err", b.promise.Err())
		if b.failed != nil {
			// Give what failed (the schema registry) a moment.
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
		return nil
	}
	p.metrics.transactions.WithLabelValues("committed").Inc()
	p.metrics.batch.Observe(time.Since(start).Seconds())
	b.commit()
	return nil
}

// drop forgets the state of revoked or lost partitions.
func (p *Processor[S]) drop(parts []int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, part := range parts {
		delete(p.parts, part)
	}
	p.metrics.aggregates.Set(float64(p.countLocked()))
	if len(parts) > 0 {
		p.logger.Info("partitions revoked", "partitions", parts)
	}
}

func (p *Processor[S]) countLocked() int {
	n := 0
	for _, aggs := range p.parts {
		n += len(aggs)
	}
	return n
}

// State returns a copy of the state of every aggregate held in memory, by
// aggregate id, with its version (for tests and debugging).
func (p *Processor[S]) State() map[string]AggregateState[S] {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]AggregateState[S], p.countLocked())
	for _, aggs := range p.parts {
		for id, a := range aggs {
			out[id] = AggregateState[S]{State: a.state, Version: a.version, Processed: len(a.processed)}
		}
	}
	return out
}

// AggregateState is one aggregate as the processor holds it.
type AggregateState[S any] struct {
	State     S
	Version   int64
	Processed int // command ids remembered for dedup
}

// statePartitioner sends snapshots to the partition the caller chose (the
// command's partition, so state is co-partitioned with commands whatever
// partitioner the command's producer used) and everything else by key
// (murmur2, Kafka's default, so every client agrees).
type statePartitioner struct {
	state string
	keyed kgo.Partitioner
}

func (s statePartitioner) ForTopic(topic string) kgo.TopicPartitioner {
	if topic == s.state {
		return manual{}
	}
	return s.keyed.ForTopic(topic)
}

type manual struct{}

func (manual) RequiresConsistency(*kgo.Record) bool { return true }
func (manual) Partition(r *kgo.Record, _ int) int   { return int(r.Partition) }
