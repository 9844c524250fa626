package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/postgres"
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
	// MaxPollRecords bounds a batch (one Postgres transaction). Default 2000.
	MaxPollRecords int
	// MaxBackoff caps the wait between retries while Postgres is
	// unavailable. Default 5s.
	MaxBackoff time.Duration
}

func (c *Config) setDefaults() error {
	if c.Topic == "" {
		return errors.New("projector: Topic is required")
	}
	if c.Consumer == "" {
		c.Consumer = "onceflow-projector"
	}
	if c.MaxPollRecords == 0 {
		c.MaxPollRecords = 2000
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 5 * time.Second
	}
	return nil
}

// Projector applies events to projections.
type Projector struct {
	cfg         Config
	kafka       kafka.Config
	pool        *pgxpool.Pool
	dec         Decoder
	projections []pipeline.Projection[pgx.Tx]
	logger      *slog.Logger
	metrics     *metrics

	mu     sync.Mutex
	parked map[int32]string // partition -> why

	ready chan struct{}
	once  sync.Once
}

// New returns a projector applying projections, in order, to each event.
func New(cfg Config, kcfg kafka.Config, pool *pgxpool.Pool, dec Decoder, projections []pipeline.Projection[pgx.Tx], logger *slog.Logger, reg prometheus.Registerer) (*Projector, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Projector{
		cfg: cfg, kafka: kcfg, pool: pool, dec: dec, projections: projections,
		logger:  logger.With("component", "projector", "consumer", cfg.Consumer),
		metrics: newMetrics(reg, cfg.Consumer),
		parked:  make(map[int32]string),
		ready:   make(chan struct{}),
	}, nil
}

// Ready is closed once the projector has joined its group and loaded its
// offsets.
func (p *Projector) Ready() <-chan struct{} { return p.ready }

func (p *Projector) markReady() { p.once.Do(func() { close(p.ready) }) }

// Parked returns the parked partitions and why.
func (p *Projector) Parked() map[int32]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[int32]string, len(p.parked))
	for k, v := range p.parked {
		out[k] = v
	}
	return out
}

// Run projects until ctx ends. The batch in flight either commits or is
// rolled back (and read again after a restart); Run then leaves the group.
func (p *Projector) Run(ctx context.Context) error {
	cl, err := p.kafka.NewClient(
		kgo.ConsumerGroup(p.cfg.Consumer),
		kgo.ConsumeTopics(p.cfg.Topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.AdjustFetchOffsetsFn(p.loadOffsets),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, added map[string][]int32) {
			if len(added[p.cfg.Topic]) == 0 {
				p.markReady() // a member without partitions is ready at once
			}
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, m map[string][]int32) { p.unpark(m[p.cfg.Topic]) }),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, m map[string][]int32) { p.unpark(m[p.cfg.Topic]) }),
	)
	if err != nil {
		return fmt.Errorf("projector client: %w", err)
	}
	defer cl.Close()
	p.logger.Info("projector started", "topic", p.cfg.Topic)

	for {
		fetches := cl.PollRecords(ctx, p.cfg.MaxPollRecords)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			cl.AllowRebalance()
			return nil
		}
		fetches.EachError(func(topic string, part int32, err error) {
			if !errors.Is(err, context.Canceled) {
				p.logger.Warn("fetch error", "topic", topic, "partition", part, "err", err)
			}
		})
		records := fetches.Records()
		if len(records) > 0 {
			p.applyWithRetry(ctx, cl, records)
		}
		cl.AllowRebalance()
	}
}

// applyWithRetry applies a batch, retrying while Postgres is unavailable,
// until it is applied or ctx ends (the batch is then read again later).
func (p *Projector) applyWithRetry(ctx context.Context, cl *kgo.Client, records []*kgo.Record) {
	backoff := 50 * time.Millisecond
	for {
		offsets, err := p.apply(ctx, cl, records)
		if err == nil {
			if len(offsets) > 0 {
				// Monitoring only: Postgres holds the offsets that count.
				cl.CommitOffsets(context.WithoutCancel(ctx), map[string]map[int32]kgo.EpochOffset{p.cfg.Topic: offsets}, nil)
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		p.metrics.errors.Inc()
		p.logger.Warn("apply batch failed; retrying", "err", err, "backoff", backoff, "records", len(records))
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, p.cfg.MaxBackoff)
	}
}

// event is a decoded record.
type event struct {
	pipeline.Event
	rec *kgo.Record
}

// parkError parks one partition.
type parkError struct {
	partition int32
	reason    string
	err       error
}

func (e *parkError) Error() string {
	return fmt.Sprintf("partition %d: %s: %v", e.partition, e.reason, e.err)
}

// apply applies records in one transaction and returns the next offset of
// each partition it advanced. A partition that must park is excluded and
// the rest applied again.
func (p *Projector) apply(ctx context.Context, cl *kgo.Client, records []*kgo.Record) (map[int32]kgo.EpochOffset, error) {
	for {
		var evs []event
		for _, r := range records {
			if p.isParked(r.Partition) {
				continue
			}
			ev, err := p.decode(ctx, r)
			if err != nil {
				if !poison(err) {
					return nil, err // the registry is unreachable: retry the batch
				}
				p.park(cl, &parkError{r.Partition, "undecodable", fmt.Errorf("offset %d: %w", r.Offset, err)})
				continue
			}
			evs = append(evs, ev)
		}
		evs = dropParked(evs, p)
		if len(evs) == 0 {
			return nil, nil
		}
		offsets, err := p.applyEvents(ctx, evs)
		var pe *parkError
		if errors.As(err, &pe) {
			p.park(cl, pe)
			continue // again without the parked partition
		}
		return offsets, err
	}
}

// poison reports whether a decode error is the record's own fault.
func poison(err error) bool {
	return errors.Is(err, pipeline.ErrUndecodable) || errors.Is(err, pipeline.ErrUnknownSchema) ||
		errors.Is(err, pipeline.ErrIncompatible) || errors.Is(err, errBadHeader)
}

var errBadHeader = errors.New("bad event header")

func dropParked(evs []event, p *Projector) []event {
	out := evs[:0]
	for _, e := range evs {
		if !p.isParked(e.rec.Partition) {
			out = append(out, e)
		}
	}
	return out
}

const (
	inboxSQL = `INSERT INTO inbox (consumer, event_id) SELECT $1, unnest($2::uuid[])
		ON CONFLICT DO NOTHING RETURNING event_id::text`
	saveOffsetSQL = `INSERT INTO consumer_offsets (consumer, topic, partition, next_offset, updated_at)
		VALUES ($1, $2, $3, $4, now())
		ON CONFLICT (consumer, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now()`
)

// applyEvents is one Postgres transaction over evs.
func (p *Projector) applyEvents(ctx context.Context, evs []event) (map[int32]kgo.EpochOffset, error) {
	start := time.Now()
	ids := make([]string, len(evs))
	for i, e := range evs {
		ids[i] = e.ID.String()
	}
	offsets := make(map[int32]kgo.EpochOffset)
	var applied, dups int
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, inboxSQL, p.cfg.Consumer, ids)
		if err != nil {
			return fmt.Errorf("inbox insert: %w", err)
		}
		fresh, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("inbox insert: %w", err)
		}
		isNew := make(map[string]bool, len(fresh))
		for _, id := range fresh {
			isNew[id] = true
		}
		for i, e := range evs {
			r := e.rec
			offsets[r.Partition] = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset + 1}
			if !isNew[ids[i]] {
				dups++
				continue
			}
			isNew[ids[i]] = false // the same id twice in one batch applies once
			for _, proj := range p.projections {
				err := proj.Apply(ctx, tx, e.Event)
				var gap *pipeline.VersionGapError
				switch {
				case err == nil:
				case errors.Is(err, pipeline.ErrDuplicate):
					dups++
				case errors.As(err, &gap):
					return &parkError{r.Partition, "version-gap", fmt.Errorf("%s at offset %d: %w", proj.Name(), r.Offset, err)}
				default:
					return fmt.Errorf("%s: apply %s %s: %w", proj.Name(), e.Type(), e.ID, err)
				}
			}
			applied++
		}
		for part, off := range offsets {
			if _, err := tx.Exec(ctx, saveOffsetSQL, p.cfg.Consumer, p.cfg.Topic, part, off.Offset); err != nil {
				return fmt.Errorf("save offset: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	p.metrics.applied.Add(float64(applied))
	p.metrics.duplicates.Add(float64(dups))
	p.metrics.batch.Observe(time.Since(start).Seconds())
	return offsets, nil
}

// decode turns a record into an event.
func (p *Projector) decode(ctx context.Context, r *kgo.Record) (event, error) {
	e := event{rec: r}
	e.AggregateID = string(r.Key)
	e.Time = r.Timestamp
	var err error
	for _, h := range r.Headers {
		switch h.Key {
		case pipeline.HeaderEventID:
			e.ID, err = pipeline.ParseID(string(h.Value))
		case pipeline.HeaderCommandID:
			e.CommandID, err = pipeline.ParseID(string(h.Value))
		case pipeline.HeaderAggregateVersion:
			e.Version, err = strconv.ParseInt(string(h.Value), 10, 64)
		case pipeline.HeaderTenant:
			e.Tenant = string(h.Value)
		case pipeline.HeaderTraceparent:
			e.Traceparent = string(h.Value)
		}
		if err != nil {
			return e, fmt.Errorf("%w %s: %v", errBadHeader, h.Key, err)
		}
	}
	if e.ID.IsZero() {
		return e, fmt.Errorf("%w: no %s", errBadHeader, pipeline.HeaderEventID)
	}
	v, err := p.dec.Decode(ctx, r.Value)
	if err != nil {
		return e, err
	}
	msg, ok := v.(pipeline.Message)
	if !ok {
		return e, fmt.Errorf("%w: decoded a %T, which is not an event", pipeline.ErrIncompatible, v)
	}
	e.Payload = msg
	return e, nil
}

func (p *Projector) isParked(part int32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.parked[part]
	return ok
}

func (p *Projector) park(cl *kgo.Client, pe *parkError) {
	p.mu.Lock()
	p.parked[pe.partition] = pe.Error()
	n := len(p.parked)
	p.mu.Unlock()
	cl.PauseFetchPartitions(map[string][]int32{p.cfg.Topic: {pe.partition}})
	if pe.reason == "version-gap" {
		p.metrics.gaps.Inc()
	}
	p.metrics.parked.Set(float64(n))
	p.logger.Error("partition parked; an operator must look at it", "partition", pe.partition, "reason", pe.reason, "err", pe.err)
}

// unpark forgets parked partitions this member no longer owns: a new owner
// (or this one after a restart) starts from the stored offsets and parks
// again if the gap is still there.
func (p *Projector) unpark(parts []int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, part := range parts {
		delete(p.parked, part)
	}
	p.metrics.parked.Set(float64(len(p.parked)))
}

const loadOffsetsSQL = `SELECT partition, next_offset FROM consumer_offsets WHERE consumer = $1 AND topic = $2`

// loadOffsets replaces the group's fetched offsets with those stored in
// Postgres; partitions without a stored offset start at the beginning.
func (p *Projector) loadOffsets(ctx context.Context, fetched map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	var stored map[int32]int64
	backoff := 50 * time.Millisecond
	for {
		rows, err := p.pool.Query(ctx, loadOffsetsSQL, p.cfg.Consumer, p.cfg.Topic)
		if err == nil {
			stored = make(map[int32]int64)
			var part int32
			var off int64
			_, err = pgx.ForEachRow(rows, []any{&part, &off}, func() error { stored[part] = off; return nil })
		}
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
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, p.cfg.MaxBackoff)
	}
	out := make(map[string]map[int32]kgo.Offset, len(fetched))
	for topic, parts := range fetched {
		out[topic] = make(map[int32]kgo.Offset, len(parts))
		for part := range parts {
			if off, ok := stored[part]; ok && topic == p.cfg.Topic {
				out[topic][part] = kgo.NewOffset().At(off).WithEpoch(-1)
			} else {
				out[topic][part] = kgo.NewOffset().AtStart()
			}
		}
	}
	p.logger.Info("partitions assigned", "offsets", len(stored))
	p.markReady()
	return out, nil
}
