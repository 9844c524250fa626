package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/tracing"
)

// acceptItem is one validated request waiting for an accept transaction.
type acceptItem struct {
	ctx         context.Context // the request's: one that ended before its batch began is dropped
	arrived     time.Time       // when the request came in, for the command's age at commit
	tenant, key string
	keyHash     []byte // the API key's hash, checked again in the transaction
	route       string // the route pattern, kept with the key for operators
	hash        []byte // the request hash (requestHash)
	localID     string
	commandType string
	topic       string // the commands topic of the command's aggregate type
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
	// command is an accepted command's id, aggregate and outbox shard.
	command   pipeline.ID
	aggregate string
	shard     int
}

// storedResponse is what idempotency_keys keeps of the response.
type storedResponse struct {
	Status  int
	Headers map[string]string
	Body    []byte
}

// acceptedResponse is a new command's 202, and its headers as the JSON
// object idempotency_keys keeps. Both JSON texts are written out rather
// than marshalled: every accepted request makes them, and a command id
// (its only variable part) needs no escaping.
func acceptedResponse(id pipeline.ID) (storedResponse, string) {
	cid := id.String()
	location := "/v1/commands/" + cid
	return storedResponse{
		Status:  http.StatusAccepted,
		Headers: map[string]string{"Content-Type": "application/json", "Location": location},
		Body:    []byte(`{"command_id":"` + cid + `","status":"pending"}` + "\n"),
	}, `{"Content-Type":"application/json","Location":"` + location + `"}`
}

// headersJSON is a command record's headers as the JSON object of strings
// the outbox keeps (the relay produces them as they are). Written out
// rather than marshalled from a map, as acceptedResponse's.
func headersJSON(headers []kgo.RecordHeader) string {
	b := make([]byte, 0, 192)
	b = append(b, '{')
	for i, h := range headers {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, h.Key)
		b = append(b, ':')
		b = appendJSONString(b, string(h.Value))
	}
	return string(append(b, '}'))
}

// appendJSONString appends s as a JSON string: quotes, backslashes and
// control characters escaped, the rest as it is (s is UTF-8: Postgres
// refuses anything else as a text parameter).
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := range len(s) {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
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
	wake    *wakeups // tells the relays of each commit; nil in tests of the committer alone
	tracer  tracing.Tracer
}

func newCommitter(pool *pgxpool.Pool, cfg Config, logger *slog.Logger, m *metrics) *committer {
	return &committer{pool: pool, cfg: cfg, logger: logger, metrics: m, queue: make(chan *acceptItem, cfg.MaxPending),
		tracer: tracing.New(cfg.TracerProvider)}
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
		wg.Go(func() { c.work(ctx) })
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
	// The transaction's span links to each command's outbox insert
	// (docs/observability.md); its statements are its children.
	links := tracing.Links(c.tracer, batch, func(it *acceptItem) context.Context { return it.ctx })
	ctx, span := c.tracer.Batch(ctx, "onceflow.ingest.commit", links, trace.WithAttributes(attribute.Int("onceflow.batch.size", len(batch))))
	defer span.End()
	start := time.Now()
	results, err := c.tryCommit(ctx, conn, batch)
	if postgres.IsSerialization(err) && !conn.Conn().IsClosed() {
		// Keys are locked in one order, so batches should never deadlock
		// each other; if Postgres still picks this transaction as a
		// deadlock victim, nothing was written: try once more.
		results, err = c.tryCommit(ctx, conn, batch)
	}
	if postgres.IsMissingPartition(err, "idempotency_keys") {
		// The janitor (in the relay) keeps a week of partitions ready; if
		// it has not run for that long, make today's here and try again.
		c.logger.Warn("idempotency_keys has no partition for today; creating it", "err", err)
		if _, perr := postgres.EnsureDailyPartitions(ctx, c.pool, "idempotency_keys", 7); perr == nil {
			results, err = c.tryCommit(ctx, conn, batch)
		}
	}
	c.metrics.batchSize.Observe(float64(len(batch)))
	c.metrics.batchDuration.Observe(time.Since(start).Seconds())
	if err == nil && c.wake != nil {
		fresh := make(map[pipeline.ID]freshCommand, len(batch))
		for i, it := range batch {
			if results[i].outcome == outcomeAccepted {
				fresh[results[i].command] = freshCommand{tenant: it.tenant, aggregate: results[i].aggregate}
			}
		}
		c.wake.accepting(fresh)
	}
	var shards []int // of the accepted commands' rows, one per command
	for i, it := range batch {
		if err != nil {
			it.done <- acceptResult{err: err}
			continue
		}
		if results[i].outcome == outcomeAccepted {
			shards = append(shards, results[i].shard)
		}
		it.done <- results[i]
	}
	if n := len(shards); n > 0 {
		c.metrics.accepted.Add(float64(n))
		if c.cfg.OnAccept != nil {
			shards = c.cfg.OnAccept(shards)
		}
		if c.wake != nil && len(shards) > 0 {
			c.wake.accepted(shards...)
		}
		now := time.Now()
		for i, it := range batch {
			if results[i].outcome == outcomeAccepted {
				c.metrics.age.Observe(now.Sub(it.arrived).Seconds())
			}
		}
	}
}

const (
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

	// acceptSQL accepts a batch of requests (one per key, their keys
	// locked) in one statement. It runs after lockKeysSQL, as its own
	// statement, so its snapshot includes whatever the previous holders of
	// those locks committed. Each input row carries everything a new
	// command needs (its command id and 202 response are minted in Go
	// beforehand and dropped if unused). Per request:
	//
	//   - authorized: its API key is still active for its tenant (a key
	//     revoked since the request was authenticated from the cache
	//     writes nothing);
	//   - existing: the key's record inside the retention, if any (the
	//     upper bound only lets Postgres skip the partitions made ahead:
	//     it is a day away because the previous lock holder's record
	//     carries its transaction's start, which may be a little after
	//     this transaction's now());
	//   - fresh requests insert their outbox row, pending status and key
	//     record; replays and conflicts are counted on the existing record
	//     (the update repeats existing's window so Postgres skips the other
	//     partitions, and is skipped altogether, by a one-time filter, in
	//     the usual batch that has no existing record: without both it
	//     probed every partition for every request, a tenth of the
	//     statement).
	//
	// It returns one row per request, in input order, with its outcome and,
	// for a replay, the stored response.
	acceptSQL = `WITH input AS (
		SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bytea[], $5::text[], $6::text[], $7::int[],
			$8::bytea[], $9::bytea[], $10::text[], $11::text[], $12::text[], $13::int[], $14::text[], $15::bytea[], $16::text[])
			WITH ORDINALITY AS i(tenant, key, key_hash, hash, route, command_id, shard,
				aggregate_key, value, headers, aggregate_id, command_type, status, response_headers, response_body, topic, ord)
	), authorized AS (
		SELECT i.* FROM input AS i
		WHERE EXISTS (SELECT 1 FROM api_keys AS a WHERE a.key_hash = i.key_hash AND a.tenant = i.tenant AND a.revoked_at IS NULL)
	), existing AS (
		SELECT DISTINCT ON (k.tenant, k.key) k.tenant, k.key, k.created_at, k.request_hash,
			k.response_status, k.response_headers, k.response_body
		FROM idempotency_keys AS k JOIN authorized AS i ON k.tenant = i.tenant AND k.key = i.key
		WHERE k.created_at > now() - make_interval(secs => $17) AND k.created_at < now() + interval '1 day'
		ORDER BY k.tenant, k.key, k.created_at DESC
	), fresh AS (
		SELECT i.* FROM authorized AS i
		WHERE NOT EXISTS (SELECT 1 FROM existing AS e WHERE e.tenant = i.tenant AND e.key = i.key)
	), outbox_rows AS (
		INSERT INTO outbox (shard, topic, key, value, headers)
		SELECT shard, topic, aggregate_key, value, headers::jsonb FROM fresh ORDER BY ord
	), status_rows AS (
		INSERT INTO command_status (command_id, tenant, aggregate_id, command_type, status, ingested)
		SELECT command_id::uuid, tenant, aggregate_id, command_type, 'pending', true FROM fresh
	), key_rows AS (
		INSERT INTO idempotency_keys
			(tenant, key, route, request_hash, command_id, response_status, response_headers, response_body)
		SELECT tenant, key, route, hash, command_id::uuid, status, response_headers::jsonb, response_body FROM fresh
	), counted AS (
		UPDATE idempotency_keys AS k
		SET replays = k.replays + (e.request_hash = i.hash)::int,
			conflicts = k.conflicts + (e.request_hash <> i.hash)::int,
			last_seen_at = now()
		FROM existing AS e JOIN authorized AS i ON i.tenant = e.tenant AND i.key = e.key
		WHERE k.tenant = e.tenant AND k.key = e.key AND k.created_at = e.created_at
			AND k.created_at > now() - make_interval(secs => $17) AND k.created_at < now() + interval '1 day'
			AND EXISTS (SELECT 1 FROM existing)
	)
	SELECT CASE
			WHEN NOT EXISTS (SELECT 1 FROM authorized AS a WHERE a.ord = i.ord) THEN 'unauthorized'
			WHEN e.key IS NULL THEN 'accepted'
			WHEN e.request_hash = i.hash THEN 'replayed'
			ELSE 'conflict' END,
		e.response_status, e.response_headers, e.response_body
	FROM input AS i LEFT JOIN existing AS e ON e.tenant = i.tenant AND e.key = i.key
	ORDER BY i.ord`
)

// tryCommit is one attempt at a batch's transaction. When nothing fails
// it is one round trip: BEGIN, lock the keys (sorted), SAVEPOINT, accept
// the whole batch in one statement (acceptSQL), COMMIT.
//
// If the accept statement fails, Postgres skips the rest of the pipeline,
// COMMIT included: roll back to the savepoint and accept the requests one
// by one, each behind its own savepoint, so only the request that fails
// gets an error; then commit.
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
	in := c.inputs(batch)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(lockKeysSQL, in.tenants, in.keys)
	b.Queue("SAVEPOINT accept_batch")
	b.Queue(acceptSQL, in.args(0, len(batch), c.cfg)...)
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return nil, fmt.Errorf("begin accept transaction: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		br.Close()
		return nil, fmt.Errorf("lock idempotency keys: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		br.Close()
		return nil, fmt.Errorf("savepoint: %w", err)
	}
	results = make([]acceptResult, len(batch))
	acceptErr := readOutcomes(br, in, 0, results)
	tag, commitErr := br.Exec()
	closeErr := br.Close()
	switch {
	case acceptErr == nil && commitErr == nil && closeErr == nil && tag.String() == "COMMIT":
		return results, nil
	case acceptErr == nil:
		return nil, fmt.Errorf("commit accept transaction: %w", errors.Join(commitErr, closeErr, errNotCommitted(tag)))
	case postgres.IsUnavailable(acceptErr) || postgres.IsMissingPartition(acceptErr, "idempotency_keys") || ctx.Err() != nil:
		return nil, fmt.Errorf("accept commands: %w", acceptErr)
	}

	c.logger.Warn("batch accept failed; isolating the failing request", "err", acceptErr)
	if _, err := conn.Exec(ctx, "ROLLBACK TO SAVEPOINT accept_batch"); err != nil {
		return nil, fmt.Errorf("roll back the batch accept: %w", err)
	}
	for i, it := range batch {
		b := &pgx.Batch{}
		b.Queue("SAVEPOINT accept_one")
		b.Queue(acceptSQL, in.args(i, i+1, c.cfg)...)
		b.Queue("RELEASE SAVEPOINT accept_one")
		br := conn.SendBatch(ctx, b)
		_, err := br.Exec()
		if err == nil {
			err = readOutcomes(br, in, i, results)
		}
		if err == nil {
			_, err = br.Exec()
		}
		err = errors.Join(err, br.Close())
		if err == nil {
			continue
		}
		if postgres.IsUnavailable(err) || ctx.Err() != nil {
			return nil, err
		}
		if _, rerr := conn.Exec(ctx, "ROLLBACK TO SAVEPOINT accept_one"); rerr != nil {
			return nil, fmt.Errorf("roll back a failed accept: %w", rerr)
		}
		c.logger.Error("accept failed", "tenant", it.tenant, "aggregate_id", in.aggregates[i], "err", err)
		results[i] = acceptResult{err: fmt.Errorf("accept command: %w", err)}
	}
	tag, err = conn.Exec(ctx, "COMMIT")
	if err != nil || tag.String() != "COMMIT" {
		return nil, fmt.Errorf("commit accept transaction: %w", errors.Join(err, errNotCommitted(tag)))
	}
	return results, nil
}

// readOutcomes reads acceptSQL's rows for the requests from first on into
// results.
func readOutcomes(br pgx.BatchResults, in *inputs, first int, results []acceptResult) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	i := first
	for rows.Next() {
		var outcome string
		var status *int
		var stored storedResponse
		if err := rows.Scan(&outcome, &status, &stored.Headers, &stored.Body); err != nil {
			return err
		}
		if i >= len(results) {
			return errors.New("accept returned more rows than requests")
		}
		switch outcome {
		case "accepted":
			results[i] = acceptResult{outcome: outcomeAccepted, resp: in.responses[i], command: in.commands[i], aggregate: in.aggregates[i],
				shard: int(in.shards[i])}
		case "replayed":
			stored.Status = *status
			results[i] = acceptResult{outcome: outcomeReplayed, resp: stored}
		case "conflict":
			results[i] = acceptResult{outcome: outcomeConflict}
		default:
			results[i] = acceptResult{outcome: outcomeUnauthorized}
		}
		i++
	}
	return rows.Err()
}

// errNotCommitted reports a COMMIT that answered ROLLBACK (the
// transaction had failed).
func errNotCommitted(tag pgconn.CommandTag) error {
	if tag.String() == "COMMIT" || tag.String() == "" {
		return nil
	}
	return fmt.Errorf("the transaction was rolled back (%s)", tag)
}

// inputs are a batch's requests as the columns of acceptSQL (one array
// parameter per column, so a batch is one statement whatever its size),
// each with the command id and 202 it gets if it is new.
type inputs struct {
	tenants, keys, routes, ids, headers, aggregates, types, respHeaders, topics []string
	keyHashes, hashes, aggregateKeys, values, bodies                            [][]byte
	shards, statuses                                                            []int32
	responses                                                                   []storedResponse
	commands                                                                    []pipeline.ID
}

func (c *committer) inputs(batch []*acceptItem) *inputs {
	in := &inputs{}
	for _, it := range batch {
		id := pipeline.NewCommandID()
		resp, rh := acceptedResponse(id)
		aggregateID := pipeline.AggregateID(it.tenant, it.localID)
		hj := headersJSON(kafka.CommandHeaders(id, it.tenant, it.commandType, it.traceparent))
		in.tenants = append(in.tenants, it.tenant)
		in.keys = append(in.keys, it.key)
		in.keyHashes = append(in.keyHashes, it.keyHash)
		in.hashes = append(in.hashes, it.hash)
		in.routes = append(in.routes, it.route)
		in.ids = append(in.ids, id.String())
		in.commands = append(in.commands, id)
		in.shards = append(in.shards, int32(pipeline.OutboxShard(aggregateID, c.cfg.Shards)))
		in.aggregateKeys = append(in.aggregateKeys, []byte(aggregateID))
		in.values = append(in.values, it.value)
		in.headers = append(in.headers, hj)
		in.aggregates = append(in.aggregates, aggregateID)
		in.types = append(in.types, it.commandType)
		in.topics = append(in.topics, it.topic)
		in.statuses = append(in.statuses, int32(resp.Status))
		in.respHeaders = append(in.respHeaders, rh)
		in.bodies = append(in.bodies, resp.Body)
		in.responses = append(in.responses, resp)
	}
	return in
}

// args are acceptSQL's parameters for the requests [from, to).
func (in *inputs) args(from, to int, cfg Config) []any {
	return []any{
		in.tenants[from:to], in.keys[from:to], in.keyHashes[from:to], in.hashes[from:to], in.routes[from:to],
		in.ids[from:to], in.shards[from:to], in.aggregateKeys[from:to], in.values[from:to], in.headers[from:to],
		in.aggregates[from:to], in.types[from:to], in.statuses[from:to], in.respHeaders[from:to], in.bodies[from:to],
		in.topics[from:to], cfg.IdempotencyRetention.Seconds(),
	}
}
