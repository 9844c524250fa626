package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/tracing"
)

// Decoder decodes an event record value (the Avro serde of the events
// topic).
type Decoder interface {
	Decode(ctx context.Context, b []byte) (any, error)
}

// Config configures a projector. Zero values mean the defaults.
type Config struct {
	// Topic is the events topic ({prefix}.events). Required.
	Topic string
	// Consumer names this projector: its consumer group, its inbox rows
	// and its stored offsets. Default "onceflow-projector".
	Consumer string
	// MaxPollRecords bounds a batch (one Postgres transaction). Default 5000.
	MaxPollRecords int
	// MaxBackoff caps the wait between retries while Postgres is
	// unavailable. Default 5s.
	MaxBackoff time.Duration
	// SessionTimeout is the group session timeout: how long a member that
	// stopped answering keeps its partitions. Default 10s.
	SessionTimeout time.Duration
	// ParkCheckInterval is how often a projector with parked partitions
	// looks for an operator's `onceflow projections unpark`. Default 2s.
	ParkCheckInterval time.Duration
	// Parallelism is how many transactions apply a poll batch at once,
	// each over its own partitions (a partition's records always go to one
	// transaction, in order; aggregates, hence rows, never span
	// partitions), so Postgres can use more than one core on a batch.
	// Each uses a connection of the pool. Default 2.
	Parallelism int
	// SynchronousCommit makes each batch's commit wait for its WAL flush
	// before the next batch. Off, the default, batches commit
	// asynchronously: a database crash may lose the last ones, offsets
	// included, and the projector, which remembers what it stored, reads
	// them again (docs/projector.md#asynchronous-commit).
	SynchronousCommit bool
	// MaxUnknownFailures is how many times in a row a batch is tried when
	// a projection fails it with an error of no known kind (neither a data
	// error nor pipeline.Permanent, which park at once, nor one of the
	// transient classes, retried for as long as they last: a projection's
	// own Go error, an unusual SQLSTATE). After that the error is taken as
	// the event's: the partition parks on the event that raises it
	// (projection-error), never retried for ever. Default 10 (about 20 s
	// of backoff).
	MaxUnknownFailures int
	// Hold is a test hook called at each crash point of a batch (see
	// Hold). Nil, its default, is what production runs.
	Hold Hold
}

// The defaults of Config's settings that the application also shows.
const (
	DefaultSessionTimeout     = 10 * time.Second
	DefaultParallelism        = 2
	DefaultMaxUnknownFailures = 10
)

func (c *Config) setDefaults() error {
	if c.Topic == "" {
		return errors.New("projector: Topic is required")
	}
	if c.Consumer == "" {
		c.Consumer = DefaultConsumer
	}
	if c.MaxPollRecords == 0 {
		c.MaxPollRecords = 5000
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 5 * time.Second
	}
	if c.Parallelism <= 0 {
		c.Parallelism = DefaultParallelism
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = DefaultSessionTimeout
	}
	if c.ParkCheckInterval == 0 {
		c.ParkCheckInterval = 2 * time.Second
	}
	if c.MaxUnknownFailures <= 0 {
		c.MaxUnknownFailures = DefaultMaxUnknownFailures
	}
	return nil
}

// FetchMaxPartitionBytes bounds what one fetch returns per partition
// (Kafka's default is 1 MiB, several thousand events, which would fill a
// whole poll batch from one partition).
const FetchMaxPartitionBytes = 256 << 10

// DefaultConsumer is the consumer name (and consumer group) of a projector
// whose Config leaves it empty.
const DefaultConsumer = "onceflow-projector"

// Projector applies events to projections.
type Projector struct {
	cfg     Config
	kafka   kafka.Config
	pool    *pgxpool.Pool
	admin   *kgo.Client // describes the topic (identity.go); set by Run
	dec     Decoder
	app     *applier
	logger  *slog.Logger
	metrics *metrics

	mu       sync.Mutex
	parked   map[int32]park     // partition -> the record it stopped on, and why
	retrying map[int32]retrying // partition -> the transient error its batch is retried on
	// unpaused: partitions were parked where the client could not be
	// paused (at assignment); the poll loop pauses them.
	unpaused bool

	lastParkCheck   time.Time
	lastStoredCheck time.Time

	ready chan struct{}
	once  sync.Once
}

// New returns a projector applying projections, in order, to each batch.
func New(cfg Config, kcfg kafka.Config, pool *pgxpool.Pool, dec Decoder, projections []pipeline.Projection[pgx.Tx], logger *slog.Logger, reg prometheus.Registerer) (*Projector, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if err := checkNames(projections); err != nil {
		return nil, err
	}
	p := &Projector{
		cfg: cfg, kafka: kcfg, pool: pool, dec: dec,
		app: &applier{consumer: cfg.Consumer, topic: cfg.Topic, pool: pool, projections: projections, hold: cfg.Hold, tracer: tracing.New(kcfg.TracerProvider),
			asyncCommit: !cfg.SynchronousCommit, remembered: newOffsetMemory()},
		logger:   logger.With("component", "projector", "consumer", cfg.Consumer),
		metrics:  newMetrics(reg, cfg.Consumer),
		parked:   make(map[int32]park),
		retrying: make(map[int32]retrying),
		ready:    make(chan struct{}),
	}
	p.app.committed = p.committed
	return p, nil
}

// committed is told the events of each transaction that committed: it
// observes their age and tells ingest which commands' outcomes may have
// changed (postgres.OutcomesChannel), so their ?wait= answer at once. An
// asynchronous transaction sent that notification itself; after a
// synchronous one it follows the commit, in its own statement (see
// postgres.Notify).
func (p *Projector) committed(evs []event) {
	now := time.Now()
	for _, e := range evs {
		p.metrics.age.Observe(max(now.Sub(e.Time).Seconds(), 0))
	}
	if p.app.asyncCommit {
		return // the transaction notified
	}
	payloads := outcomePayloads(evs)
	if len(payloads) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := postgres.Notify(ctx, p.pool, postgres.OutcomesChannel, payloads...); err != nil {
		// A waiter polls too: a lost notification costs it waitPoll.
		p.logger.Debug("notify outcomes", "err", err)
	}
}

func checkNames(projections []pipeline.Projection[pgx.Tx]) error {
	seen := make(map[string]bool)
	for _, p := range projections {
		if seen[p.Name()] {
			return fmt.Errorf("projector: two projections named %q", p.Name())
		}
		seen[p.Name()] = true
	}
	return nil
}

// Ready is closed once the projector has joined its group and loaded its
// offsets.
func (p *Projector) Ready() <-chan struct{} { return p.ready }

func (p *Projector) markReady() { p.once.Do(func() { close(p.ready) }) }

// Parked returns the partitions this member has parked, and why.
func (p *Projector) Parked() map[int32]string {
	return describe(&p.mu, p.parked, func(pk park) string { return pk.reason + ": " + pk.detail })
}

// Retrying returns the partitions whose batch this member is retrying,
// and the class and text of the error it last failed with.
func (p *Projector) Retrying() map[int32]string {
	return describe(&p.mu, p.retrying, func(r retrying) string { return r.class + ": " + r.err })
}

// describe copies one of the projector's partition maps, held under mu,
// as a line for each partition.
func describe[V any](mu *sync.Mutex, m map[int32]V, line func(V) string) map[int32]string {
	mu.Lock()
	defer mu.Unlock()
	out := make(map[int32]string, len(m))
	for k, v := range m {
		out[k] = line(v)
	}
	return out
}

// Run projects until ctx ends. The batch in flight either commits or is
// rolled back (and read again after a restart); Run then leaves the group.
func (p *Projector) Run(ctx context.Context) error {
	if err := p.ensurePartitions(ctx); err != nil {
		return nil // ctx ended
	}
	admin, err := p.kafka.NewClient()
	if err != nil {
		return fmt.Errorf("projector client: %w", err)
	}
	defer admin.Close()
	p.admin = admin
	for {
		if err := p.consume(ctx); !errors.Is(err, errTopicChanged) {
			return err
		}
	}
}

// consume is a member of the group until ctx ends, or until the topic
// changes under it (errTopicChanged: Run joins again with a new client).
func (p *Projector) consume(ctx context.Context) error {
	cl, err := p.kafka.NewClient(append(kafka.GroupMember(p.cfg.Consumer, p.cfg.Topic, p.cfg.SessionTimeout),
		// Smaller per-partition fetches, so a poll batch holds several
		// partitions for its Parallelism transactions to share.
		kgo.FetchMaxPartitionBytes(FetchMaxPartitionBytes),
		kgo.DisableAutoCommit(),
		// A fetch out of the log's range is an error to look at (recheck),
		// never a silent move to the log's start or end.
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.AdjustFetchOffsetsFn(p.loadOffsets),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, added map[string][]int32) {
			if len(added[p.cfg.Topic]) == 0 {
				p.markReady() // a member without partitions is ready at once
			}
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, m map[string][]int32) { p.forget(m[p.cfg.Topic]) }),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, m map[string][]int32) { p.forget(m[p.cfg.Topic]) }),
	)...)
	if err != nil {
		return fmt.Errorf("projector client: %w", err)
	}
	defer cl.Close()
	p.logger.Info("projector started", "topic", p.cfg.Topic)

	for {
		pollCtx, cancel := ctx, context.CancelFunc(func() {})
		switch {
		case p.app.asyncCommit:
			// Wake up now and then to compare the stored offsets with what
			// was committed (checkStored) and, when parked, to see whether
			// an operator unparked.
			pollCtx, cancel = context.WithTimeout(ctx, min(storedCheckInterval, p.cfg.ParkCheckInterval))
		case p.hasParked():
			pollCtx, cancel = context.WithTimeout(ctx, p.cfg.ParkCheckInterval)
		}
		fetches := cl.PollRecords(pollCtx, p.cfg.MaxPollRecords)
		cancel()
		if ctx.Err() != nil || fetches.IsClientClosed() {
			cl.AllowRebalance()
			return nil
		}
		p.pauseUnpaused(cl)
		var tooLarge []park
		var suspect []int32 // partitions whose log is not what their offset expects
		fetches.EachError(func(topic string, part int32, err error) {
			if topic == p.cfg.Topic && (errors.Is(err, kerr.OffsetOutOfRange) || errors.Is(err, kerr.UnknownTopicID)) {
				if !p.isParked(part) {
					suspect = append(suspect, part)
				}
				return
			}
			if tl, ok := kafka.BatchTooLarge(err); ok && topic == p.cfg.Topic {
				tooLarge = append(tooLarge, park{partition: part, offset: tl.Offset, reason: reasonBatchTooLarge, skipTo: tl.NextOffset,
					detail: fmt.Sprintf("the batch at offsets %d to %d decompresses beyond KAFKA_MAX_DECOMPRESS_BATCH_BYTES: raise it if the batch is legitimate, or skip it (onceflow projections skip)",
						tl.Offset, tl.NextOffset-1)})
				return
			}
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && !kafka.OverBudget(err) {
				p.logger.Warn("fetch error", "topic", topic, "partition", part, "err", err)
			}
		})
		var records []*kgo.Record
		fetches.EachRecord(func(r *kgo.Record) {
			if !p.isParked(r.Partition) {
				records = append(records, r)
			}
		})
		if len(records) > 0 {
			p.processAll(ctx, cl, records)
		}
		if len(tooLarge) > 0 {
			p.parkTooLarge(ctx, cl, tooLarge)
		}
		if len(suspect) > 0 {
			if err := p.recheck(ctx, cl, suspect); err != nil {
				cl.AllowRebalance()
				return err
			}
		}
		p.checkUnparked(ctx, cl)
		if p.app.asyncCommit {
			p.checkStored(ctx, cl)
		}
		cl.AllowRebalance()
	}
}

func (p *Projector) ensurePartitions(ctx context.Context) error {
	wait := 50 * time.Millisecond
	for {
		err := ensureInboxPartitions(ctx, p.pool)
		if err == nil || ctx.Err() != nil {
			return ctx.Err()
		}
		p.logger.Warn("create inbox partitions: retrying", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = backoff(wait, p.cfg.MaxBackoff)
	}
}

// processAll applies a poll batch in up to Parallelism transactions over
// disjoint partitions, then commits the offsets they stored to Kafka.
func (p *Projector) processAll(ctx context.Context, cl *kgo.Client, records []*kgo.Record) {
	groups := splitByPartition(records, p.cfg.Parallelism)
	nexts := make([]map[int32]kgo.EpochOffset, len(groups))
	rewinds := make([]map[int32]int64, len(groups))
	if len(groups) == 1 {
		nexts[0], rewinds[0] = p.process(ctx, cl, groups[0])
	} else {
		var wg sync.WaitGroup
		for i, g := range groups {
			wg.Add(1)
			go func() {
				defer wg.Done()
				nexts[i], rewinds[i] = p.process(ctx, cl, g)
			}()
		}
		wg.Wait()
	}
	next := map[int32]kgo.EpochOffset{}
	rewind := map[int32]int64{}
	for i, n := range nexts {
		for part, eo := range n {
			next[part] = eo
		}
		for part, off := range rewinds[i] {
			rewind[part] = off
		}
	}
	p.rewind(cl, rewind)
	if len(next) > 0 {
		// Monitoring only: Postgres holds the offsets that count.
		cl.CommitOffsets(context.WithoutCancel(ctx), map[string]map[int32]kgo.EpochOffset{p.cfg.Topic: next}, nil)
	}
}

// rewind reads partitions again from the given offsets, where the
// database's stored offsets are behind what this projector committed. It
// runs on the poll's goroutine, before AllowRebalance, as kgo asks of
// SetOffsets: the records fetched after these offsets are dropped and
// fetched again.
func (p *Projector) rewind(cl *kgo.Client, to map[int32]int64) {
	if len(to) == 0 {
		return
	}
	set := make(map[int32]kgo.EpochOffset, len(to))
	for part, off := range to {
		set[part] = kgo.EpochOffset{Epoch: -1, Offset: off}
	}
	cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{p.cfg.Topic: set})
	for part, off := range to {
		p.app.remembered.set(part, off)
		p.metrics.rewinds.Inc()
		p.logger.Warn("stored offset behind what this projector committed: the database lost commits (a crash after asynchronous commits) or an operator moved it back; reading the partition again from it",
			"partition", part, "offset", off)
	}
}

// storedCheckInterval is how often an idle projector compares the offsets
// it committed with the database's: a crash that loses asynchronous
// commits is found within about that long of the database coming back,
// even when no new event arrives on the partitions it set back.
const storedCheckInterval = time.Second

// checkStored rewinds the partitions whose stored offset is behind what
// this projector last committed or loaded (docs/projector.md#asynchronous-commit).
// A batch's transaction finds the same when it locks the offsets; this
// finds it on a partition that gets no new events.
func (p *Projector) checkStored(ctx context.Context, cl *kgo.Client) {
	if time.Since(p.lastStoredCheck) < storedCheckInterval {
		return
	}
	p.lastStoredCheck = time.Now()
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	rows, err := p.pool.Query(qctx, loadOffsetsSQL, p.cfg.Consumer, p.cfg.Topic)
	if err != nil {
		return // the database is away: checked again when it is back
	}
	stored := map[int32]int64{}
	var part int32
	var off int64
	if _, err := pgx.ForEachRow(rows, []any{&part, &off}, func() error { stored[part] = off; return nil }); err != nil {
		return
	}
	back := map[int32]int64{}
	for part, last := range p.app.remembered.snapshot() {
		if p.isParked(part) {
			continue // not fetched; unparking seeks to the stored offset
		}
		if off := stored[part]; off < last { // no row: the lost commits were its first
			back[part] = off
		}
	}
	p.rewind(cl, back)
}

// splitByPartition splits records into at most n groups of whole
// partitions with about as many records each, keeping their order.
func splitByPartition(records []*kgo.Record, n int) [][]*kgo.Record {
	if n <= 1 {
		return [][]*kgo.Record{records}
	}
	count := map[int32]int{}
	for _, r := range records {
		count[r.Partition]++
	}
	if len(count) == 1 {
		return [][]*kgo.Record{records}
	}
	parts := make([]int32, 0, len(count))
	for part := range count {
		parts = append(parts, part)
	}
	slices.SortFunc(parts, func(a, b int32) int { return count[b] - count[a] })
	n = min(n, len(parts))
	load := make([]int, n)
	group := map[int32]int{}
	for _, part := range parts {
		g := slices.Index(load, slices.Min(load))
		group[part] = g
		load[g] += count[part]
	}
	out := make([][]*kgo.Record, n)
	for _, r := range records {
		out[group[r.Partition]] = append(out[group[r.Partition]], r)
	}
	return out
}

// process decodes and applies a batch, retrying while Postgres (or the
// schema registry) is unavailable, until it is applied or ctx ends (the
// batch is then read again from the stored offsets later), and returns the
// offsets it stored, and the partitions to read again from an earlier
// offset (a rewindError: their records are left out of the batch).
// Retrying is never silent: each failure is counted by class, its
// partitions show as retrying (in the metrics, and in projector_retrying
// for `onceflow lag`), and it is logged at its first failure and then
// every retryLogInterval.
func (p *Projector) process(ctx context.Context, cl *kgo.Client, records []*kgo.Record) (next map[int32]kgo.EpochOffset, rewind map[int32]int64) {
	wait := 50 * time.Millisecond
	var f failures
	for {
		start := time.Now()
		blame := 0
		if f.unknown >= p.cfg.MaxUnknownFailures {
			blame = f.unknown
		}
		res, err := p.processOnce(ctx, records, blame)
		var rw *rewindError
		if errors.As(err, &rw) {
			if rewind == nil {
				rewind = make(map[int32]int64)
			}
			kept := records[:0:0]
			for _, r := range records {
				if _, back := rw.to[r.Partition]; !back {
					kept = append(kept, r)
				}
			}
			for part, off := range rw.to {
				rewind[part] = off
			}
			if records = kept; len(records) == 0 {
				return nil, rewind
			}
			continue
		}
		if err == nil {
			if f.n > 0 {
				p.recovered(records, &f)
			}
			p.metrics.batch.Observe(time.Since(start).Seconds())
			p.metrics.applied.Add(float64(res.applied))
			p.metrics.duplicates.Add(float64(res.duplicates))
			p.metrics.fenced.Add(float64(res.fenced))
			for _, pk := range res.parks {
				p.park(cl, pk)
			}
			return res.next, rewind
		}
		if ctx.Err() != nil {
			return nil, rewind
		}
		if postgres.IsMissingPartition(err, "inbox") {
			if perr := ensureInboxPartitions(ctx, p.pool); perr == nil {
				continue
			}
		}
		p.failed(ctx, records, err, &f, wait)
		select {
		case <-ctx.Done():
			return nil, rewind
		case <-time.After(wait):
		}
		wait = backoff(wait, p.cfg.MaxBackoff)
	}
}

// parkTooLarge parks partitions the consumer stopped at a batch that
// decompresses beyond the bound: the park is written in a transaction of
// its own (the stored offset at the batch, skip_to past it), retried like
// any batch, and the partition is paused like any parked one.
func (p *Projector) parkTooLarge(ctx context.Context, cl *kgo.Client, parks []park) {
	wait := 50 * time.Millisecond
	for {
		res, err := p.app.apply(ctx, nil, parks)
		if err == nil {
			for _, pk := range res.parks {
				p.park(cl, pk)
			}
			return
		}
		if ctx.Err() != nil {
			return // the partition stops at the batch again after a restart
		}
		p.logger.Warn("park a partition at a batch too large to read: retrying", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = backoff(wait, p.cfg.MaxBackoff)
	}
}

func (p *Projector) processOnce(ctx context.Context, records []*kgo.Record, blame int) (result, error) {
	evs, parks, err := decodeAll(ctx, p.dec, records)
	if err != nil {
		return result{}, fmt.Errorf("%w: %w", errRegistry, err)
	}
	return p.app.applyBlaming(ctx, evs, parks, blame)
}

// partitionsOf returns the partitions of records, sorted.
func partitionsOf(records []*kgo.Record) []int32 {
	var parts []int32
	for _, r := range records {
		if len(parts) == 0 || parts[len(parts)-1] != r.Partition {
			parts = append(parts, r.Partition)
		}
	}
	slices.Sort(parts)
	return slices.Compact(parts)
}

const loadOffsetsSQL = `SELECT partition, next_offset FROM consumer_offsets WHERE consumer = $1 AND topic = $2`

// loadOffsets replaces the group's fetched offsets with those stored in
// Postgres; partitions without a stored offset start at the beginning. A
// stored offset that does not fit the topic as it is now (another
// cluster's or topic's, or out of its log) parks its partition instead
// (checkAssigned).
func (p *Projector) loadOffsets(ctx context.Context, fetched map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	var stored map[int32]storedOffset
	wait := 50 * time.Millisecond
	for {
		var err error
		stored, err = loadStored(ctx, p.pool, p.cfg.Consumer, p.cfg.Topic)
		if err == nil {
			break
		}
		if !postgres.IsUnavailable(err) || ctx.Err() != nil {
			return nil, fmt.Errorf("load offsets: %w", err)
		}
		p.logger.Warn("load offsets: postgres unavailable, retrying", "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = backoff(wait, p.cfg.MaxBackoff)
	}
	var parts []int32
	for part := range fetched[p.cfg.Topic] {
		parts = append(parts, part)
	}
	parks, err := p.checkAssigned(ctx, stored, parts)
	if err != nil {
		return nil, fmt.Errorf("check stored offsets: %w", err)
	}
	for _, pk := range parks {
		p.markParked(pk)
	}
	out := make(map[string]map[int32]kgo.Offset, len(fetched))
	for topic, parts := range fetched {
		out[topic] = make(map[int32]kgo.Offset, len(parts))
		for part := range parts {
			if s, ok := stored[part]; ok && topic == p.cfg.Topic {
				out[topic][part] = kgo.NewOffset().At(s.offset).WithEpoch(-1)
				if !p.isParked(part) {
					p.app.remembered.set(part, s.offset)
				}
			} else {
				out[topic][part] = kgo.NewOffset().AtStart()
				if topic == p.cfg.Topic {
					p.app.remembered.set(part, 0) // a first commit lost is a rewind to the start too
				}
			}
		}
	}
	p.logger.Info("partitions assigned", "offsets", len(stored), "parked", len(parks))
	p.markReady()
	return out, nil
}
