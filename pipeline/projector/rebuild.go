package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
)

// Rebuildable is a projection that can be rebuilt from the events topic
// into shadow tables and swapped in (`onceflow projections rebuild NAME`).
// Its SQL must name its tables without a schema: a rebuild points them at
// the shadow tables through the search path.
type Rebuildable interface {
	// Tables names the tables the projection writes, and nothing else
	// writes (see SwapHook for the exceptions).
	Tables() []string
}

// SwapHook is implemented by a rebuildable projection whose tables also
// hold rows it does not derive from events (command_status's pending rows,
// which ingest writes): BeforeSwap copies them from the live table to the
// rebuilt one. It runs in the swap transaction with the live table locked
// against writers; live and shadow are quoted, schema-qualified names.
type SwapHook interface {
	BeforeSwap(ctx context.Context, tx pgx.Tx, table, live, shadow string) error
}

// RebuildConfig configures a rebuild. Zero values mean the defaults.
type RebuildConfig struct {
	// Topic is the events topic. Required.
	Topic string
	// Consumer is the live projector's consumer. Default DefaultConsumer.
	Consumer string
	// Projection is the projection to rebuild. It must be Rebuildable.
	Projection pipeline.Projection[pgx.Tx]
	// Restart abandons a rebuild of the same projection left unfinished
	// (its shadow tables are dropped) instead of resuming it.
	Restart bool
	// Verify computes, inside the swap transaction, a checksum of every
	// live table and of its rebuilt replacement (at the same offsets), and
	// reports them. It holds the tables locked meanwhile: keep it for
	// tests and small tables.
	Verify bool
	// MaxPollRecords bounds a batch. Default 5000.
	MaxPollRecords int
	// SwapWithin is how close (in offsets, summed over partitions) the
	// shadow must be to the live projector before a swap is tried; the
	// rest is applied inside the swap transaction. Default MaxPollRecords.
	SwapWithin int64
	// LockTimeout bounds each wait for a lock in the swap transaction, so
	// readers never wait long behind it; a swap that times out is tried
	// again. Default 2s.
	LockTimeout time.Duration
	// SwapAttempts is how many swaps are tried before giving up. Default 30.
	SwapAttempts int
	// Progress, if set, is called now and then while building.
	Progress func(RebuildProgress)
}

// RebuildProgress is how far a rebuild is.
type RebuildProgress struct {
	Applied int64 // events applied to the shadow tables by this run
	Behind  int64 // offsets between the shadow and the live projector
}

// RebuildResult is what a finished rebuild did.
type RebuildResult struct {
	Projection     string
	ShadowConsumer string
	// Offsets are the live projector's offsets at the swap, which the
	// rebuilt tables reflect exactly.
	Offsets  map[int32]int64
	Applied  int64 // events applied by this run (a resumed rebuild applied others before)
	Tables   []SwappedTable
	Duration time.Duration
	// LiveParked are the live projector's parked partitions at the swap:
	// unpark them to try their record again against the rebuilt tables.
	LiveParked []int32
}

// SwappedTable is one table replaced by a rebuild; the row counts and
// checksums are filled when RebuildConfig.Verify is set.
type SwappedTable struct {
	Name                          string
	LiveRows, RebuiltRows         int64
	LiveChecksum, RebuiltChecksum string
}

// ErrRebuildRunning is returned when another process is rebuilding the
// same projection.
var ErrRebuildRunning = errors.New("a rebuild of this projection is already running")

// Rebuild builds one projection's tables again from the start of the
// events topic into shadow tables, while the live projector keeps serving
// and advancing, then swaps them in; see the package doc.
type Rebuild struct {
	cfg    RebuildConfig
	kafka  kafka.Config
	live   *pgxpool.Pool
	dec    Decoder
	logger *slog.Logger
	tables []string
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,40}$`)

// NewRebuild prepares a rebuild; pool is the database the live projector
// writes.
func NewRebuild(cfg RebuildConfig, kcfg kafka.Config, pool *pgxpool.Pool, dec Decoder, logger *slog.Logger) (*Rebuild, error) {
	if cfg.Topic == "" {
		return nil, errors.New("rebuild: Topic is required")
	}
	if cfg.Projection == nil {
		return nil, errors.New("rebuild: Projection is required")
	}
	rb, ok := cfg.Projection.(Rebuildable)
	if !ok || len(rb.Tables()) == 0 {
		return nil, fmt.Errorf("projection %q cannot be rebuilt: it does not name its tables", cfg.Projection.Name())
	}
	if !nameRE.MatchString(cfg.Projection.Name()) {
		return nil, fmt.Errorf("projection name %q: a rebuild needs a name of lowercase letters, digits and _", cfg.Projection.Name())
	}
	if cfg.Consumer == "" {
		cfg.Consumer = DefaultConsumer
	}
	if cfg.MaxPollRecords == 0 {
		cfg.MaxPollRecords = 5000
	}
	if cfg.SwapWithin == 0 {
		cfg.SwapWithin = int64(cfg.MaxPollRecords)
	}
	if cfg.LockTimeout == 0 {
		cfg.LockTimeout = 2 * time.Second
	}
	if cfg.SwapAttempts == 0 {
		cfg.SwapAttempts = 30
	}
	return &Rebuild{
		cfg: cfg, kafka: kcfg, live: pool, dec: dec, tables: rb.Tables(),
		logger: logger.With("component", "rebuild", "projection", cfg.Projection.Name(), "consumer", cfg.Consumer),
	}, nil
}

// rebuildState is one rebuild's place in Postgres.
type rebuildState struct {
	shadowConsumer string
	schema         string
	startedAt      time.Time
	liveSchema     map[string]string // table -> schema of the live table
	searchPath     string            // the live connections' search_path
}

func (s *rebuildState) live(table string) string {
	return pgx.Identifier{s.liveSchema[table], table}.Sanitize()
}

func (s *rebuildState) shadow(table string) string {
	return pgx.Identifier{s.schema, table}.Sanitize()
}

// Run rebuilds and swaps, and returns once the rebuilt tables serve, or
// with an error that leaves the live tables as they were (a later Run
// resumes from the shadow's stored offsets).
func (r *Rebuild) Run(ctx context.Context) (RebuildResult, error) {
	start := time.Now()
	name := r.cfg.Projection.Name()
	res := RebuildResult{Projection: name}

	// One rebuild of a projection at a time, held for as long as this
	// session lives.
	lockConn, err := r.live.Acquire(ctx)
	if err != nil {
		return res, err
	}
	defer lockConn.Release()
	lockKey := "onceflow_rebuild:" + r.cfg.Consumer + ":" + name
	var locked bool
	if err := lockConn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended($1, 0))`, lockKey).Scan(&locked); err != nil {
		return res, err
	}
	if !locked {
		return res, fmt.Errorf("%s: %w", name, ErrRebuildRunning)
	}
	defer lockConn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, lockKey)

	st, err := r.prepare(ctx)
	if err != nil {
		return res, err
	}
	res.ShadowConsumer = st.shadowConsumer

	// The shadow's connections find its tables first and everything else
	// (inbox, offsets, other read models) where the live ones do.
	pcfg := r.live.Config().Copy()
	pcfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{st.schema}.Sanitize() + ", " + st.searchPath
	pcfg.MaxConns = 4
	shadowPool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return res, fmt.Errorf("shadow pool: %w", err)
	}
	defer shadowPool.Close()

	b := &builder{
		Rebuild: r, st: st, pool: shadowPool,
		app: &applier{consumer: st.shadowConsumer, topic: r.cfg.Topic, pool: shadowPool,
			projections: []pipeline.Projection[pgx.Tx]{r.cfg.Projection}, notBefore: st.startedAt.Add(-skew)},
	}
	if err := b.run(ctx, &res); err != nil {
		return res, err
	}
	res.Duration = time.Since(start)
	return res, nil
}

const (
	findRebuildSQL = `SELECT shadow_consumer, shadow_schema, started_at FROM projection_rebuilds
		WHERE consumer = $1 AND projection = $2 AND state = 'building'`
	abandonRebuildSQL = `UPDATE projection_rebuilds SET state = 'abandoned', finished_at = now(), detail = $3
		WHERE consumer = $1 AND projection = $2 AND state = 'building' RETURNING shadow_consumer`
	startRebuildSQL = `INSERT INTO projection_rebuilds (shadow_consumer, consumer, projection, shadow_schema, state)
		VALUES ($1, $2, $3, $4, 'building') RETURNING started_at`
	forgetConsumerSQL = `WITH o AS (DELETE FROM consumer_offsets WHERE consumer = $1)
		DELETE FROM projector_parked WHERE consumer = $1`
	liveSchemaSQL = `SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = to_regclass($1) AND c.relkind = 'r'`
	shadowTableSQL = `SELECT to_regclass($1) IS NOT NULL`
)

// prepare resumes the unfinished rebuild of this projection, or starts a
// new one: a shadow schema with empty copies of the live tables (columns,
// defaults, constraints, indexes) and a consumer name of its own.
func (r *Rebuild) prepare(ctx context.Context) (*rebuildState, error) {
	name := r.cfg.Projection.Name()
	st := &rebuildState{schema: "onceflow_rebuild_" + name, liveSchema: map[string]string{}}
	if err := r.live.QueryRow(ctx, `SELECT current_setting('search_path')`).Scan(&st.searchPath); err != nil {
		return nil, err
	}
	for _, t := range r.tables {
		var schema string
		if err := r.live.QueryRow(ctx, liveSchemaSQL, t).Scan(&schema); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return nil, fmt.Errorf("projection %s: no table %q in the search path", name, t)
			}
			return nil, err
		}
		if schema == st.schema {
			return nil, fmt.Errorf("table %s resolves to the shadow schema %s: check the search path", t, schema)
		}
		st.liveSchema[t] = schema
	}

	var existing string
	err := r.live.QueryRow(ctx, findRebuildSQL, r.cfg.Consumer, name).Scan(&st.shadowConsumer, &existing, &st.startedAt)
	switch {
	case err == nil && !r.cfg.Restart:
		complete := existing == st.schema
		for _, t := range r.tables {
			var ok bool
			if err := r.live.QueryRow(ctx, shadowTableSQL, st.shadow(t)).Scan(&ok); err != nil {
				return nil, err
			}
			complete = complete && ok
		}
		if complete {
			r.logger.Info("resuming the unfinished rebuild", "shadow_consumer", st.shadowConsumer, "started_at", st.startedAt)
			return st, nil
		}
		r.logger.Warn("the unfinished rebuild lost its shadow tables; starting again", "shadow_consumer", st.shadowConsumer)
	case err != nil && !errors.Is(err, pgx.ErrNoRows):
		return nil, err
	}

	st.shadowConsumer = shadowConsumer(r.cfg.Consumer, name, time.Now())
	err = pgx.BeginFunc(ctx, r.live, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, abandonRebuildSQL, r.cfg.Consumer, name, "replaced by "+st.shadowConsumer)
		if err != nil {
			return err
		}
		old, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		for _, c := range old {
			if _, err := tx.Exec(ctx, forgetConsumerSQL, c); err != nil {
				return err
			}
		}
		schema := pgx.Identifier{st.schema}.Sanitize()
		if _, err := tx.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
			return err
		}
		for _, t := range r.tables {
			if _, err := tx.Exec(ctx, `CREATE TABLE `+st.shadow(t)+` (LIKE `+st.live(t)+` INCLUDING ALL)`); err != nil {
				return fmt.Errorf("create shadow of %s: %w", t, err)
			}
		}
		return tx.QueryRow(ctx, startRebuildSQL, st.shadowConsumer, r.cfg.Consumer, name, st.schema).Scan(&st.startedAt)
	})
	if err != nil {
		return nil, fmt.Errorf("start rebuild: %w", err)
	}
	r.logger.Info("rebuild started", "shadow_schema", st.schema, "shadow_consumer", st.shadowConsumer)
	return st, nil
}

// builder is one run of a rebuild: it reads the events topic partition by
// partition (no consumer group: the advisory lock makes it the only
// reader), never past the live projector's offsets.
type builder struct {
	*Rebuild
	st   *rebuildState
	pool *pgxpool.Pool
	app  *applier
	cl   *kgo.Client

	parts      []int32
	shadowNext map[int32]int64         // shadow's stored offsets
	liveNext   map[int32]int64         // live projector's offsets, last read
	held       map[int32][]*kgo.Record // fetched, not applied yet
	seen       map[int32]int64         // highest offset fetched
	parked     map[int32]park          // the shadow stopped on these records
	paused     map[int32]bool
	applied    int64
	liveAt     time.Time
}

func (b *builder) run(ctx context.Context, res *RebuildResult) error {
	meta, err := b.kafka.NewClient()
	if err != nil {
		return err
	}
	cur, logs, err := kafka.DescribeTopic(ctx, meta, b.cfg.Topic)
	meta.Close()
	if err != nil {
		return err
	}
	for p := range logs {
		b.parts = append(b.parts, p)
	}
	slices.Sort(b.parts)
	if err := b.checkIdentity(ctx, cur, logs); err != nil {
		return err
	}

	stored, err := StoredOffsets(ctx, b.Rebuild.live, b.st.shadowConsumer)
	if err != nil {
		return err
	}
	b.shadowNext = map[int32]int64{}
	start := map[int32]kgo.Offset{}
	for _, p := range b.parts {
		b.shadowNext[p] = stored[b.cfg.Topic][p]
		start[p] = kgo.NewOffset().At(b.shadowNext[p])
	}
	b.held, b.seen, b.parked, b.paused = map[int32][]*kgo.Record{}, map[int32]int64{}, map[int32]park{}, map[int32]bool{}
	for _, p := range b.parts {
		b.seen[p] = b.shadowNext[p] - 1
	}
	if err := b.readParked(ctx); err != nil {
		return err
	}
	b.cl, err = b.kafka.NewClient(
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{b.cfg.Topic: start}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NoResetOffset()), // an offset out of its log never moves silently
	)
	if err != nil {
		return err
	}
	defer b.cl.Close()

	if err := b.refreshLive(ctx); err != nil {
		return err
	}
	if len(b.liveNext) == 0 {
		return fmt.Errorf("the live projector %q has no offsets for %s: there is nothing to rebuild against (start the projector first)", b.cfg.Consumer, b.cfg.Topic)
	}
	lastReport := time.Now()
	attempts := 0
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Since(b.liveAt) > 200*time.Millisecond {
			if err := b.refreshLive(ctx); err != nil {
				return err
			}
		}
		if err := b.applyEligible(ctx); err != nil {
			return err
		}
		if err := b.stuck(); err != nil {
			return err
		}
		behind := b.behind()
		if b.cfg.Progress != nil && time.Since(lastReport) > time.Second {
			b.cfg.Progress(RebuildProgress{Applied: b.applied, Behind: behind})
			lastReport = time.Now()
		}
		if behind <= b.cfg.SwapWithin {
			attempts++
			err := b.swap(ctx, res)
			if err == nil {
				res.Applied = b.applied
				return nil
			}
			if !retrySwap(err) || attempts >= b.cfg.SwapAttempts {
				return fmt.Errorf("swap: %w", err)
			}
			b.logger.Info("swap not possible yet; catching up again", "attempt", attempts, "reason", err)
		}
		b.poll(ctx, 200*time.Millisecond)
	}
}

// readParked loads the shadow's parked partitions (a resumed rebuild).
func (b *builder) readParked(ctx context.Context) error {
	all, err := Parked(ctx, b.Rebuild.live)
	if err != nil {
		return err
	}
	for _, p := range all {
		if p.Consumer == b.st.shadowConsumer && p.Topic == b.cfg.Topic {
			b.parked[p.Partition] = park{partition: p.Partition, offset: p.Offset, reason: p.Reason, detail: p.Detail}
		}
	}
	return nil
}

func (b *builder) refreshLive(ctx context.Context) error {
	stored, err := StoredOffsets(ctx, b.Rebuild.live, b.cfg.Consumer)
	if err != nil {
		return err
	}
	b.liveNext = stored[b.cfg.Topic]
	b.liveAt = time.Now()
	return nil
}

// behind sums how far the shadow is from the live offsets.
func (b *builder) behind() int64 {
	var n int64
	for _, p := range b.parts {
		n += max(b.liveNext[p]-b.shadowNext[p], 0)
	}
	return n
}

// stuck reports a shadow partition parked before the live projector's
// offset: the rebuilt read model cannot reach the live one there.
func (b *builder) stuck() error {
	for p, pk := range b.parked {
		if b.liveNext[p] > pk.offset {
			return fmt.Errorf("the rebuild stopped on partition %d at offset %d (%s: %s) but the live projector is past it (at %d); "+
				"the shadow tables are kept for inspection: fix the cause and run the rebuild again (or with -restart)",
				p, pk.offset, pk.reason, pk.detail, b.liveNext[p])
		}
	}
	return nil
}

// poll fetches records into held, pausing partitions that have read past
// the live offset so memory stays bounded.
func (b *builder) poll(ctx context.Context, wait time.Duration) {
	pctx, cancel := context.WithTimeout(ctx, wait)
	fetches := b.cl.PollRecords(pctx, b.cfg.MaxPollRecords)
	cancel()
	fetches.EachError(func(topic string, part int32, err error) {
		if tl, ok := kafka.BatchTooLarge(err); ok {
			// The shadow stops there, as it does on any record it cannot
			// apply (stuck says so once the live projector is past it).
			if _, known := b.parked[part]; !known {
				b.parked[part] = park{partition: part, offset: tl.Offset, reason: reasonBatchTooLarge, skipTo: tl.NextOffset,
					detail: fmt.Sprintf("the batch at offsets %d to %d decompresses beyond KAFKA_MAX_DECOMPRESS_BATCH_BYTES", tl.Offset, tl.NextOffset-1)}
				b.logger.Warn("the rebuild stopped on a batch too large to read", "partition", part, "offset", tl.Offset)
			}
			return
		}
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) && !kafka.OverBudget(err) {
			b.logger.Warn("fetch error", "topic", topic, "partition", part, "err", err)
		}
	})
	fetches.EachRecord(func(r *kgo.Record) {
		if r.Offset <= b.seen[r.Partition] {
			return
		}
		b.seen[r.Partition] = r.Offset
		b.held[r.Partition] = append(b.held[r.Partition], r)
	})
	for _, p := range b.parts {
		full := len(b.held[p]) > 0 && b.held[p][len(b.held[p])-1].Offset >= b.liveNext[p]
		switch {
		case full && !b.paused[p]:
			b.cl.PauseFetchPartitions(map[string][]int32{b.cfg.Topic: {p}})
			b.paused[p] = true
		case !full && b.paused[p]:
			b.cl.ResumeFetchPartitions(map[string][]int32{b.cfg.Topic: {p}})
			b.paused[p] = false
		}
	}
}

// eligible takes from held the records below the given offsets, in order.
func (b *builder) eligible(upTo map[int32]int64, take bool) []*kgo.Record {
	var out []*kgo.Record
	for _, p := range b.parts {
		if _, stopped := b.parked[p]; stopped {
			continue
		}
		recs := b.held[p]
		n := 0
		for n < len(recs) && recs[n].Offset < upTo[p] {
			n++
		}
		out = append(out, recs[:n]...)
		if take {
			b.held[p] = recs[n:]
		}
	}
	return out
}

// applyEligible applies the held records below the live offsets, in
// batches, each in its own transaction. A batch that fails is retried;
// one that a projection's error of no known kind fails
// DefaultMaxUnknownFailures times in a row stops the rebuild's partition
// on the event that raises it, as the live projector does.
func (b *builder) applyEligible(ctx context.Context) error {
	unknowns := 0
	for {
		recs := b.eligible(b.liveNext, false)
		if len(recs) == 0 {
			return nil
		}
		if len(recs) > b.cfg.MaxPollRecords {
			recs = recs[:b.cfg.MaxPollRecords]
		}
		evs, parks, err := decodeAll(ctx, b.dec, recs)
		if err != nil {
			return fmt.Errorf("decode: %w", err)
		}
		blame := 0
		if unknowns >= DefaultMaxUnknownFailures {
			blame = unknowns
		}
		res, err := b.app.applyBlaming(ctx, evs, parks, blame)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if isProjectionError(err) && kindOf(err) == unknown {
				unknowns++
			} else {
				unknowns = 0
			}
			b.logger.Warn("apply batch failed; retrying", "err", err, "kind", kindOf(err))
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
			continue
		}
		unknowns = 0
		b.commitResult(res, recs)
	}
}

// commitResult records a committed batch: offsets, parks, and the held
// records it consumed.
func (b *builder) commitResult(res result, recs []*kgo.Record) {
	done := map[int32]int64{}
	for _, r := range recs {
		done[r.Partition] = max(done[r.Partition], r.Offset+1)
	}
	for p, eo := range res.next {
		b.shadowNext[p] = max(b.shadowNext[p], eo.Offset)
	}
	for _, pk := range res.parks {
		b.parked[pk.partition] = pk
		b.logger.Warn("the rebuild stopped on a record", "partition", pk.partition, "offset", pk.offset, "reason", pk.reason, "detail", pk.detail)
	}
	for p, upTo := range done {
		recs := b.held[p]
		n := 0
		for n < len(recs) && recs[n].Offset < upTo {
			n++
		}
		b.held[p] = recs[n:]
	}
	b.applied += int64(res.applied)
}

// ParseProjection finds a projection by name.
func ParseProjection(projections []pipeline.Projection[pgx.Tx], name string) (pipeline.Projection[pgx.Tx], error) {
	var names []string
	for _, p := range projections {
		if p.Name() == name {
			return p, nil
		}
		names = append(names, p.Name())
	}
	return nil, fmt.Errorf("no projection named %q (there are: %s)", name, strings.Join(names, ", "))
}

// shadowConsumer names a rebuild's run of projection name for the live
// consumer, started at: unique to the run (its offsets and inbox rows are
// its own), to the nanosecond, so that two rebuilds started within a
// second do not collide in projection_rebuilds.
func shadowConsumer(consumer, name string, at time.Time) string {
	return fmt.Sprintf("%s.rebuild.%s.%d", consumer, name, at.UnixNano())
}
