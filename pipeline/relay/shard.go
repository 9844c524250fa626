package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/kafka"
)

// worker ships one shard while this relay holds its lease.
type worker struct {
	shard int
	token int64

	turn      turn             // the handshake with the dispatcher
	work      chan []outboxRow // rows the dispatcher read for it
	stopc     chan struct{}    // closed: stop after the batch in flight
	stopOnce  sync.Once
	releasing atomic.Bool // give the lease back when stopping
	gone      atomic.Bool // the lease was lost: do not touch it again

	mu       sync.Mutex
	deadline time.Time // the lease is certainly ours until then (local clock)

	client *kgo.Client // the shard's transactional producer; worker goroutine only
}

func (w *worker) stop() { w.stopOnce.Do(func() { close(w.stopc) }) }

// turn is a worker's handshake with the dispatcher. The dispatcher claims
// idle workers only; a wake-up that finds a worker busy is kept for it,
// since the rows that wake-up announces may have been committed after the
// busy worker's last read (its delete's read-ahead) and would otherwise
// wait for the next poll.
type turn struct {
	idle  atomic.Bool // waiting for work: the dispatcher may claim it
	woken atomic.Bool // a wake-up came while it was busy
}

// claim is the dispatcher's: it takes the worker if it is idle. On a
// wake-up it first leaves word for a busy worker, then tries to claim it,
// so a worker that goes idle in between finds the word (rest).
func (t *turn) claim(wakeUp bool) bool {
	if wakeUp {
		t.woken.Store(true)
	}
	if t.idle.CompareAndSwap(true, false) {
		t.woken.Store(false) // the dispatcher reads the shard itself
		return true
	}
	return false
}

// rest is the worker's, when it has nothing to ship: it becomes idle and
// reports whether a wake-up came while it was busy. If so, and the
// dispatcher has not claimed it since, it is busy again and must read its
// shard from the head itself.
func (t *turn) rest() (readAgain bool) {
	t.idle.Store(true)
	return t.woken.Swap(false) && t.idle.CompareAndSwap(true, false)
}

// free makes a claimed worker that was given nothing idle again.
func (t *turn) free() { t.idle.Store(true) }

func (w *worker) release() {
	w.releasing.Store(true)
	w.stop()
}

func (w *worker) stopped() bool {
	select {
	case <-w.stopc:
		return true
	default:
		return false
	}
}

// extend moves the local deadline forward (never back: an older renewal
// answered late must not shorten a newer one).
func (w *worker) extend(t time.Time) {
	w.mu.Lock()
	if t.After(w.deadline) {
		w.deadline = t
	}
	w.mu.Unlock()
}

// setDeadline replaces the local deadline with what the database just
// said, which is authoritative.
func (w *worker) setDeadline(t time.Time) {
	w.mu.Lock()
	w.deadline = t
	w.mu.Unlock()
}

func (w *worker) getDeadline() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deadline
}

// start begins shipping a shard whose lease this relay just acquired.
func (r *Relay) start(ctx context.Context, shard int, token int64, deadline time.Time) {
	w := &worker{
		shard: shard, token: token,
		work:     make(chan []outboxRow, 1),
		stopc:    make(chan struct{}),
		deadline: deadline,
	}
	r.mu.Lock()
	if old := r.workers[shard]; old != nil {
		old.gone.Store(true) // its token is stale now
		old.stop()
	} else {
		r.metrics.owned.Inc()
	}
	r.workers[shard] = w
	r.mu.Unlock()
	r.logger.Info("shard acquired", "shard", shard, "token", token)
	r.wg.Add(1)
	go r.runWorker(ctx, w)
}

// lost stops a worker whose lease moved to another relay.
func (r *Relay) lost(w *worker, stage string) {
	if w.gone.Swap(true) {
		return
	}
	r.metrics.leases.WithLabelValues("lost").Inc()
	r.metrics.fenced.WithLabelValues(stage).Inc()
	r.logger.Warn("shard lease lost", "shard", w.shard, "token", w.token, "stage", stage)
	r.remove(w)
	w.stop()
}

func (r *Relay) remove(w *worker) {
	r.mu.Lock()
	if r.workers[w.shard] == w {
		delete(r.workers, w.shard)
		r.metrics.owned.Dec()
	}
	r.mu.Unlock()
}

func (r *Relay) runWorker(ctx context.Context, w *worker) {
	defer r.wg.Done()
	defer func() {
		r.discardClient(w)
		r.remove(w)
		if !w.gone.Load() {
			// Graceful stop or rebalancing: hand the shard over now rather
			// than after the lease expires.
			r.releaseLease(w.shard, w.token)
			r.logger.Info("shard released", "shard", w.shard, "token", w.token)
		}
		select {
		case r.rebalance <- struct{}{}:
		default:
		}
	}()
	// Fence the shard's previous holder in Kafka now, before this relay
	// reads anything: from here on nothing it left open can commit. (If
	// the broker is away, producing retries this.)
	fctx, cancel := context.WithDeadline(ctx, w.getDeadline().Add(-r.cfg.margin()))
	if _, err := r.clientFor(fctx, w); err != nil && ctx.Err() == nil {
		r.logLimited("fence shard producer", "shard", w.shard, "err", err)
	}
	cancel()
	backoff := r.cfg.PollInterval
	pending := true      // read the shard from its head first
	var next []outboxRow // rows read ahead by the last delete
	for {
		if ctx.Err() != nil || w.stopped() {
			return
		}
		if !pending && next == nil {
			if w.turn.rest() {
				pending = true
				continue
			}
			select {
			case <-ctx.Done():
				return
			case <-w.stopc:
				return
			case next = <-w.work: // the dispatcher claimed this worker
			}
		}
		var (
			more bool
			err  error
		)
		next, more, err = r.shipBatch(ctx, w, next)
		var lost *lostError
		switch {
		case errors.As(err, &lost):
			r.lost(w, lost.stage)
			return
		case err != nil:
			r.metrics.errors.Inc()
			// (A Kafka failure has discarded the producer already; after a
			// Postgres one it is still good.)
			r.logLimited("ship outbox batch", "shard", w.shard, "err", err, "backoff", backoff)
			next = nil
			select {
			case <-ctx.Done():
				return
			case <-w.stopc:
				return
			case <-time.After(jitter(backoff)):
			}
			backoff = min(backoff*2, r.cfg.MaxBackoff)
			pending = true
		default:
			backoff = r.cfg.PollInterval
			pending = more // rows wait past the read-ahead: read from the head
			if len(next) == 0 {
				next = nil // nothing read ahead: read the head, or wait to be woken
			}
		}
	}
}

// lostError reports where a relay found out its lease had moved.
type lostError struct{ stage string }

func (e *lostError) Error() string { return "lease lost (" + e.stage + ")" }

type outboxRow struct {
	id         int64
	xid        uint64 // the transaction that wrote the row; a shard ships in (xid, id) order
	settled    bool   // xid was below every running transaction when the row was read
	topic      string
	key        []byte
	value      []byte
	headers    []kgo.RecordHeader // sorted by key
	badHeaders error              // the headers column is not an object of strings
	createdAt  time.Time
}

const (
	// readBatchSQL checks the lease (read-only) and reads the shard's
	// head in one round trip: no row means the lease is not ours, one row
	// with a NULL id means the shard is empty.
	readBatchSQL = `SELECT EXTRACT(EPOCH FROM l.expires_at - now())::float8,
			o.id, o.xid, o.settled, o.topic, o.key, o.value, o.headers, o.created_at
		FROM outbox_leases l
		LEFT JOIN LATERAL onceflow_outbox_next(l.shard, $4) o ON true
		WHERE l.shard = $1 AND l.token = $2 AND l.owner = $3
		ORDER BY o.xid, o.id`

	// renewOneSQL renews one lease, committing as renewSQL does.
	renewOneSQL = `WITH async AS (
			SELECT set_config('synchronous_commit', 'off', true)
		)
		UPDATE outbox_leases SET expires_at = now() + make_interval(secs => $4), renewed_at = now()
		FROM async
		WHERE shard = $1 AND token = $2 AND owner = $3
		RETURNING 1`

	// deleteShippedSQL deletes acknowledged rows only while the lease is
	// still this token's, and reads the shard's next batch, saving a round
	// trip per batch: after the last shipped row ($6, $7) when that row was
	// settled, else from the head, without the rows being deleted (the
	// statement's snapshot still has them). It share-locks the lease
	// row first, so a relay taking the shard over concurrently either
	// waits for this delete or has already moved the token, and then
	// nothing is deleted. (A lock, not a renewal: renewing at every batch
	// would bloat the lease table by hundreds of row versions a second;
	// the keeper renews.)
	//
	// The statement's transaction commits without waiting for the WAL
	// flush (synchronous_commit off, for this transaction only): a delete
	// lost in a database crash only means the rows are published again,
	// which the relay allows anyway, and not waiting for an fsync per
	// batch is much of the relay's speed.
	deleteShippedSQL = `WITH async AS (
			SELECT set_config('synchronous_commit', 'off', true)
		), lease AS (
			SELECT shard, expires_at FROM outbox_leases
			WHERE shard = $1 AND token = $2 AND owner = $3
			FOR SHARE
		), del AS (
			SELECT onceflow_outbox_delete(shard, $4) AS n FROM lease
		)
		SELECT (SELECT sum(n) FROM del)::bigint, (SELECT count(*) FROM async),
			EXTRACT(EPOCH FROM l.expires_at - now())::float8,
			o.id, o.xid, o.settled, o.topic, o.key, o.value, o.headers, o.created_at
		FROM lease l
		LEFT JOIN LATERAL onceflow_outbox_next(l.shard, $5, $4, $6, $7) o ON true
		ORDER BY o.xid, o.id`

	// moveDeadSQL moves a row the broker refused for good to outbox_dead,
	// under the same lease condition as a delete, and marks its command
	// failed with the same reason, so it is not pending forever (GET
	// /v1/commands/{id} shows it). The command is the row's command-id
	// within its tenant and aggregate (the record key), read defensively:
	// an INVALID_HEADERS row may hold anything, and a command-id that is
	// not a UUID matches nothing rather than failing the move. A command
	// that already has an outcome keeps it: a row can be refused after an
	// earlier copy of it was shipped and decided (shipped, not deleted,
	// then the topic's size limit lowered).
	moveDeadSQL = `WITH lease AS (
			SELECT shard FROM outbox_leases
			WHERE shard = $1 AND token = $2 AND owner = $3
			FOR SHARE
		), moved AS (
			DELETE FROM outbox WHERE id = $4 AND shard = (SELECT shard FROM lease)
			RETURNING id, shard, topic, key, value, headers, created_at
		), ins AS (
			INSERT INTO outbox_dead (id, shard, topic, key, value, headers, created_at, reason, detail)
			SELECT id, shard, topic, key, value, headers, created_at, $5, $6 FROM moved
			RETURNING 1
		), failed AS (
			UPDATE command_status AS c SET status = 'failed', reason = $5, detail = $6, updated_at = now()
			FROM moved AS m
			WHERE c.command_id = CASE WHEN m.headers->>'command-id' ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
					THEN (m.headers->>'command-id')::uuid END
				AND c.tenant = m.headers->>'tenant'
				AND convert_to(c.aggregate_id, 'UTF8') = m.key
				AND c.status IN ('pending', 'failed')
			RETURNING 1
		)
		SELECT (SELECT count(*) FROM lease), (SELECT count(*) FROM ins), (SELECT count(*) FROM failed)`
)

// shipBatch ships the next rows of the worker's shard (rows, when the
// previous batch's delete read them ahead, else it reads the head) and
// returns the next batch read ahead, and more when rows may wait that the
// read-ahead did not return (the caller reads the head next).
func (r *Relay) shipBatch(ctx context.Context, w *worker, rows []outboxRow) (next []outboxRow, more bool, err error) {
	// A batch that has started finishes during a graceful shutdown; the
	// lease, not ctx, bounds it.
	ctx = context.WithoutCancel(ctx)
	if time.Until(w.getDeadline()) < r.cfg.LeaseDuration/2 {
		if err := r.renewOne(ctx, w); err != nil {
			return nil, false, err
		}
	}
	if rows == nil {
		if rows, err = r.readBatch(ctx, w); err != nil || len(rows) == 0 {
			return nil, false, err
		}
	}
	switch i := slices.IndexFunc(rows, func(row outboxRow) bool { return row.badHeaders != nil }); {
	case i == 0:
		// A row no broker gets as written: out of the way, like a row the
		// broker refused; the rest follows from the head.
		return nil, true, r.moveDead(ctx, w, rows[0], "INVALID_HEADERS", rows[0].badHeaders)
	case i > 0:
		rows = rows[:i] // it heads the next batch
	}
	if h := r.hooks.beforeProduce; h != nil {
		h(w.shard)
	}
	recErrs, err := r.produce(ctx, w, rows)
	if err != nil {
		if anyPermanent(recErrs) {
			// Someone in this batch is poison, but a broker refusing a
			// partition's batch fails every record in it: ship one row
			// per transaction to find out which (the rest follows from the
			// head).
			return nil, true, r.isolate(ctx, w, rows)
		}
		return nil, false, err
	}
	if h := r.hooks.afterCommit; h != nil {
		h(w.shard)
	}
	return r.deleteShipped(ctx, w, rows)
}

// isolate ships rows one per transaction, in order, moving to outbox_dead
// those the broker refuses for good.
func (r *Relay) isolate(ctx context.Context, w *worker, rows []outboxRow) error {
	for i, row := range rows {
		if time.Until(w.getDeadline()) < r.cfg.LeaseDuration/2 {
			if err := r.renewOne(ctx, w); err != nil {
				return err
			}
		}
		recErrs, err := r.produce(ctx, w, rows[i:i+1])
		if err != nil {
			if !anyPermanent(recErrs) {
				return err
			}
			if err := r.moveDead(ctx, w, row, brokerReason(recErrs[0]), recErrs[0]); err != nil {
				return err
			}
			continue
		}
		if _, _, err := r.deleteShipped(ctx, w, rows[i:i+1]); err != nil {
			return err
		}
	}
	return nil
}

func (r *Relay) renewOne(ctx context.Context, w *worker) error {
	sent := time.Now()
	err := r.pool.QueryRow(ctx, renewOneSQL, w.shard, w.token, r.owner, r.cfg.LeaseDuration.Seconds()).Scan(new(int))
	if errors.Is(err, pgx.ErrNoRows) {
		return &lostError{stage: "renew"}
	}
	if err != nil {
		return fmt.Errorf("renew lease of shard %d: %w", w.shard, err)
	}
	w.extend(sent.Add(r.cfg.LeaseDuration))
	return nil
}

func (r *Relay) readBatch(ctx context.Context, w *worker) ([]outboxRow, error) {
	sent := time.Now()
	rows, err := r.pool.Query(ctx, readBatchSQL, w.shard, w.token, r.owner, r.cfg.BatchSize)
	if err != nil {
		return nil, fmt.Errorf("read outbox shard %d: %w", w.shard, err)
	}
	out, _, err := r.scanBatch(rows, w, sent, "check") // a head read returns every row
	if err != nil {
		return nil, err
	}
	if len(out) > 0 && time.Until(w.getDeadline()) < 2*r.cfg.margin() {
		return nil, fmt.Errorf("lease of shard %d about to expire; renewing before producing", w.shard)
	}
	return out, nil
}

// scanBatch reads rows of (lead columns..., remaining lease, outbox row or
// NULLs): no row at all means the lease is not this token's (a *lostError
// naming stage), one row with a NULL id means the shard is empty, or, with
// settled false, that rows wait past the ones returned (more). It updates
// the worker's deadline from the remaining lease.
func (r *Relay) scanBatch(rows pgx.Rows, w *worker, sent time.Time, stage string, lead ...any) (out []outboxRow, more bool, err error) {
	defer rows.Close()
	var (
		remaining float64
		leased    bool
		scan      rowScan
	)
	dst := scan.targets(append(slices.Clip(lead), &remaining)...)
	for rows.Next() {
		if err := rows.Scan(dst...); err != nil {
			return nil, false, fmt.Errorf("read outbox shard %d: %w", w.shard, err)
		}
		leased = true
		row, ok := scan.row()
		if !ok {
			more = scan.settled.Valid && !scan.settled.Bool
			continue
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("read outbox shard %d: %w", w.shard, err)
	}
	if !leased {
		return nil, false, &lostError{stage: stage}
	}
	// The database's word on how long the lease has left is authoritative;
	// counted from before the query was sent, it errs on the short side.
	w.setDeadline(sent.Add(seconds(remaining)))
	return out, more, nil
}

// rowScan holds the targets for an outbox row's columns as the relay's
// queries return them (id, xid, settled, topic, key, value, headers,
// created_at), scanned into row after row (pgx copies bytea and jsonb out
// of its buffer into new slices).
type rowScan struct {
	id                  pgtype.Int8
	xid                 pgtype.Uint64
	settled             pgtype.Bool
	topic               pgtype.Text
	key, value, headers []byte
	createdAt           pgtype.Timestamptz
}

// targets returns lead followed by the row's columns, for Scan.
func (s *rowScan) targets(lead ...any) []any {
	return append(lead, &s.id, &s.xid, &s.settled, &s.topic, &s.key, &s.value, &s.headers, &s.createdAt)
}

// row returns the row scanned last, or false for a row of NULLs.
func (s *rowScan) row() (outboxRow, bool) {
	if !s.id.Valid {
		return outboxRow{}, false
	}
	row := outboxRow{id: s.id.Int64, xid: s.xid.Uint64, settled: s.settled.Bool,
		topic: s.topic.String, key: s.key, value: s.value, createdAt: s.createdAt.Time}
	row.headers, row.badHeaders = recordHeaders(s.headers)
	return row, true
}

// deleteShipped deletes acknowledged rows if the lease still holds and
// returns the shard's next batch (and more, as scanBatch). shipped is a
// prefix, in order, of what a read returned.
func (r *Relay) deleteShipped(ctx context.Context, w *worker, shipped []outboxRow) (next []outboxRow, more bool, err error) {
	ids := make([]int64, len(shipped))
	for i, row := range shipped {
		ids[i] = row.id
	}
	// Every row up to the last shipped one has been read, so if that row
	// was settled nothing can still appear before it: read on from there.
	var afterXID pgtype.Uint64
	var afterID pgtype.Int8
	if last := shipped[len(shipped)-1]; last.settled {
		afterXID = pgtype.Uint64{Uint64: last.xid, Valid: true}
		afterID = pgtype.Int8{Int64: last.id, Valid: true}
	}
	sent := time.Now()
	rows, err := r.pool.Query(ctx, deleteShippedSQL, w.shard, w.token, r.owner, ids, r.cfg.BatchSize, afterXID, afterID)
	if err != nil {
		// Shipped but not deleted: the rows go out again next time.
		return nil, false, fmt.Errorf("delete %d shipped rows of shard %d: %w", len(ids), w.shard, err)
	}
	var deleted int
	next, more, err = r.scanBatch(rows, w, sent, "delete", &deleted, nil)
	if err != nil {
		// A lost lease: shipped, but the shard moved meanwhile; its new
		// holder ships these rows again (duplicates the processor absorbs).
		return nil, false, err
	}
	r.metrics.shipped.Add(float64(deleted))
	return next, more, nil
}

// brokerReason is the broker's error code for a refused record, the
// reason outbox_dead keeps.
func brokerReason(err error) string {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Message
	}
	return "UNKNOWN"
}

// moveDead moves a row that cannot be shipped to outbox_dead with a
// reason (the broker's error code, or INVALID_HEADERS) and the cause.
func (r *Relay) moveDead(ctx context.Context, w *worker, row outboxRow, reason string, cause error) error {
	var leased, moved, failed int
	err := r.pool.QueryRow(ctx, moveDeadSQL, w.shard, w.token, r.owner, row.id, reason, cause.Error()).Scan(&leased, &moved, &failed)
	if err != nil {
		return fmt.Errorf("move outbox row %d to outbox_dead: %w", row.id, err)
	}
	if leased == 0 {
		return &lostError{stage: "delete"}
	}
	if moved > 0 {
		r.metrics.dead.WithLabelValues(reason).Inc()
		r.logger.Error("outbox row cannot be shipped, moved to outbox_dead",
			"shard", w.shard, "outbox_id", row.id, "topic", row.topic, "bytes", len(row.value), "reason", reason,
			"command_failed", failed > 0, "err", cause)
	}
	return nil
}

func anyPermanent(errs []error) bool {
	return slices.ContainsFunc(errs, func(err error) bool { return err != nil && kafka.RefusedForGood(err) })
}

// isFenced reports whether Kafka refused the producer because a newer one
// of the same transactional id exists (or the transaction timed out).
func isFenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) ||
		errors.Is(err, kerr.InvalidTxnState)
}
