package processor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/tracing"
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
	// Targets are the commands topics of other aggregate types, by the
	// command types they handle: a decision's command (pipeline.Effect) of
	// such a type goes to that topic, encoded with its serde; any other to
	// the processor's own commands topic.
	Targets map[string]Target
}

// Target is another aggregate type's commands topic and its serde.
type Target struct {
	Topic    string
	Commands Serde
}

// Processor runs a Decider over the commands topic with exactly-once
// effects. S is the aggregate state.
type Processor[S any] struct {
	cfg     Config
	kafka   kafka.Config
	tracer  tracing.Tracer // with the Kafka clients' provider: a decision is a child of kotel's receive span
	decider pipeline.Decider[S]
	serdes  Serdes
	codec   *snapshotCodec[S]
	logger  *slog.Logger
	metrics *metrics
	dlqLog  rateLimited
	// topic names, made once: every record a batch writes names one.
	commands, events, state, dlq, dedupTopic string
	// now is the processor's clock (time.Now; tests move it).
	now func() time.Time
	// batchMaxBytes bounds the producer's batches, digestsPerRecord the
	// ids in a dedup changelog record: both fit the smallest
	// max.message.bytes of the topics written (checkTopics).
	batchMaxBytes    int32
	digestsPerRecord int
	// maxCommandAge is Config.MaxCommandAge, or what the commands topic's
	// retention makes of it (checkTopics).
	maxCommandAge time.Duration

	// parts holds the state of each assigned partition. Rebalances are
	// blocked while a batch runs, so a partition's state never changes
	// under a batch; the mutex guards the map itself, which restores of
	// newly assigned partitions write while a batch of other partitions
	// may be running, and readers outside the loop (State, metrics).
	mu    sync.Mutex
	parts map[int32]*table
	ids   map[int32]*idStore // each partition's dedup memory

	// refused holds the commands whose decision the broker refused for
	// good in an aborted batch (a snapshot or an event over its size
	// limit), each with the broker's error: deciding them again would be
	// refused again, so the next batch sends them to the DLQ instead.
	// Entries go when the command is set aside or its partition leaves.
	refused map[digest]refusedCommand
	// blocked holds the partitions the consumer stopped at a batch that
	// decompresses beyond the bound (blocked.go), until an operator skips
	// it or the partition leaves; skips carries the operators' requests to
	// the session's goroutine.
	blocked map[int32]*kgo.ErrDecompressTooLarge
	skips   chan skipRequest

	ready chan struct{}
	once  sync.Once
}

// New returns a processor. decider may be a *pipeline.Aggregate (deciders
// registered per command type: a command of any other type goes to the
// DLQ) or any other pipeline.Decider.
func New[S any](cfg Config, kcfg kafka.Config, decider pipeline.Decider[S], serdes Serdes, logger *slog.Logger, reg prometheus.Registerer) (*Processor[S], error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if decider == nil || serdes.Commands == nil || serdes.Events == nil || serdes.State == nil {
		return nil, errors.New("processor: a decider and the three serdes are required")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	codec, err := newSnapshotCodec[S](ctx, serdes.State)
	if err != nil {
		return nil, fmt.Errorf("processor: %w", err)
	}
	return &Processor[S]{
		cfg: cfg, kafka: kcfg, tracer: tracing.New(kcfg.TracerProvider), decider: decider, serdes: serdes, codec: codec,
		commands: cfg.Topics.Commands(), events: cfg.Topics.Events(), state: cfg.Topics.State(), dlq: cfg.Topics.DLQ(),
		dedupTopic: cfg.Topics.Dedup(), now: cfg.now,
		batchMaxBytes: defaultBatchMaxBytes, digestsPerRecord: maxDigestsPerRecord, maxCommandAge: cmp.Or(cfg.MaxCommandAge, DefaultMaxCommandAge),
		logger:  logger.With("component", "processor", "instance", cfg.InstanceID),
		metrics: newMetrics(reg),
		parts:   make(map[int32]*table),
		ids:     make(map[int32]*idStore),
		refused: make(map[digest]refusedCommand),
		blocked: make(map[int32]*kgo.ErrDecompressTooLarge),
		skips:   make(chan skipRequest),
		ready:   make(chan struct{}),
	}, nil
}

// Ready is closed once the processor has joined its group and restored
// the state of its partitions.
func (p *Processor[S]) Ready() <-chan struct{} { return p.ready }

func (p *Processor[S]) markReady() { p.once.Do(func() { close(p.ready) }) }

// errSession marks a failure that ends a session but not the processor:
// the outcome of a transaction is unknown (EndTxn failed after it was
// sent), or the producer was fenced (this instance was a zombie). The
// processor drops its state and starts a new session, which fences any
// transaction of the old one, rejoins the group and restores state, so
// whatever the broker decided, the new session starts from it — unless
// another process has taken its transactional id meanwhile (fence.go).
type errSession struct {
	err error
	// producer is the ended session's producer id and epoch, when it
	// had one: what checkNotReplaced asks the coordinator about.
	producer *producerEpoch
}

func (e *errSession) Error() string { return e.err.Error() }
func (e *errSession) Unwrap() error { return e.err }

// giveUpAfter is how long sessions may keep failing without committing
// anything before Run gives up (and the process exits, for its supervisor
// to restart): long enough to ride out a broker restart.
const giveUpAfter = 2 * time.Minute

// Run processes until ctx ends. It finishes the batch in flight (its
// transaction commits or aborts) and leaves the group before returning nil.
// It returns an error when sessions keep failing (giveUpAfter) and when
// another process has taken this instance's transactional id (an
// ErrReplaced).
func (p *Processor[S]) Run(ctx context.Context) error {
	restoreCl, err := p.kafka.NewClient()
	if err != nil {
		return err
	}
	defer restoreCl.Close()
	if err := p.checkTopics(ctx, restoreCl); err != nil {
		return err
	}

	var failingSince time.Time
	backoff := 250 * time.Millisecond
	var prev *producerEpoch // the last failed session's producer
	for {
		committed, err := p.session(ctx, restoreCl, prev)
		p.dropAll()
		if ctx.Err() != nil {
			return nil
		}
		var se *errSession
		if !errors.As(err, &se) {
			return err
		}
		prev = se.producer
		if committed || failingSince.IsZero() {
			failingSince, backoff = time.Now(), 250*time.Millisecond
		} else if time.Since(failingSince) > giveUpAfter {
			return fmt.Errorf("sessions failed for %s without committing: %w", time.Since(failingSince).Round(time.Second), err)
		}
		p.metrics.sessions.Inc()
		p.logger.Warn("starting a new session", "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// consumerOpts are the options of the consuming client common to both
// delivery modes.
func (p *Processor[S]) consumerOpts(restoreCl *kgo.Client) ([]kgo.Opt, error) {
	t := p.cfg.Topics
	opts, err := p.kafka.Opts()
	if err != nil {
		return nil, err
	}
	opts = append(opts, kafka.GroupMember(p.cfg.Group, t.Commands(), p.cfg.SessionTimeout)...)
	return append(opts,
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.ProducerBatchMaxBytes(p.batchMaxBytes),
		kgo.RecordPartitioner(statePartitioner{state: t.State(), dedup: t.Dedup(), keyed: kgo.StickyKeyPartitioner(nil)}),
		// Offsets are fetched with RequireStable, which waits for the
		// previous owner's transaction; only then is the state read, so it
		// includes everything those offsets cover.
		kgo.AdjustFetchOffsetsFn(func(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
			var parts []int32
			for part := range offsets[t.Commands()] {
				parts = append(parts, part)
			}
			if err := p.restoreAll(ctx, restoreCl, parts); err != nil {
				return nil, err
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
	), nil
}

// session is one membership of the group with one transactional producer.
// It reports whether it committed any transaction. prev is the producer of
// the session before, when that one failed: the coordinator is asked
// whether it still holds the transactional id before this session
// initializes the id afresh, which fences whoever holds it
// (checkNotReplaced) — at once before, after the backoff, so that another
// process has as little time as can be to take the id in between.
func (p *Processor[S]) session(ctx context.Context, restoreCl *kgo.Client, prev *producerEpoch) (committed bool, err error) {
	if p.cfg.atLeastOnce {
		return p.sessionAtLeastOnce(ctx, restoreCl)
	}
	if err := p.checkNotReplaced(ctx, restoreCl, prev); err != nil {
		return false, err
	}
	opts, err := p.consumerOpts(restoreCl)
	if err != nil {
		return false, err
	}
	opts = append(opts,
		kgo.TransactionalID(p.cfg.TransactionalID()),
		kgo.TransactionTimeout(p.cfg.TransactionTimeout),
	)
	sess, err := kgo.NewGroupTransactSession(opts...)
	if err != nil {
		return false, fmt.Errorf("processor client: %w", err)
	}
	defer sess.Close()
	p.logger.Info("processor session started", "group", p.cfg.Group, "transactional_id", p.cfg.TransactionalID())
	p.fencePredecessor(ctx, sess.Client())

	for {
		// With a partition blocked, the poll wakes now and then for an
		// operator's skip: the blocked partition fetches nothing, and the
		// others may have nothing either.
		pollCtx, cancel := ctx, context.CancelFunc(func() {})
		if p.hasBlocked() {
			pollCtx, cancel = context.WithTimeout(ctx, blockedPollInterval)
		}
		fetches := sess.PollRecords(pollCtx, p.cfg.MaxPollRecords)
		cancel()
		if ctx.Err() != nil || fetches.IsClientClosed() {
			sess.AllowRebalance()
			return committed, nil
		}
		p.logFetchErrors(fetches)
		ok, err := p.transactAndSkip(ctx, sess, fetches)
		sess.AllowRebalance()
		committed = committed || ok
		if err != nil {
			// The producer's epoch goes with a session's failure, whichever
			// transaction failed: the next session asks the coordinator
			// whether it still holds the id before it fences anyone
			// (checkNotReplaced).
			var se *errSession
			if errors.As(err, &se) {
				se.producer = producerOf(ctx, sess.Client())
			}
			return committed, err
		}
	}
}

// transactAndSkip handles one poll's records, if any, in one transaction,
// then the operators' skips of blocked batches, and reports whether any
// transaction committed.
func (p *Processor[S]) transactAndSkip(ctx context.Context, sess *kgo.GroupTransactSession, fetches kgo.Fetches) (bool, error) {
	committed := false
	if fetches.NumRecords() > 0 {
		ok, err := p.transact(ctx, sess, fetches.Records())
		if err != nil {
			return false, err
		}
		committed = ok
	}
	ok, err := p.serveSkips(ctx, sess)
	return committed || ok, err
}

func (p *Processor[S]) logFetchErrors(fetches kgo.Fetches) {
	fetches.EachError(func(topic string, part int32, err error) {
		if tl, ok := kafka.BatchTooLarge(err); ok && topic == p.commands {
			p.block(tl)
			return
		}
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && !kafka.OverBudget(err) {
			p.logger.Warn("fetch error", "topic", topic, "partition", part, "err", err)
		}
	})
}

// transact handles one poll batch in one transaction and reports whether
// it committed. An aborted transaction is not an error: the session has
// rewound to the committed offsets and the batch is decided again, from the
// same state, into the same events with the same ids. An error is an
// errSession when the outcome is unknown or the producer fenced.
func (p *Processor[S]) transact(ctx context.Context, sess *kgo.GroupTransactSession, records []*kgo.Record) (bool, error) {
	start := time.Now()
	// The transaction is ended even when ctx is canceled meanwhile:
	// shutdown finishes the batch in flight. But it is not waited for past
	// the transaction timeout, when the broker aborts it anyway: kgo's End
	// forces a heartbeat before it commits the offsets and waits for the
	// group's heartbeat loop to take it, which never happens while the
	// member is rejoining (after this process was paused past its session,
	// say). Without a deadline End waited forever, and so did the
	// partitions (the chaos harness found it, seed 21).
	txCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.TransactionTimeout)
	defer cancel()
	if err := sess.Begin(); err != nil {
		return false, &errSession{err: fmt.Errorf("begin transaction: %w", err)}
	}
	cl := sess.Client()
	// The transaction's span links to each command's receive span
	// (docs/observability.md).
	links := tracing.Links(p.tracer, records, func(r *kgo.Record) context.Context { return r.Context })
	_, span := p.tracer.Batch(ctx, "onceflow.processor.transaction", links, trace.WithAttributes(attribute.Int("onceflow.batch.size", len(records))))
	defer span.End()
	b := newBatch(p, txCtx, cl, kgo.AbortingFirstErrPromise(cl))
	for _, r := range records {
		b.handle(r)
	}
	if b.failed == nil {
		b.snapshot()
	}
	// Wait for the records first, so the commit's own price (offsets,
	// heartbeat, EndTxn) is measured apart; End would flush anyway.
	cl.Flush(txCtx)
	commitStart := time.Now()
	// End gets a timeout of its own: a batch that took all of txCtx must
	// still be able to abort.
	endCtx, cancelEnd := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.TransactionTimeout)
	defer cancelEnd()
	committed, err := sess.End(endCtx, kgo.TransactionEndTry(b.promise.Err() == nil && txCtx.Err() == nil))
	p.metrics.commit.Observe(time.Since(commitStart).Seconds())
	if err != nil {
		span.SetStatus(codes.Error, "end transaction: "+err.Error())
		p.metrics.transactions.WithLabelValues("unknown").Inc()
		// kgo: "No returned error is retryable": the commit may or may
		// not have happened. Only a new session can tell.
		return false, &errSession{err: fmt.Errorf("end transaction: %w", err)}
	}
	if !committed {
		span.SetStatus(codes.Error, "aborted")
		p.metrics.transactions.WithLabelValues("aborted").Inc()
		p.logger.Warn("transaction aborted; the batch will be decided again", "records", len(records),
			"produce_err", b.promise.Err(), "err", b.failed)
		if p.learnRefused(b) {
			return false, nil // decided again at once, the refused commands to the DLQ
		}
		if b.failed != nil || b.promise.Err() != nil {
			// Give what failed (the schema registry, the broker refusing a
			// record) a moment rather than spinning on it.
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
		return false, nil
	}
	p.metrics.transactions.WithLabelValues("committed").Inc()
	p.metrics.batch.Observe(time.Since(start).Seconds())
	b.commit()
	return true, nil
}

// learnRefused blames one command for an aborted batch whose records the
// broker refused for good, and reports whether it did: the command whose
// refused event or command record is the largest, else (only snapshots
// were refused) the last command that changed the largest refused
// snapshot's aggregate. The broker refuses a record batch as a whole, so a
// refused record may be innocent; but the producer's batches stay under
// the broker's default limit, so with that limit (or a larger one) the
// largest refused record is one the broker can never take. One command
// per round: if the batch is refused again, the next round blames the
// next.
func (p *Processor[S]) learnRefused(b *batch[S]) bool {
	b.refusedMu.Lock()
	defer b.refusedMu.Unlock()
	suspects := slices.DeleteFunc(slices.Clone(b.refused), func(r refusal) bool { return r.snapshot })
	if len(suspects) == 0 {
		suspects = b.refused
	}
	if len(suspects) == 0 {
		return false
	}
	worst := slices.MaxFunc(suspects, func(x, y refusal) int { return cmp.Compare(x.size, y.size) })
	p.logger.Warn("the broker refused a command's decision for good; the command goes to the DLQ",
		"partition", worst.part, "err", worst.err)
	p.mu.Lock()
	p.refused[worst.cmd] = refusedCommand{worst.part, worst.err}
	p.mu.Unlock()
	return true
}

// refusedCommand is a command whose decision the broker refused for good.
type refusedCommand struct {
	partition int32
	err       error
}

// refusedFor returns the broker's error if the command d names is one
// whose decision it refused for good.
func (p *Processor[S]) refusedFor(d digest) (error, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.refused[d]
	return r.err, ok
}

// idStore returns the dedup memory of an assigned partition, nil if it has
// none.
func (p *Processor[S]) idStore(part int32) *idStore {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ids[part]
}

// table returns the state of an assigned partition, nil if it has none.
func (p *Processor[S]) table(part int32) *table {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.parts[part]
}

// drop forgets the state of revoked or lost partitions.
func (p *Processor[S]) drop(parts []int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, part := range parts {
		delete(p.parts, part)
		delete(p.ids, part)
		delete(p.blocked, part)
	}
	for d, r := range p.refused {
		if slices.Contains(parts, r.partition) {
			delete(p.refused, d)
		}
	}
	p.updateGaugesLocked()
	if len(parts) > 0 {
		p.logger.Info("partitions revoked", "partitions", parts)
	}
}

// dropAll forgets every partition (the session ended).
func (p *Processor[S]) dropAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.parts)
	clear(p.ids)
	clear(p.refused)
	clear(p.blocked)
	p.updateGaugesLocked()
}

// updateGaugesLocked sets the gauges of what the processor holds.
func (p *Processor[S]) updateGaugesLocked() {
	aggs, ids, idBytes := 0, 0, 0
	for _, tab := range p.parts {
		aggs += tab.len()
	}
	for _, st := range p.ids {
		ids += st.len()
		idBytes += st.bytes()
	}
	p.metrics.aggregates.Set(float64(aggs))
	p.metrics.rememberedIDs.Set(float64(ids))
	p.metrics.dedupBytes.Set(float64(idBytes))
	p.metrics.blocked.Set(float64(len(p.blocked)))
}

// State returns the state of every aggregate held in memory, by aggregate
// id, decoded from its committed snapshot (for tests and debugging).
func (p *Processor[S]) State(ctx context.Context) (map[string]AggregateState[S], error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, tab := range p.parts {
		n += tab.len()
	}
	out := make(map[string]AggregateState[S], n)
	var err error
	for _, tab := range p.parts {
		tab.each(func(id, value string) {
			snap, derr := p.codec.decode(ctx, []byte(value))
			if derr != nil {
				err = fmt.Errorf("decode state of %s: %w", id, derr)
			}
			out[id] = AggregateState[S]{State: snap.State, Version: snap.Version}
		})
	}
	return out, err
}

// Remembered returns how many command ids the processor remembers for
// dedup, over its assigned partitions.
func (p *Processor[S]) Remembered() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, st := range p.ids {
		n += st.len()
	}
	return n
}

// AggregateState is one aggregate as the processor holds it.
type AggregateState[S any] struct {
	State   S
	Version int64
}

// statePartitioner sends snapshots to the partition the caller chose (the
// command's partition, so state is co-partitioned with commands whatever
// partitioner the command's producer used) and everything else by key
// (murmur2, Kafka's default, so every client agrees).
type statePartitioner struct {
	state, dedup string
	keyed        kgo.Partitioner
}

func (s statePartitioner) ForTopic(topic string) kgo.TopicPartitioner {
	if topic == s.state || topic == s.dedup {
		return manual{}
	}
	return s.keyed.ForTopic(topic)
}

type manual struct{}

func (manual) RequiresConsistency(*kgo.Record) bool { return true }
func (manual) Partition(r *kgo.Record, _ int) int   { return int(r.Partition) }

// rateLimited logs at most one message per interval and counts the rest,
// for logs in the per-record path (a burst of poison records).
type rateLimited struct {
	last       atomic.Int64 // unix nanos of the last logged message
	suppressed atomic.Int64
}

const logInterval = time.Second

func (r *rateLimited) log(l *slog.Logger, msg string, args ...any) {
	now := time.Now().UnixNano()
	last := r.last.Load()
	if now-last < int64(logInterval) || !r.last.CompareAndSwap(last, now) {
		r.suppressed.Add(1)
		return
	}
	if n := r.suppressed.Swap(0); n > 0 {
		args = append(args, "suppressed", n)
	}
	l.Warn(msg, args...)
}
