package projector

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/tracing"
)

// event is a decoded record with where it came from.
type event struct {
	pipeline.Event
	partition int32
	offset    int64
	epoch     int32
	trace     context.Context // the record's (kotel's receive span), nil without tracing
}

// park is a partition stopping at the record at offset.
type park struct {
	partition int32
	offset    int64
	reason    string // reasonGap, reasonUndecodable, reasonRefused, reasonDataError, reasonProjectionError, reasonBatchTooLarge, reasonTopicChanged, reasonOutOfRange
	detail    string
	// skipTo, if set, is where an operator's skip moves the partition
	// (reasonBatchTooLarge: past the whole batch); else past the record.
	skipTo int64
}

// Park reasons, as stored in projector_parked and shown by `onceflow lag`.
const (
	reasonGap         = "version-gap"
	reasonUndecodable = "undecodable"
	reasonRefused     = "rejected-by-projection"
	reasonDataError   = "data-error"
	// reasonProjectionError: an error of no known kind that failed the
	// event's batch Config.MaxUnknownFailures times (classify).
	reasonProjectionError = "projection-error"
	// reasonBatchTooLarge: the fetched batch at the offset decompresses
	// beyond the consumer's bound (kafka.Config.MaxDecompressBatchBytes):
	// none of its records can be read.
	reasonBatchTooLarge = "batch-too-large"
)

// parkReasons are every reason a partition parks for (the reason label of
// onceflow_projector_parked_partitions).
var parkReasons = []string{reasonGap, reasonUndecodable, reasonRefused, reasonDataError, reasonProjectionError, reasonBatchTooLarge,
	reasonTopicChanged, reasonOutOfRange}

// result is what a committed batch did.
type result struct {
	next                        map[int32]kgo.EpochOffset // offsets stored, by partition
	parks                       []park                    // partitions parked by this batch
	applied, duplicates, fenced int
}

// applier applies batches of events for one consumer: the transaction
// described in the package doc. The projector and a rebuild share it.
type applier struct {
	consumer    string
	topic       string
	pool        *pgxpool.Pool
	projections []pipeline.Projection[pgx.Tx]
	hold        Hold
	tracer      tracing.Tracer // the live projector's, with its Kafka clients' provider
	// notBefore, if set, is when the consumer first wrote to the inbox
	// (less the clock skew): a rebuild's consumer has no older rows.
	notBefore time.Time
	// committed, if set, is told the events of each transaction that
	// committed (the live projector's: their age, and the outcomes it
	// notifies).
	committed func(evs []event)
	// asyncCommit commits without waiting for the WAL flush
	// (docs/projector.md#asynchronous-commit). Only with remembered set:
	// a database crash may then lose the last commits, offsets included,
	// and remembered is what notices. Such a transaction also sends the
	// notification of the outcomes it commits (postgres.OutcomesChannel)
	// itself, in the round trip that saves its offsets: Postgres delivers
	// it at the commit, holding a lock that serializes notifying commits
	// until then, which is short without the flush (a synchronous
	// applier's committed callback notifies after the commit instead).
	asyncCommit bool
	// remembered, if set, is each partition's offset as this consumer last
	// stored or loaded it. A transaction that finds less in the database
	// (it lost commits: a crash after asynchronous commits, or an operator
	// moved the offset back) does not apply its batch on top of the gap: it
	// fails with a rewindError, and the projector reads the partition
	// again from the stored offset.
	remembered *offsetMemory
	// identity is the topic's the consumer's offsets count (identity.go):
	// the offset rows a transaction creates record it.
	identity identityHolder
}

// offsetMemory is a consumer's last known stored offset per partition,
// shared by the transactions of one poll batch (over disjoint partitions).
type offsetMemory struct {
	mu sync.Mutex
	m  map[int32]int64
}

func newOffsetMemory() *offsetMemory { return &offsetMemory{m: map[int32]int64{}} }

func (o *offsetMemory) get(part int32) (int64, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	off, ok := o.m[part]
	return off, ok
}

func (o *offsetMemory) set(part int32, off int64) {
	o.mu.Lock()
	o.m[part] = off
	o.mu.Unlock()
}

func (o *offsetMemory) snapshot() map[int32]int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make(map[int32]int64, len(o.m))
	for part, off := range o.m {
		out[part] = off
	}
	return out
}

func (o *offsetMemory) forget(parts []int32) {
	o.mu.Lock()
	for _, part := range parts {
		delete(o.m, part)
	}
	o.mu.Unlock()
}

// rewindError is a batch found behind the database: to holds, for each
// partition whose stored offset is less than this consumer last stored,
// the offset to read it again from. Nothing of the batch was applied.
type rewindError struct{ to map[int32]int64 }

func (e *rewindError) Error() string {
	return fmt.Sprintf("stored offsets behind what this projector committed (lost commits): read again from %v", e.to)
}

const (
	// lockOffsetsSQL takes the row lock on each partition's offset (creating
	// the row at 0 if there is none, with the identity of the topic it
	// counts: $4, $5) and returns the stored offset. Every
	// transaction that writes a partition's events takes this lock first,
	// in partition order, so writers of one partition are serialized: a
	// zombie member of the group waits, then finds the offset moved past its
	// records and skips them.
	lockOffsetsSQL = `INSERT INTO consumer_offsets AS o (consumer, topic, partition, next_offset, cluster_id, topic_id)
		SELECT $1, $2, p, 0, $4::text, $5::uuid FROM unnest($3::int[]) AS p
		ON CONFLICT (consumer, topic, partition) DO UPDATE SET next_offset = o.next_offset
		RETURNING partition, next_offset`
	// inboxSQL inserts the ids not yet in the inbox and returns them. The
	// lookup (onceflow_inbox_seen) spans the inbox's partitions from the
	// earliest day an id could have been stored: ids of commands that are
	// UUIDv7 ($2) cannot be older than their command, less a day for clock
	// skew ($3); other ids ($4) from $5 on. The offset lock above makes
	// lookup-then-insert race-free.
	inboxSQL = `WITH seen AS (
			SELECT * FROM onceflow_inbox_seen($1, $2, $3)
			UNION ALL
			SELECT * FROM onceflow_inbox_seen($1, $4, $5)
		)
		INSERT INTO inbox (consumer, event_id)
		SELECT DISTINCT $1, id FROM unnest($6::uuid[]) AS id
		WHERE id NOT IN (SELECT * FROM seen)
		RETURNING event_id`
	// asyncCommitSQL makes the transaction's commit return before its WAL
	// is flushed (docs/projector.md#asynchronous-commit).
	asyncCommitSQL = `SET LOCAL synchronous_commit = off`
	saveOffsetsSQL = `UPDATE consumer_offsets o SET next_offset = v.next, updated_at = now()
		FROM unnest($3::int[], $4::bigint[]) AS v(partition, next)
		WHERE o.consumer = $1 AND o.topic = $2 AND o.partition = v.partition`
	saveParkedSQL = `INSERT INTO projector_parked (consumer, topic, partition, next_offset, reason, detail, skip_to)
		SELECT $1, $2, p, o, r, d, nullif(s, 0) FROM unnest($3::int[], $4::bigint[], $5::text[], $6::text[], $7::bigint[]) AS v(p, o, r, d, s)
		ON CONFLICT (consumer, topic, partition) DO UPDATE SET
			next_offset = EXCLUDED.next_offset, reason = EXCLUDED.reason, detail = EXCLUDED.detail, skip_to = EXCLUDED.skip_to, parked_at = now()`
	// clearParkedSQL forgets a parked partition once it has moved past the
	// record it stopped on, and the transient error the batch's partitions
	// ($5) were retried on, now that a batch of them commits (one
	// statement: the fast path pays no round trip for it).
	clearParkedSQL = `WITH retried AS (
			DELETE FROM projector_retrying WHERE consumer = $1 AND topic = $2 AND partition = ANY ($5::int[])
		)
		DELETE FROM projector_parked p
		USING unnest($3::int[], $4::bigint[]) AS v(partition, next)
		WHERE p.consumer = $1 AND p.topic = $2 AND p.partition = v.partition AND p.next_offset < v.next`
)

// apply applies evs (in log order) and parks found while decoding, in one
// transaction. When a projection reports a gap, refuses an event or raises
// a data error on it, the transaction is rolled back and run again with
// that partition stopped at the event. A data error fails a projection's
// statement, not one event, so the transaction is first run again
// carefully (applyCarefully) to find the event at fault. Other errors are
// the caller's to retry (classify).
func (a *applier) apply(ctx context.Context, evs []event, parks []park) (result, error) {
	return a.applyBlaming(ctx, evs, parks, 0)
}

// applyBlaming is apply, with an error of no known kind (classify) that a
// projection returns taken as its event's, as a data error is, when the
// batch has failed blame > 0 times with such errors: the event is found
// the same way and its partition parks on it (reasonProjectionError).
func (a *applier) applyBlaming(ctx context.Context, evs []event, parks []park, blame int) (_ result, err error) {
	if a.tracer.On() {
		var end func(error)
		ctx, end = a.traceApply(ctx, evs)
		defer func() { end(err) }()
	}
	careful := false // a projection raised an error an event is blamed for on this batch
	for {
		var res result
		var more []park
		if a.hold != nil {
			a.hold(HoldBeforeTx, 0)
		}
		parts := batchPartitions(evs, parks)
		tx, stored, err := a.begin(ctx, parts)
		if err != nil {
			return result{}, err
		}
		res, more, err = a.applyInTx(ctx, tx, evs, parks, parts, stored, careful, blame)
		if err == nil && len(more) == 0 && a.hold != nil {
			a.hold(HoldInTx, tx.Conn().PgConn().PID())
		}
		if err != nil || len(more) > 0 {
			tx.Rollback(context.WithoutCancel(ctx))
			if err != nil {
				if !careful && (isProjectionDataError(err) || blame > 0 && isProjectionError(err) && kindOf(err) == unknown) {
					careful = true
					continue
				}
				return result{}, err
			}
			parks = mergeParks(parks, more)
			evs = stopAtParks(evs, parks)
			continue
		}
		if err := tx.Commit(ctx); err != nil {
			return result{}, fmt.Errorf("commit: %w", err)
		}
		if a.remembered != nil {
			for part, eo := range res.next {
				a.remembered.set(part, eo.Offset)
			}
		}
		if a.committed != nil {
			a.committed(evs)
		}
		if a.hold != nil {
			a.hold(HoldAfterCommit, 0)
		}
		return res, nil
	}
}

// applyInTx is the body of a batch's transaction, begun by begin with the
// partitions' offsets locked and stored the offsets it read. It returns
// the parks the projections asked for (then nothing must be committed), or
// the result to commit. careful runs each projection under a savepoint and
// finds the events its data errors (and with blame > 0 its errors of no
// known kind) are raised on (applyCarefully).
func (a *applier) applyInTx(ctx context.Context, tx pgx.Tx, evs []event, parks []park, parts []int32, stored map[int32]int64, careful bool, blame int) (result, []park, error) {
	res := result{next: make(map[int32]kgo.EpochOffset)}
	if len(parts) == 0 {
		return res, nil, nil
	}
	// 1. Skip what is already below the stored offsets.
	kept, keptParks := res.keep(evs, parks, stored)
	// 2. The inbox: only ids it did not hold go to the projections.
	fresh, err := a.inbox(ctx, tx, kept, &res)
	if err != nil {
		return res, nil, err
	}
	// 3. The projections, each over all fresh events at once; those of
	// the library's own queued in the last round trip (tail).
	tail := &pgx.Batch{}
	var queued []queuedOutcomes
	if len(fresh) > 0 {
		var more []park
		more, queued, err = a.project(ctx, tx, fresh, careful, blame, &res, tail)
		if err != nil || len(more) > 0 {
			return res, more, err
		}
		res.applied = len(fresh)
	}
	// 4. Offsets and parked partitions, in the same transaction.
	if err := a.saveOffsets(ctx, tx, tail, &res, stored, parts, keptParks, kept); err != nil {
		return res, nil, err
	}
	return res, nil, res.countQueued(queued)
}

// batchPartitions are the partitions of a batch's events and parks, sorted,
// each once.
func batchPartitions(evs []event, parks []park) []int32 {
	var parts []int32
	for _, e := range evs {
		parts = append(parts, e.partition)
	}
	for _, pk := range parks {
		parts = append(parts, pk.partition)
	}
	slices.Sort(parts)
	return slices.Compact(parts)
}

// keep drops the events and parks below the stored offsets (another
// projector got past them meanwhile), counting the events fenced, and
// sets the offsets to store after the rest.
func (res *result) keep(evs []event, parks []park, stored map[int32]int64) ([]event, []park) {
	kept := evs[:0:0]
	for _, e := range evs {
		if e.offset < stored[e.partition] {
			res.fenced++
			continue
		}
		kept = append(kept, e)
		res.next[e.partition] = kgo.EpochOffset{Epoch: e.epoch, Offset: e.offset + 1}
	}
	var keptParks []park
	for _, pk := range parks {
		if pk.offset < stored[pk.partition] {
			continue // someone else got past it meanwhile
		}
		keptParks = append(keptParks, pk)
		res.next[pk.partition] = kgo.EpochOffset{Epoch: -1, Offset: pk.offset}
	}
	return kept, keptParks
}

// inbox records the ids of kept in the inbox and returns the events whose
// id it did not hold yet, each id once, counting the others duplicates.
func (a *applier) inbox(ctx context.Context, tx pgx.Tx, kept []event, res *result) ([]event, error) {
	if len(kept) == 0 {
		return nil, nil
	}
	ids := make([][16]byte, len(kept))
	for i, e := range kept {
		ids[i] = [16]byte(e.ID)
	}
	q := a.lookup(kept)
	rows, err := tx.Query(ctx, inboxSQL, a.consumer, q.bounded, q.boundedSince, q.unbounded, q.unboundedSince, ids)
	if err != nil {
		return nil, fmt.Errorf("inbox insert: %w", err)
	}
	newIDs, err := pgx.CollectRows(rows, pgx.RowTo[[16]byte])
	if err != nil {
		return nil, fmt.Errorf("inbox insert: %w", err)
	}
	isNew := make(map[[16]byte]bool, len(newIDs))
	for _, id := range newIDs {
		isNew[id] = true
	}
	var fresh []event
	for i, e := range kept {
		if !isNew[ids[i]] {
			res.duplicates++
			continue
		}
		isNew[ids[i]] = false // the same id twice in one batch applies once
		fresh = append(fresh, e)
	}
	return fresh, nil
}

// project runs each projection over the fresh events at once and returns
// the parks their outcomes ask for: a version gap, a refusal, a data
// error of one event, and with blame > 0 an error of no known kind of one
// event (classify). Any other error of an event is the batch's.
func (a *applier) project(ctx context.Context, tx pgx.Tx, fresh []event, careful bool, blame int, res *result, tail *pgx.Batch) ([]park, []queuedOutcomes, error) {
	pevs := make([]pipeline.Event, len(fresh))
	for i, e := range fresh {
		pevs[i] = e.Event
	}
	var more []park
	var queued []queuedOutcomes
	for _, proj := range a.projections {
		if q, ok := proj.(queuedProjection); ok && !careful {
			n := len(tail.QueuedQueries)
			if out, ok := q.queue(tail, pevs); ok {
				blameOn(tail.QueuedQueries[n:], proj.Name())
				queued = append(queued, queuedOutcomes{proj.Name(), out})
				continue
			}
		}
		var outcomes []error
		var err error
		if careful {
			outcomes, err = applyCarefully(ctx, tx, proj, fresh, pevs, blame > 0)
		} else {
			outcomes, err = applyProjection(ctx, tx, proj, pevs)
		}
		if err != nil {
			return nil, nil, &projectionError{proj.Name(), err}
		}
		for i, o := range outcomes {
			var gap *pipeline.VersionGapError
			e := fresh[i]
			switch {
			case o == nil:
			case errors.Is(o, pipeline.ErrDuplicate):
				res.duplicates++
			case errors.As(o, &gap):
				more = append(more, park{partition: e.partition, offset: e.offset, reason: reasonGap,
					detail: fmt.Sprintf("%s: %s event %s: %v", proj.Name(), e.Type(), e.ID, o)})
			case pipeline.IsPermanent(o):
				more = append(more, park{partition: e.partition, offset: e.offset, reason: reasonRefused,
					detail: fmt.Sprintf("%s: %s event %s: %v", proj.Name(), e.Type(), e.ID, o)})
			default:
				if pgErr, ok := dataError(o); ok {
					more = append(more, park{partition: e.partition, offset: e.offset, reason: reasonDataError, detail: dataErrorDetail(proj.Name(), e, pgErr)})
					continue
				}
				if blame > 0 && kindOf(o) == unknown {
					more = append(more, park{partition: e.partition, offset: e.offset, reason: reasonProjectionError, detail: unknownErrorDetail(proj.Name(), e, o, blame)})
					continue
				}
				return nil, nil, &projectionError{proj.Name(), fmt.Errorf("apply %s %s: %w", e.Type(), e.ID, o)}
			}
		}
	}
	return more, queued, nil
}

// saveOffsets stores the offsets after the batch (never below the stored
// ones), clears the parks they got past and saves the batch's, in one
// round trip (b, after the queued projections' statements), with the
// outcomes' notification when the transaction sends it (asyncCommit).
func (a *applier) saveOffsets(ctx context.Context, tx pgx.Tx, b *pgx.Batch, res *result, stored map[int32]int64, parts []int32, keptParks []park, kept []event) error {
	offParts, offs := make([]int32, 0, len(res.next)), make([]int64, 0, len(res.next))
	for p, eo := range res.next {
		if eo.Offset < stored[p] {
			eo.Offset = stored[p] // offsets never move back
			res.next[p] = eo
		}
		offParts, offs = append(offParts, p), append(offs, eo.Offset)
	}
	if len(offParts) > 0 {
		b.Queue(saveOffsetsSQL, a.consumer, a.topic, offParts, offs)
	}
	b.Queue(clearParkedSQL, a.consumer, a.topic, offParts, offs, parts)
	if len(keptParks) > 0 {
		n := len(keptParks)
		pp, po, pr, pd, ps := make([]int32, n), make([]int64, n), make([]string, n), make([]string, n), make([]int64, n)
		for i, pk := range keptParks {
			pp[i], po[i], pr[i], pd[i], ps[i] = pk.partition, pk.offset, pk.reason, cleanText(pk.detail), pk.skipTo
		}
		b.Queue(saveParkedSQL, a.consumer, a.topic, pp, po, pr, pd, ps)
		res.parks = keptParks
	}
	if a.asyncCommit {
		if payloads := outcomePayloads(kept); len(payloads) > 0 {
			b.Queue(postgres.NotifySQL, postgres.OutcomesChannel, payloads)
		}
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("save offsets and parked partitions: %w", err)
	}
	return nil
}

// outcomePayloads are the notification payloads naming the commands of
// evs, each once (postgres.OutcomesChannel).
func outcomePayloads(evs []event) []string {
	ids := make([]pipeline.ID, 0, len(evs))
	seen := make(map[pipeline.ID]bool, len(evs))
	for _, e := range evs {
		if !seen[e.CommandID] {
			seen[e.CommandID] = true
			ids = append(ids, e.CommandID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	return postgres.OutcomePayloads(ids)
}

// skew is how far a command id's clock may be from the database's.
const skew = 24 * time.Hour

// inboxLookup splits a batch's ids by how far back the inbox must look.
type inboxLookup struct {
	bounded, unbounded           [][16]byte
	boundedSince, unboundedSince pgtype.Timestamptz
}

// lookup finds, for a batch, the earliest day each id could have been
// stored on: an event is stored after its command was minted, so a UUIDv7
// command id (ingest mints them) bounds it; other ids are looked up in
// every partition. A consumer that did not exist before notBefore (a
// rebuild's) has nothing older.
func (a *applier) lookup(evs []event) inboxLookup {
	q := inboxLookup{
		boundedSince:   pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true},
		unboundedSince: pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true},
	}
	future := time.Now().Add(time.Hour)
	for _, e := range evs {
		t := e.CommandID.Time()
		if t.IsZero() || t.After(future) { // not a UUIDv7, or minted by a clock far ahead
			q.unbounded = append(q.unbounded, [16]byte(e.ID))
			continue
		}
		q.bounded = append(q.bounded, [16]byte(e.ID))
		since := t.Add(-skew)
		if q.boundedSince.InfinityModifier != pgtype.Finite || since.Before(q.boundedSince.Time) {
			q.boundedSince = pgtype.Timestamptz{Time: since, Valid: true}
		}
	}
	if !a.notBefore.IsZero() {
		nb := pgtype.Timestamptz{Time: a.notBefore, Valid: true}
		if q.unboundedSince.InfinityModifier != pgtype.Finite || q.unboundedSince.Time.Before(a.notBefore) {
			q.unboundedSince = nb
		}
		if q.boundedSince.InfinityModifier == pgtype.Finite && q.boundedSince.Time.Before(a.notBefore) {
			q.boundedSince = nb
		}
	}
	return q
}

// mergeParks adds more to parks, keeping the earliest record per partition.
func mergeParks(parks, more []park) []park {
	for _, m := range more {
		found := false
		for i := range parks {
			if parks[i].partition == m.partition {
				found = true
				if m.offset < parks[i].offset {
					parks[i] = m
				}
			}
		}
		if !found {
			parks = append(parks, m)
		}
	}
	return parks
}

// stopAtParks drops the events at or after the record each parked
// partition stops on.
func stopAtParks(evs []event, parks []park) []event {
	out := evs[:0:0]
	for _, e := range evs {
		stop := false
		for _, pk := range parks {
			if pk.partition == e.partition && e.offset >= pk.offset {
				stop = true
				break
			}
		}
		if !stop {
			out = append(out, e)
		}
	}
	return out
}

// decode turns a record into an event; errors that are the record's own
// fault wrap errPoison.
func decode(ctx context.Context, dec Decoder, r *kgo.Record) (event, error) {
	envelope, err := kafka.EventOf(r)
	e := event{Event: envelope, partition: r.Partition, offset: r.Offset, epoch: r.LeaderEpoch, trace: r.Context}
	if err != nil {
		return e, fmt.Errorf("%w: %v", errPoison, err)
	}
	v, err := dec.Decode(ctx, r.Value)
	if err != nil {
		if errors.Is(err, pipeline.ErrUndecodable) || errors.Is(err, pipeline.ErrUnknownSchema) || errors.Is(err, pipeline.ErrIncompatible) {
			return e, fmt.Errorf("%w: %w", errPoison, err)
		}
		return e, err // the registry is unreachable: not the record's fault
	}
	msg, ok := v.(pipeline.Message)
	if !ok {
		return e, fmt.Errorf("%w: decoded a %T, which is not an event", errPoison, v)
	}
	e.Payload = msg
	return e, nil
}

var errPoison = errors.New("undecodable event")

// decodeAll decodes records; a record that can never be decoded parks its
// partition at its offset, and the partition's later records are dropped.
func decodeAll(ctx context.Context, dec Decoder, records []*kgo.Record) ([]event, []park, error) {
	evs := make([]event, 0, len(records))
	var parks []park
	stopped := make(map[int32]bool)
	for _, r := range records {
		if stopped[r.Partition] {
			continue
		}
		e, err := decode(ctx, dec, r)
		if errors.Is(err, errPoison) {
			parks = append(parks, park{partition: r.Partition, offset: r.Offset, reason: reasonUndecodable, detail: err.Error()})
			stopped[r.Partition] = true
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		evs = append(evs, e)
	}
	return evs, parks, nil
}

// ensureInboxPartitions creates the inbox's daily partitions for the coming
// days (the relay's janitor does it too; a projector must not depend on it).
func ensureInboxPartitions(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := postgres.EnsureDailyPartitions(ctx, pool, "inbox", 7)
	return err
}

// backoff doubles a wait up to max.
func backoff(d, max time.Duration) time.Duration { return min(d*2, max) }

// traceApply starts the spans of a batch (docs/observability.md): each
// event's apply, a child of its receive span, whose traceparent the event
// then carries to the projections (the jobs it enqueues go on in it), and
// the transaction's, linked to each event's receive span, in whose context
// the batch runs (its statements and inserts are its children). end ends
// them all.
func (a *applier) traceApply(ctx context.Context, evs []event) (_ context.Context, end func(error)) {
	spans := make([]trace.Span, 0, len(evs))
	var links []trace.Link
	for i := range evs {
		e := &evs[i]
		links = tracing.Link(links, e.trace)
		sctx, span := a.tracer.Child(e.trace, "onceflow.projector.apply",
			trace.WithAttributes(attribute.String("onceflow.event_id", e.ID.String()), attribute.String("onceflow.event_type", e.Type())))
		if span.IsRecording() {
			e.Traceparent = tracing.Traceparent(sctx)
			spans = append(spans, span)
		}
	}
	ctx, tx := a.tracer.Batch(ctx, "onceflow.projector.transaction", links, trace.WithAttributes(attribute.Int("onceflow.batch.size", len(evs))))
	return ctx, func(err error) {
		for _, s := range spans {
			tracing.End(s, err)
		}
		tracing.End(tx, err)
	}
}
