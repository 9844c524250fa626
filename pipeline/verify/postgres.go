package verify

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pipeline"
)

// The window's records, by plain SELECTs. The inbox is read from a minute
// before the window (an event is applied after it was written, but the
// database's clock and the broker's may differ).
const (
	// statusSQL: the pending commands of the window; the decided are only
	// counted (a command with an event was decided, whatever its row).
	statusSQL = `SELECT command_id::text, tenant, aggregate_id, command_type, status, ingested, created_at
		FROM command_status WHERE created_at >= $1 AND created_at < $2 AND ($3 = '' OR tenant = $3) AND status = 'pending'`
	statusCountSQL = `SELECT count(*) FROM command_status WHERE created_at >= $1 AND created_at < $2 AND ($3 = '' OR tenant = $3)`
	// keysSQL: the window's keys whose command has no status row (ingest
	// writes both in one transaction), and how many keys there are.
	keysSQL = `SELECT tenant, key, command_id::text, created_at FROM idempotency_keys k
		WHERE created_at >= $1 AND created_at < $2 AND ($3 = '' OR tenant = $3)
		  AND NOT EXISTS (SELECT 1 FROM command_status s WHERE s.command_id = k.command_id)`
	keysCountSQL = `SELECT count(*) FROM idempotency_keys WHERE created_at >= $1 AND created_at < $2 AND ($3 = '' OR tenant = $3)`
	// decidedSQL: which of the commands on a commands topic with no event
	// (in flight, most often) have an outcome by now.
	decidedSQL = `SELECT command_id::text, aggregate_id FROM command_status WHERE command_id = ANY($1::uuid[]) AND status <> 'pending'`
	outboxSQL  = `SELECT id, shard, coalesce(headers->>'command-id', ''), convert_from(key, 'UTF8'), created_at FROM outbox WHERE created_at < $1`
	deadSQL    = `SELECT id, shard, coalesce(headers->>'command-id', ''), convert_from(key, 'UTF8'), dead_at FROM outbox_dead WHERE created_at < $1`
	inboxSQL   = `SELECT consumer, event_id::text, count(*), min(received_at) FROM inbox
		WHERE received_at >= $1::timestamptz - interval '1 minute' AND consumer = ANY($2) GROUP BY consumer, event_id`
	offsetsSQL = `SELECT consumer, topic, partition, next_offset FROM consumer_offsets WHERE topic = ANY($1) AND consumer = ANY($2)`
	skipsSQL   = `SELECT consumer, topic, partition, from_offset, to_offset FROM projector_skips WHERE topic = ANY($1)`
	// doubledJobsSQL: River's unique key keeps one job per key in every
	// state; two are one effect key run twice (a delivery's key is the
	// Idempotency-Key its receiver applies once: it is applied twice where
	// the receiver does not keep it).
	doubledJobsSQL = `SELECT args->>'key', kind, count(*), min(created_at), coalesce(args->>'tenant', ''),
			coalesce(min(args->>'event_id'), ''), string_agg(id::text || ' ' || state::text, ', ' ORDER BY id)
		FROM river_job WHERE created_at >= $1 AND created_at < $2 AND args ? 'key' AND ($3 = '' OR args->>'tenant' = $3)
		GROUP BY args->>'key', kind, coalesce(args->>'tenant', '') HAVING count(*) > 1`
	// waitingDeliveriesSQL: deliveries not yet acknowledged past the
	// bound; dead ones are the delivery log's (onceflow webhooks
	// redeliver), not lost: they are recorded with their last answer.
	waitingDeliveriesSQL = `SELECT tenant, subscription_id::text, event_id::text, status, attempts, created_at FROM webhook_deliveries
		WHERE created_at >= $1 AND created_at < $2 AND created_at < $4 AND status IN ('pending', 'failed') AND ($3 = '' OR tenant = $3)`
	countsSQL = `SELECT (SELECT count(*) FROM webhook_deliveries WHERE created_at >= $1 AND created_at < $2 AND ($3 = '' OR tenant = $3)),
		(SELECT count(*) FROM river_job WHERE created_at >= $1 AND created_at < $2 AND args ? 'key' AND ($3 = '' OR args->>'tenant' = $3))`
)

// readPostgres reads the window's records in one snapshot.
func (v *run) readPostgres(ctx context.Context, pool *pgxpool.Pool) error {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("begin the snapshot: %w", err)
	}
	defer tx.Rollback(ctx)
	c := v.cfg
	rows, _ := tx.Query(ctx, statusSQL, c.From, c.To, c.Tenant)
	var s status
	if _, err := pgx.ForEachRow(rows, []any{&s.id, &s.tenant, &s.aggregate, &s.commandType, &s.status, &s.ingested, &s.createdAt}, func() error {
		v.statuses = append(v.statuses, s)
		return nil
	}); err != nil {
		return fmt.Errorf("read command_status: %w", err)
	}
	rows, _ = tx.Query(ctx, keysSQL, c.From, c.To, c.Tenant)
	var k key
	if _, err := pgx.ForEachRow(rows, []any{&k.tenant, &k.key, &k.commandID, &k.createdAt}, func() error {
		v.keys = append(v.keys, k)
		return nil
	}); err != nil {
		return fmt.Errorf("read idempotency_keys: %w", err)
	}
	if err := tx.QueryRow(ctx, statusCountSQL, c.From, c.To, c.Tenant).Scan(&v.statusCount); err != nil {
		return fmt.Errorf("count command_status: %w", err)
	}
	if err := tx.QueryRow(ctx, keysCountSQL, c.From, c.To, c.Tenant).Scan(&v.keyCount); err != nil {
		return fmt.Errorf("count idempotency_keys: %w", err)
	}
	if v.outbox, err = readOutbox(ctx, tx, outboxSQL, c.To); err != nil {
		return fmt.Errorf("read the outbox: %w", err)
	}
	if v.dead, err = readOutbox(ctx, tx, deadSQL, c.To); err != nil {
		return fmt.Errorf("read outbox_dead: %w", err)
	}
	if err := v.readProjectors(ctx, tx); err != nil {
		return err
	}
	if err := v.readWorker(ctx, tx); err != nil {
		return err
	}
	v.rep.Checked = append(v.rep.Checked,
		Check{"commands accepted or decided in the window (command_status)", v.statusCount},
		Check{"Idempotency-Keys accepted in the window (idempotency_keys)", v.keyCount},
		Check{"rows waiting in the outbox", len(v.outbox)},
		Check{"rows in outbox_dead", len(v.dead)},
		Check{"inbox rows of the projectors", len(v.inbox)})
	return tx.Commit(ctx)
}

func readOutbox(ctx context.Context, tx pgx.Tx, sql string, to time.Time) (map[cmdKey]row, error) {
	out := map[cmdKey]row{}
	rows, _ := tx.Query(ctx, sql, to)
	var r row
	var k cmdKey
	_, err := pgx.ForEachRow(rows, []any{&r.id, &r.shard, &k.id, &k.aggregate, &r.createdAt}, func() error {
		out[k] = r
		return nil
	})
	return out, err
}

// readProjectors reads the projectors' inbox rows of the window, their
// offsets and the records operators skipped on purpose.
func (v *run) readProjectors(ctx context.Context, tx pgx.Tx) error {
	var topics, consumers []string
	for _, e := range v.cfg.Events {
		topics = append(topics, e.Topic)
		consumers = append(consumers, e.Projectors...)
	}
	v.inbox = map[inboxKey]applied{}
	rows, _ := tx.Query(ctx, inboxSQL, v.cfg.From, consumers)
	var k inboxKey
	var a applied
	if _, err := pgx.ForEachRow(rows, []any{&k.consumer, &k.eventID, &a.count, &a.first}, func() error {
		v.inbox[k] = a
		return nil
	}); err != nil {
		return fmt.Errorf("read the inbox: %w", err)
	}
	v.offsets = map[string]map[string]map[int32]int64{}
	rows, _ = tx.Query(ctx, offsetsSQL, topics, consumers)
	var consumer, topic string
	var part int32
	var next int64
	if _, err := pgx.ForEachRow(rows, []any{&consumer, &topic, &part, &next}, func() error {
		if v.offsets[consumer] == nil {
			v.offsets[consumer] = map[string]map[int32]int64{}
		}
		if v.offsets[consumer][topic] == nil {
			v.offsets[consumer][topic] = map[int32]int64{}
		}
		v.offsets[consumer][topic][part] = next
		return nil
	}); err != nil {
		return fmt.Errorf("read the projectors' offsets: %w", err)
	}
	rows, _ = tx.Query(ctx, skipsSQL, topics)
	var s skip
	if _, err := pgx.ForEachRow(rows, []any{&s.consumer, &s.topic, &s.partition, &s.from, &s.to}, func() error {
		v.skips = append(v.skips, s)
		return nil
	}); err != nil {
		return fmt.Errorf("read projector_skips: %w", err)
	}
	return nil
}

// readWorker reads the effect keys of the window's jobs run more than
// once and the webhook deliveries waiting past the bound.
func (v *run) readWorker(ctx context.Context, tx pgx.Tx) error {
	c := v.cfg
	rows, _ := tx.Query(ctx, doubledJobsSQL, c.From, c.To, c.Tenant)
	var f Finding
	var n int
	var jobs string
	if _, err := pgx.ForEachRow(rows, []any{&f.Key, &f.Consumer, &n, &f.Since, &f.Tenant, &f.EventID, &jobs}, func() error {
		f.Stage, f.Kind = StageWorker, Doubled
		f.LastSeen = fmt.Sprintf("%d %s jobs with one key: %s", n, f.Consumer, jobs)
		v.jobs = append(v.jobs, f)
		return nil
	}); err != nil {
		return fmt.Errorf("read river_job: %w", err)
	}
	rows, _ = tx.Query(ctx, waitingDeliveriesSQL, c.From, c.To, c.Tenant, v.now.Add(-c.PendingBound))
	var sub, st string
	var attempts int
	if _, err := pgx.ForEachRow(rows, []any{&f.Tenant, &sub, &f.EventID, &st, &attempts, &f.Since}, func() error {
		v.deliveries = append(v.deliveries, Finding{Stage: StageWorker, Kind: Pending, Tenant: f.Tenant, EventID: f.EventID,
			Consumer: "subscription " + sub, Since: f.Since,
			LastSeen: fmt.Sprintf("webhook_deliveries: %s after %d attempts", st, attempts)})
		return nil
	}); err != nil {
		return fmt.Errorf("read webhook_deliveries: %w", err)
	}
	var deliveries, keyed int
	if err := tx.QueryRow(ctx, countsSQL, c.From, c.To, c.Tenant).Scan(&deliveries, &keyed); err != nil {
		return fmt.Errorf("count the deliveries and jobs: %w", err)
	}
	v.rep.Checked = append(v.rep.Checked, Check{"webhook deliveries (webhook_deliveries)", deliveries},
		Check{"jobs by their effect keys (river_job)", keyed})
	return nil
}

// decided removes from cmds those that have an outcome in command_status
// by now: read after the topics, so a command decided meanwhile is not
// reported.
func decided(ctx context.Context, pool *pgxpool.Pool, cmds map[cmdKey]position) error {
	if len(cmds) == 0 {
		return nil
	}
	ids := make([]string, 0, len(cmds))
	for k := range cmds {
		if _, err := pipeline.ParseID(k.id); err == nil {
			ids = append(ids, k.id)
		}
	}
	rows, _ := pool.Query(ctx, decidedSQL, ids)
	var k cmdKey
	_, err := pgx.ForEachRow(rows, []any{&k.id, &k.aggregate}, func() error {
		delete(cmds, k)
		return nil
	})
	if err != nil {
		return fmt.Errorf("read the outcomes of the commands in flight: %w", err)
	}
	return nil
}
