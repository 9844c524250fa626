package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/postgres"
)

// acceptItem is one validated request waiting for an accept transaction.
type acceptItem struct {
	ctx         context.Context // the request's: one that ended before its batch began is dropped
	tenant, key string
	keyHash     []byte // the API key's hash, checked again in the transaction
	route       string // the route pattern, kept with the key for operators
	hash        []byte // the request hash (requestHash)
	localID     string
	commandType string
	value       []byte // the encoded command
	traceparent string
	done        chan acceptResult // buffered, so the committer never blocks on it
}

type outcome int

const (
	outcomeAccepted     outcome = iota + 1 // a new command: 202
	outcomeReplayed                        // the stored response again
	outcomeConflict                        // the key was used for another request: 409
	outcomeUnauthorized                    // the API key was revoked: 401, nothing written
)

type acceptResult struct {
	outcome outcome
	resp    storedResponse
	err     error
}

// storedResponse is what idempotency_keys keeps of the response.
type storedResponse struct {
	Status  int
	Headers map[string]string
	Body    []byte
}

// accepted is the body of a 202.
type accepted struct {
	CommandID string `json:"command_id"`
	Status    string `json:"status"`
}

func acceptedResponse(id pipeline.ID) storedResponse {
	body, _ := json.Marshal(accepted{CommandID: id.String(), Status: "pending"})
	return storedResponse{
		Status: http.StatusAccepted,
		Headers: map[string]string{
			"Content-Type": "application/json",
			"Location":     "/v1/commands/" + id.String(),
		},
		Body: append(body, '\n'),
	}
}

var (
	errOverloaded   = errors.New("too many requests are waiting for the database")
	errShuttingDown = errors.New("ingest is shutting down")
)

// committer groups concurrent accepts into shared transactions (see the
// package doc, "Group commit").
type committer struct {
	pool    *pgxpool.Pool
	cfg     Config
	logger  *slog.Logger
	metrics *metrics
	queue   chan *acceptItem
}

func newCommitter(pool *pgxpool.Pool, cfg Config, logger *slog.Logger, m *metrics) *committer {
	return &committer{pool: pool, cfg: cfg, logger: logger, metrics: m, queue: make(chan *acceptItem, cfg.MaxPending)}
}

// do queues it and waits for its outcome, the request's end or the
// request timeout, whichever comes first.
func (c *committer) do(it *acceptItem) acceptResult {
	it.done = make(chan acceptResult, 1)
	select {
	case c.queue <- it:
	default:
		return acceptResult{err: errOverloaded}
	}
	timer := time.NewTimer(c.cfg.RequestTimeout)
	defer timer.Stop()
	select {
	case r := <-it.done:
		return r
	case <-it.ctx.Done():
		return acceptResult{err: it.ctx.Err()}
	case <-timer.C:
		// The batch may still commit; a retry with the same key then gets
		// its response.
		return acceptResult{err: context.DeadlineExceeded}
	}
}

// run runs the committers until ctx ends, then fails what is still queued.
// An in-flight batch finishes first: its transaction has its own deadline.
func (c *committer) run(ctx context.Context) {
	var wg sync.WaitGroup
	for range c.cfg.Committers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.work(ctx)
		}()
	}
	wg.Wait()
	for {
		select {
		case it := <-c.queue:
			it.done <- acceptResult{err: errShuttingDown}
		default:
			return
		}
	}
}

// work is one committer. While requests keep coming it keeps a connection
// of its own from batch to batch, so its transactions never queue for the
// pool behind reads; it gives the connection back when the queue runs dry
// (an idle server holds none, and closing the pool never waits on it) and
// when the connection breaks.
func (c *committer) work(ctx context.Context) {
	var conn *pgxpool.Conn
	release := func() {
		if conn != nil {
			conn.Release()
			conn = nil
		}
	}
	defer release()
	var carry []*acceptItem
	for {
		batch, rest, ok := c.next(ctx, carry, release)
		if !ok {
			for _, it := range carry {
				it.done <- acceptResult{err: errShuttingDown}
			}
			return
		}
		carry = rest
		if len(batch) == 0 {
			continue
		}
		if conn == nil {
			actx, cancel := context.WithTimeout(context.Background(), c.cfg.RequestTimeout)
			var err error
			conn, err = c.pool.Acquire(actx)
			cancel()
			if err != nil {
				c.fail(batch, fmt.Errorf("acquire a connection: %w", err))
				continue
			}
		}
		c.commit(conn, batch)
		if conn.Conn().IsClosed() {
			release() // the pool discards a closed connection
		}
	}
}

func (c *committer) fail(batch []*acceptItem, err error) {
	for _, it := range batch {
		it.done <- acceptResult{err: err}
	}
}

type tenantKey struct{ tenant, key string }

// next waits for work and returns a batch: what is queued, up to MaxBatch,
// with at most one request per (tenant, key). A second request with a key
// already in the batch waits in rest for the next one, where it finds the
// first's committed record and gets its response: a replay is never sent
// before the transaction that stored it committed. idle is called before
// waiting on an empty queue.
func (c *committer) next(ctx context.Context, carry []*acceptItem, idle func()) (batch, rest []*acceptItem, ok bool) {
	pending := carry
	if len(pending) == 0 {
		select {
		case it := <-c.queue:
			pending = append(pending, it)
		default:
			idle()
			select {
			case it := <-c.queue:
				pending = append(pending, it)
			case <-ctx.Done():
				return nil, nil, false
			}
		}
	}
drain:
	for len(pending) < c.cfg.MaxBatch {
		select {
		case it := <-c.queue:
			pending = append(pending, it)
		default:
			break drain
		}
	}
	seen := make(map[tenantKey]bool, len(pending))
	for _, it := range pending {
		if it.ctx.Err() != nil {
			it.done <- acceptResult{err: it.ctx.Err()} // the client is gone and nothing was written
			continue
		}
		k := tenantKey{it.tenant, it.key}
		if seen[k] || len(batch) == c.cfg.MaxBatch {
			rest = append(rest, it)
			continue
		}
		seen[k] = true
		batch = append(batch, it)
	}
	return batch, rest, true
}

// commit runs one batch's transaction and answers its requests.
func (c *committer) commit(conn *pgxpool.Conn, batch []*acceptItem) {
	// Not the server's context: a batch in flight at shutdown finishes.
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.RequestTimeout)
	defer cancel()
	start := time.Now()
	results, err := c.tryCommit(ctx, conn, batch)
	if isMissingPartition(err) {
		// The janitor (in the relay) keeps a week of partitions ready; if
		// it has not run for that long, make today's here and try again.
		c.logger.Warn("idempotency_keys has no partition for today; creating it", "err", err)
		if _, perr := postgres.EnsureDailyPartitions(ctx, c.pool, "idempotency_keys", 7); perr == nil {
			results, err = c.tryCommit(ctx, conn, batch)
		}
	}
	c.metrics.batchSize.Observe(float64(len(batch)))
	c.metrics.batchDuration.Observe(time.Since(start).Seconds())
	var n int
	for i, it := range batch {
		if err != nil {
			it.done <- acceptResult{err: err}
			continue
		}
		if results[i].outcome == outcomeAccepted {
			n++
		}
		it.done <- results[i]
	}
	if n > 0 {
		c.metrics.accepted.Add(float64(n))
		if c.cfg.OnAccept != nil {
			c.cfg.OnAccept()
		}
	}
}

const (
	// activeKeysSQL checks the batch's API keys again inside the
	// transaction: a key revoked since the request was authenticated from
	// the cache writes nothing.
	activeKeysSQL = `SELECT key_hash, tenant FROM api_keys WHERE key_hash = ANY($1) AND revoked_at IS NULL`
	// lockKeysSQL takes the transaction-level advisory lock of every key
	// of the batch, in ascending lock id order: two batches that share
	// keys then wait for each other instead of deadlocking. The sorted
	// subquery is not flattened (it has an ORDER BY), so the locks are
	// taken in its order. The lock id is the one the single-request path
	// of the first release used, hash(tenant || '/' || key); a tenant has
	// no '/', so the string is unambiguous.
	lockKeysSQL = `SELECT pg_advisory_xact_lock(l.id) FROM (
		SELECT DISTINCT hashtextextended(u.tenant || '/' || u.key, 0) AS id
		FROM unnest($1::text[], $2::text[]) AS u(tenant, key)
		ORDER BY 1) AS l`
	// lookupKeysSQL runs after the locks, as its own statement, so its
	// snapshot includes whatever the holders of those locks committed. Only
	// records inside the retention count: a key older than that is new.
	// The upper bound only lets Postgres skip the partitions made ahead for
	// the coming week; it is a day away because a record committed by the
	// lock's previous holder may carry a created_at (its transaction's
	// start) a little after this transaction's now().
	lookupKeysSQL = `SELECT DISTINCT ON (k.tenant, k.key)
			k.tenant, k.key, k.created_at, k.request_hash, k.response_status, k.response_headers, k.response_body
		FROM idempotency_keys AS k
		JOIN unnest($1::text[], $2::text[]) AS u(tenant, key) ON k.tenant = u.tenant AND k.key = u.key
		WHERE k.created_at > now() - make_interval(secs => $3) AND k.created_at < now() + interval '1 day'
		ORDER BY k.tenant, k.key, k.created_at DESC`
	countKeysSQL = `UPDATE idempotency_keys AS k
		SET replays = k.replays + u.replays, conflicts = k.conflicts + u.conflicts, last_seen_at = now()
		FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::int[], $5::int[])
			AS u(tenant, key, created_at, replays, conflicts)
		WHERE k.tenant = u.tenant AND k.key = u.key AND k.created_at = u.created_at`
	insertOutboxSQL = `INSERT INTO outbox (shard, topic, key, value, headers)
		SELECT u.shard, $1, u.key, u.value, u.headers::jsonb
		FROM unnest($2::int[], $3::bytea[], $4::bytea[], $5::text[]) AS u(shard, key, value, headers)`
	insertStatusSQL = `INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status)
		SELECT u.id::uuid, u.tenant, u.aggregate_id, u.command_type, 'pending'
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS u(id, tenant, aggregate_id, command_type)`
	insertKeysSQL = `INSERT INTO idempotency_keys
			(tenant, key, route, request_hash, command_id, response_status, response_headers, response_body)
		SELECT u.tenant, u.key, u.route, u.hash, u.id::uuid, u.status, u.headers::jsonb, u.body
		FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[], $6::int[], $7::text[], $8::bytea[])
			AS u(tenant, key, route, hash, id, status, headers, body)`
)

type storedKey struct {
	createdAt time.Time
	hash      []byte
	resp      storedResponse
}

// tryCommit is one attempt at a batch's transaction, in two round trips
// when nothing fails:
//
//  1. BEGIN, check the API keys, lock every idempotency key (sorted) and
//     look them up;
//  2. classify each request (in Go): replay, conflict or new, with a new
//     command id;
//  3. count replays and conflicts on their key records, insert the new
//     commands (outbox, pending status, key record) in bulk behind a
//     savepoint, and COMMIT.
//
// If the bulk insert fails, the pipeline stops there (Postgres skips the
// rest, COMMIT included): roll back to the savepoint, insert the new
// commands one by one, each behind its own savepoint, so only the request
// that fails gets an error, and commit.
//
// An error returned is the whole batch's (the database went away, the
// commit failed): nothing of the batch was written, or, for a commit that
// failed in flight, a retry with the same key finds out.
func (c *committer) tryCommit(ctx context.Context, pc *pgxpool.Conn, batch []*acceptItem) (results []acceptResult, err error) {
	conn := pc.Conn()
	defer func() {
		if err != nil && !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, rerr := conn.Exec(rctx, "ROLLBACK"); rerr != nil {
				conn.Close(rctx) // never hand an open transaction to the next batch
			}
		}
	}()
	valid, found, err := c.lockAndLookup(ctx, conn, batch)
	if err != nil {
		return nil, err
	}

	results = make([]acceptResult, len(batch))
	var count counts
	var fresh newRows
	for i, it := range batch {
		k, ok := found[tenantKey{it.tenant, it.key}]
		switch {
		case valid[string(it.keyHash)] != it.tenant:
			results[i] = acceptResult{outcome: outcomeUnauthorized}
		case !ok:
			id := pipeline.NewCommandID()
			results[i] = acceptResult{outcome: outcomeAccepted, resp: acceptedResponse(id)}
			fresh.add(c.cfg, i, it, id, results[i].resp)
		case bytes.Equal(k.hash, it.hash):
			results[i] = acceptResult{outcome: outcomeReplayed, resp: k.resp}
			count.add(it, k.createdAt, 1, 0)
		default:
			results[i] = acceptResult{outcome: outcomeConflict}
			count.add(it, k.createdAt, 0, 1)
		}
	}

	b := &pgx.Batch{}
	if len(count.tenants) > 0 {
		b.Queue(countKeysSQL, count.tenants, count.keys, count.createdAt, count.replays, count.conflicts)
	}
	if fresh.len() > 0 {
		queueInserts(b, c.cfg.CommandsTopic, &fresh, "accept_batch", false)
	}
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	var countErr, insertErr, commitErr error
	if len(count.tenants) > 0 {
		_, countErr = br.Exec()
	}
	if fresh.len() > 0 {
		for range 4 { // savepoint and three inserts
			if _, err := br.Exec(); err != nil && insertErr == nil {
				insertErr = err
			}
		}
	}
	tag, commitErr := br.Exec()
	closeErr := br.Close()
	switch {
	case countErr != nil:
		return nil, fmt.Errorf("count replays and conflicts: %w", countErr)
	case insertErr == nil && commitErr == nil && closeErr == nil && tag.String() == "COMMIT":
		return results, nil
	case insertErr == nil:
		return nil, fmt.Errorf("commit accept transaction: %w", errors.Join(commitErr, closeErr, errNotCommitted(tag)))
	case postgres.IsUnavailable(insertErr) || isMissingPartition(insertErr) || ctx.Err() != nil:
		return nil, fmt.Errorf("insert accepted commands: %w", insertErr)
	}
	c.logger.Warn("bulk accept failed; isolating the failing request", "err", insertErr)
	if err := c.insertEach(ctx, conn, &fresh, results); err != nil {
		return nil, err
	}
	tag, err = conn.Exec(ctx, "COMMIT")
	if err != nil || tag.String() != "COMMIT" {
		return nil, fmt.Errorf("commit accept transaction: %w", errors.Join(err, errNotCommitted(tag)))
	}
	return results, nil
}

// errNotCommitted reports a COMMIT that answered ROLLBACK (the
// transaction had failed).
func errNotCommitted(tag pgconn.CommandTag) error {
	if tag.String() == "COMMIT" || tag.String() == "" {
		return nil
	}
	return fmt.Errorf("the transaction was rolled back (%s)", tag)
}

// lockAndLookup begins the transaction, checks the batch's API keys,
// takes the idempotency locks and looks the keys up, in one round trip.
// valid maps each API key hash that is still active to its tenant.
func (c *committer) lockAndLookup(ctx context.Context, conn *pgx.Conn, batch []*acceptItem) (valid map[string]string, found map[tenantKey]storedKey, err error) {
	tenants := make([]string, len(batch))
	keys := make([]string, len(batch))
	hashes := make([][]byte, len(batch))
	for i, it := range batch {
		tenants[i], keys[i], hashes[i] = it.tenant, it.key, it.keyHash
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(activeKeysSQL, hashes)
	b.Queue(lockKeysSQL, tenants, keys)
	b.Queue(lookupKeysSQL, tenants, keys, c.cfg.IdempotencyRetention.Seconds())
	br := conn.SendBatch(ctx, b)
	defer br.Close()

	if _, err := br.Exec(); err != nil {
		return nil, nil, fmt.Errorf("begin accept transaction: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, nil, fmt.Errorf("check api keys: %w", err)
	}
	valid = make(map[string]string)
	for rows.Next() {
		var h []byte
		var t string
		if err := rows.Scan(&h, &t); err != nil {
			return nil, nil, fmt.Errorf("check api keys: %w", err)
		}
		valid[string(h)] = t
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("check api keys: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return nil, nil, fmt.Errorf("lock idempotency keys: %w", err)
	}
	rows, err = br.Query()
	if err != nil {
		return nil, nil, fmt.Errorf("look up idempotency keys: %w", err)
	}
	found = make(map[tenantKey]storedKey)
	for rows.Next() {
		var tk tenantKey
		var k storedKey
		if err := rows.Scan(&tk.tenant, &tk.key, &k.createdAt, &k.hash, &k.resp.Status, &k.resp.Headers, &k.resp.Body); err != nil {
			return nil, nil, fmt.Errorf("look up idempotency keys: %w", err)
		}
		found[tk] = k
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("look up idempotency keys: %w", err)
	}
	return valid, found, br.Close()
}

// insertEach inserts the new commands one by one behind a savepoint each,
// after a bulk insert failed: the request whose rows fail gets the error,
// the others are accepted. An error returned is the whole batch's.
func (c *committer) insertEach(ctx context.Context, conn *pgx.Conn, all *newRows, results []acceptResult) error {
	if _, err := conn.Exec(ctx, "ROLLBACK TO SAVEPOINT accept_batch"); err != nil {
		return fmt.Errorf("roll back the bulk accept: %w", err)
	}
	for j, i := range all.index {
		one := all.slice(j)
		b := &pgx.Batch{}
		queueInserts(b, c.cfg.CommandsTopic, &one, "accept_one", true)
		err := conn.SendBatch(ctx, b).Close()
		if err == nil {
			continue
		}
		if postgres.IsUnavailable(err) || ctx.Err() != nil {
			return err
		}
		if _, rerr := conn.Exec(ctx, "ROLLBACK TO SAVEPOINT accept_one"); rerr != nil {
			return fmt.Errorf("roll back a failed accept: %w", rerr)
		}
		c.logger.Error("accept failed", "tenant", one.tenants[0], "aggregate_id", one.aggregates[0], "err", err)
		results[i] = acceptResult{err: fmt.Errorf("insert accepted command: %w", err)}
	}
	return nil
}

// queueInserts queues the inserts of rows behind a savepoint (released
// after them when release is set): four statements, five with the
// release.
func queueInserts(b *pgx.Batch, topic string, r *newRows, savepoint string, release bool) {
	b.Queue("SAVEPOINT " + savepoint)
	b.Queue(insertOutboxSQL, topic, r.shards, r.aggregateKeys, r.values, r.headers)
	b.Queue(insertStatusSQL, r.ids, r.tenants, r.aggregates, r.types)
	b.Queue(insertKeysSQL, r.tenants, r.keys, r.routes, r.hashes, r.ids, r.statuses, r.respHeaders, r.bodies)
	if release {
		b.Queue("RELEASE SAVEPOINT " + savepoint)
	}
}

// counts are the replays and conflicts of one batch, as columns.
type counts struct {
	tenants, keys      []string
	createdAt          []time.Time
	replays, conflicts []int32
}

func (c *counts) add(it *acceptItem, createdAt time.Time, replays, conflicts int32) {
	c.tenants = append(c.tenants, it.tenant)
	c.keys = append(c.keys, it.key)
	c.createdAt = append(c.createdAt, createdAt)
	c.replays = append(c.replays, replays)
	c.conflicts = append(c.conflicts, conflicts)
}

// newRows are the rows of a batch's new commands, as columns (one array
// parameter per column, so a batch is three statements whatever its size).
type newRows struct {
	index                           []int // the request's position in the batch
	shards                          []int32
	aggregateKeys, values           [][]byte
	headers                         []string
	ids, tenants, aggregates, types []string
	keys, routes, respHeaders       []string
	hashes, bodies                  [][]byte
	statuses                        []int32
}

func (r *newRows) len() int { return len(r.index) }

func (r *newRows) add(cfg Config, i int, it *acceptItem, id pipeline.ID, resp storedResponse) {
	aggregateID := pipeline.AggregateID(it.tenant, it.localID)
	h := map[string]string{
		pipeline.HeaderCommandID:   id.String(),
		pipeline.HeaderTenant:      it.tenant,
		pipeline.HeaderCommandType: it.commandType,
	}
	if it.traceparent != "" {
		h[pipeline.HeaderTraceparent] = it.traceparent
	}
	hj, _ := json.Marshal(h)
	rh, _ := json.Marshal(resp.Headers)
	r.index = append(r.index, i)
	r.shards = append(r.shards, int32(pipeline.OutboxShard(aggregateID, cfg.Shards)))
	r.aggregateKeys = append(r.aggregateKeys, []byte(aggregateID))
	r.values = append(r.values, it.value)
	r.headers = append(r.headers, string(hj))
	r.ids = append(r.ids, id.String())
	r.tenants = append(r.tenants, it.tenant)
	r.aggregates = append(r.aggregates, aggregateID)
	r.types = append(r.types, it.commandType)
	r.keys = append(r.keys, it.key)
	r.routes = append(r.routes, it.route)
	r.hashes = append(r.hashes, it.hash)
	r.statuses = append(r.statuses, int32(resp.Status))
	r.respHeaders = append(r.respHeaders, string(rh))
	r.bodies = append(r.bodies, resp.Body)
}

// slice returns the j-th row alone.
func (r *newRows) slice(j int) newRows {
	return newRows{
		index: r.index[j : j+1], shards: r.shards[j : j+1], aggregateKeys: r.aggregateKeys[j : j+1],
		values: r.values[j : j+1], headers: r.headers[j : j+1], ids: r.ids[j : j+1],
		tenants: r.tenants[j : j+1], aggregates: r.aggregates[j : j+1], types: r.types[j : j+1],
		keys: r.keys[j : j+1], routes: r.routes[j : j+1], respHeaders: r.respHeaders[j : j+1],
		hashes: r.hashes[j : j+1], bodies: r.bodies[j : j+1], statuses: r.statuses[j : j+1],
	}
}

// isMissingPartition reports whether err is Postgres refusing a row
// because no partition covers its created_at.
func isMissingPartition(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514" && strings.Contains(pgErr.Message, "no partition")
}
