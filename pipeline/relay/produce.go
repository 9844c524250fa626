package relay

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/tracing"
)

// produce ships rows in one Kafka transaction on the shard's producer and
// returns nil once it committed. On failure it returns the records' errors
// when the records got that far, and the producer is discarded: the next
// one fences it and aborts what it left open.
func (r *Relay) produce(ctx context.Context, w *worker, rows []outboxRow) ([]error, error) {
	// Kafka must be done before the lease can expire, or a relay taking the
	// shard over could publish before this one does. (Should the process
	// stall past this point anyway, the next holder's producer fences this
	// one, so its commit fails.)
	pctx, cancel := context.WithDeadline(ctx, w.getDeadline().Add(-r.cfg.margin()))
	defer cancel()
	if pctx.Err() != nil {
		// Too late already (this process was stalled): do not even create
		// a producer, whose initialization would fence the shard's new
		// holder.
		return nil, fmt.Errorf("shard %d: lease deadline passed before producing", w.shard)
	}
	start := time.Now()
	cl, err := r.clientFor(pctx, w)
	if err != nil {
		return nil, err
	}
	recErrs, err := r.transact(pctx, cl, w, rows)
	if err != nil {
		r.discardClient(w)
		if isFenced(err) {
			r.metrics.fenced.WithLabelValues("kafka").Inc()
		}
		return recErrs, err
	}
	ack := time.Now()
	r.metrics.publish.Observe(ack.Sub(start).Seconds())
	for _, row := range rows {
		r.metrics.latency.Observe(max(ack.Sub(row.createdAt).Seconds(), 0))
	}
	return nil, nil
}

func (r *Relay) transact(ctx context.Context, cl *kgo.Client, w *worker, rows []outboxRow) (_ []error, err error) {
	var traces []context.Context // each row's, when tracing is on: kotel's publish span is its child
	if r.tracer.On() {
		traces = make([]context.Context, len(rows))
		var links []trace.Link
		for i, row := range rows {
			traces[i] = tracing.WithTraceparent(context.Background(), headerOf(row.headers, pipeline.HeaderTraceparent))
			links = tracing.Link(links, traces[i])
		}
		var span trace.Span
		_, span = r.tracer.Batch(ctx, "onceflow.relay.transaction", links,
			trace.WithAttributes(attribute.Int("onceflow.batch.size", len(rows)), attribute.Int("onceflow.outbox.shard", w.shard)))
		defer func() { tracing.End(span, err) }()
	}
	if err := cl.BeginTransaction(); err != nil {
		return nil, fmt.Errorf("begin transaction: %w", err)
	}
	lease := kgo.RecordHeader{Key: HeaderLease, Value: []byte(strconv.Itoa(w.shard) + ":" + strconv.FormatInt(w.token, 10))}
	// Every row is a command ingest accepted, dated when it did: the
	// processor does not fail it for the time it waited in the outbox.
	accepted := kgo.RecordHeader{Key: pipeline.HeaderAcceptedBy, Value: acceptedByRelay}
	// One allocation for the records, one for their headers and one
	// promise for them all: draining a backlog, the relay produces tens of
	// thousands of records a second.
	recs := make([]kgo.Record, len(rows))
	n := 2 * len(rows)
	for _, row := range rows {
		n += len(row.headers)
	}
	hdrs := make([]kgo.RecordHeader, 0, n)
	var (
		mu      sync.Mutex
		failed  []error // the records' errors, in no particular order
		pending atomic.Int64
		acked   = make(chan struct{}) // closed when every record has its answer
	)
	pending.Store(int64(len(rows)))
	// The promise never blocks, even after this function gave up waiting
	// (the discarded client fails what it holds).
	promise := func(_ *kgo.Record, err error) {
		if err != nil {
			mu.Lock()
			failed = append(failed, err)
			mu.Unlock()
		}
		if pending.Add(-1) == 0 {
			close(acked)
		}
	}
	for i, row := range rows {
		at := len(hdrs)
		hdrs = append(append(hdrs, row.headers...), lease, accepted)
		recs[i] = kgo.Record{Topic: row.topic, Key: row.key, Value: row.value, Timestamp: row.createdAt,
			Headers: hdrs[at:len(hdrs):len(hdrs)]}
		if traces != nil {
			recs[i].Context = traces[i]
		}
		cl.Produce(ctx, &recs[i], promise)
	}
	select {
	case <-acked:
	case <-ctx.Done():
		return nil, fmt.Errorf("produce %d rows of shard %d: no acknowledgement before the lease deadline: %w", len(rows), w.shard, ctx.Err())
	}
	// Every promise has run (the last closed acked): failed is complete.
	if len(failed) > 0 {
		return failed, fmt.Errorf("produce %d rows of shard %d: %w", len(rows), w.shard, failed[0])
	}
	if err := r.awaitPartitions(ctx, cl, recs); err != nil {
		return nil, fmt.Errorf("commit %d rows of shard %d: %w", len(rows), w.shard, err)
	}
	if h := r.hooks.beforeCommit; h != nil {
		h(w.shard)
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		// The commit may or may not have happened: the rows stay, and go
		// out again if it did (same command-id; the processor absorbs it).
		return nil, fmt.Errorf("commit %d rows of shard %d: %w", len(rows), w.shard, err)
	}
	return nil, nil
}

// awaitPartitions returns once the producer's own view of the topics
// holds every partition recs were written to, so that EndTransaction sees
// them. franz-go v1.22.3 partitions the records buffered for a topic it
// produces to for the first time before it stores the topic's partitions
// (storePartitionsUpdate stores them when it returns); if the records are
// acknowledged in between, EndTransaction finds no partition of the
// transaction, turns the commit into an abort and returns nil, and the
// rows would be deleted for records no read_committed reader will see
// (docs/decisions/0026-relay-commit-waits-for-partitions.md). A
// partition is in that view when PartitionLeader knows its leader; the
// view is completed microseconds after the acknowledgement, so the wait is
// rare and short, and bounded by ctx (the lease deadline): a batch that
// cannot be checked is not committed.
func (r *Relay) awaitPartitions(ctx context.Context, cl *kgo.Client, recs []kgo.Record) error {
	waited := false
	for i := range recs {
		if i > 0 && recs[i].Topic == recs[i-1].Topic && recs[i].Partition == recs[i-1].Partition {
			continue
		}
		for {
			if leader, _, _ := cl.PartitionLeader(recs[i].Topic, recs[i].Partition); leader >= 0 {
				break
			}
			if !waited {
				waited = true
				r.metrics.commitWaits.Inc()
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("partition %d of %s is not in the producer's metadata: %w", recs[i].Partition, recs[i].Topic, ctx.Err())
			case <-time.After(time.Millisecond):
			}
		}
	}
	if waited {
		r.logger.Info("waited for the producer to see the partitions it wrote to before committing")
	}
	return nil
}

// clientFor returns the shard's transactional producer, creating it if
// needed. Creating it initializes the transactional id's producer epoch,
// which fences every earlier producer of the shard (a relay that lost the
// lease, this relay's own discarded producer) and aborts any transaction
// it left open.
func (r *Relay) clientFor(ctx context.Context, w *worker) (*kgo.Client, error) {
	if w.client != nil {
		return w.client, nil
	}
	opts := []kgo.Opt{
		kgo.TransactionalID(r.cfg.TransactionalID(w.shard)),
		kgo.TransactionTimeout(r.cfg.LeaseDuration),
		kgo.ProducerLinger(0), // a batch is produced at once and waited for; lingering only adds latency
	}
	if h := r.hooks.clientOpts; h != nil {
		opts = append(opts, h(w.shard)...)
	}
	cl, err := r.kafka.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	if _, _, err := cl.ProducerID(ctx); err != nil {
		r.closeClient(cl)
		return nil, fmt.Errorf("init producer of shard %d: %w", w.shard, err)
	}
	w.client = cl
	return cl, nil
}

func (r *Relay) discardClient(w *worker) {
	if w.client != nil {
		r.closeClient(w.client)
		w.client = nil
	}
}

// closeClient closes a producer in the background: Close waits for
// requests in flight, which can take a while when the broker is away.
func (r *Relay) closeClient(cl *kgo.Client) {
	r.wg.Go(cl.Close)
}

// acceptedByRelay is the accepted-by header's value on every record the
// relay ships, shared by them all.
var acceptedByRelay = []byte(pipeline.AcceptedByRelay)
