// Package trace follows one command through the pipeline
// (docs/operations.md#trace): from an Idempotency-Key, a provider event,
// a command id or an event id to the key record, the inbound event, the
// outbox row or where the relay shipped the command (topic, partition,
// offset), its status, its events and where they are on the events
// topic, which consumers of that topic have read past each event
// (Consumers), the projectors' inbox rows, the jobs and webhook
// deliveries the events caused, the commands its decision sent to other
// aggregates and those theirs sent (a transfer's credit and refund), each
// with its status and events, the outcome of the whole, and any
// reconciliation of it, with their times.
//
// What the database still holds is read in one read-only transaction;
// where a command and its events are on Kafka is found by reading the
// topics from the command's time on (Locate), since the outbox row is
// deleted once shipped. Keys are kept for the idempotency retention and
// inbox rows for their partitions' retention: a trace of an older command
// shows what is left.
package trace

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
)

// Trace is one command's path.
type Trace struct {
	Query     string        `json:"query"`
	QueryKind string        `json:"query_kind"` // idempotency-key, provider-event, command-id, event-id
	Key       *KeyRecord    `json:"key,omitempty"`
	Inbound   *InboundEvent `json:"inbound,omitempty"`
	Command   *Command      `json:"command"`
	Outbox    *OutboxRow    `json:"outbox,omitempty"`      // still waiting for a relay
	Dead      *DeadRow      `json:"outbox_dead,omitempty"` // refused by the broker for good
	Shipped   *Position     `json:"shipped,omitempty"`     // where it is on the commands topic
	Events    []Event       `json:"events"`
	// Derived are the commands it led to (its decision sent them, and
	// theirs sent more), a cause before what it sent; Outcome is the
	// outcome of the whole (docs/ingest.md#outcome).
	Derived     []Derived    `json:"derived"`
	Outcome     Outcome      `json:"outcome"`
	Corrections []Correction `json:"corrections,omitempty"`
	// ConsumersAt is when the consumers' offsets were read (Consumers),
	// nil when they were not.
	ConsumersAt *time.Time `json:"consumers_at,omitempty"`
	Notes       []string   `json:"notes,omitempty"` // what could not be found, and why
}

// KeyRecord is the command's idempotency_keys row.
type KeyRecord struct {
	Tenant         string    `json:"tenant"`
	Key            string    `json:"key"`
	Route          string    `json:"route"`
	ResponseStatus int       `json:"response_status"`
	Replays        int64     `json:"replays"`
	Conflicts      int64     `json:"conflicts"`
	CreatedAt      time.Time `json:"created_at"`
	LastSeenAt     time.Time `json:"last_seen_at"`
}

// InboundEvent is the provider event the command came from.
type InboundEvent struct {
	Provider       string    `json:"provider"`
	EventID        string    `json:"event_id"`
	EventType      string    `json:"event_type"`
	Status         string    `json:"status"`
	Deliveries     int       `json:"deliveries"`
	ReceivedAt     time.Time `json:"received_at"`
	LastDeliveryAt time.Time `json:"last_delivery_at"`
}

// Command is the command's command_status row.
type Command struct {
	CommandID   string    `json:"command_id"`
	Tenant      string    `json:"tenant"`
	AggregateID string    `json:"aggregate_id"`
	CommandType string    `json:"command_type"`
	Status      string    `json:"status"`
	Reason      string    `json:"reason,omitempty"`
	Detail      string    `json:"detail,omitempty"`
	Ingested    bool      `json:"ingested"`
	EventIDs    []string  `json:"event_ids"`
	CreatedAt   time.Time `json:"created_at"`
	UpdatedAt   time.Time `json:"updated_at"`
}

// OutboxRow is the command still in the outbox.
type OutboxRow struct {
	ID        int64     `json:"id"`
	Shard     int       `json:"shard"`
	Topic     string    `json:"topic"`
	CreatedAt time.Time `json:"created_at"`
}

// DeadRow is the command in outbox_dead.
type DeadRow struct {
	ID     int64     `json:"id"`
	Reason string    `json:"reason"`
	Detail string    `json:"detail"`
	DeadAt time.Time `json:"dead_at"`
}

// Position is a record on Kafka.
type Position struct {
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	Time      time.Time `json:"time"` // the record's timestamp
}

// Event is one event of the command, as audit_log projected it.
type Event struct {
	EventID    string    `json:"event_id"`
	EventType  string    `json:"event_type"`
	Version    int64     `json:"version"`
	OccurredAt time.Time `json:"occurred_at"`
	Position   *Position `json:"position,omitempty"`
	Inbox      []Inbox   `json:"inbox"`
	// Deliveries are the webhook deliveries the event caused, and Jobs its
	// River jobs (a delivery's among them), while River keeps them.
	Deliveries []Delivery `json:"webhook_deliveries"`
	Jobs       []Job      `json:"jobs"`
	// Consumers are the consumers of the events topic and whether each
	// has read past the event (Consumers), when its position is known.
	Consumers []Consumer `json:"consumers,omitempty"`
}

// Consumer is one consumer of the events topic (a consumer group, or a
// projector whose offsets are in Postgres) and where it is on an event's
// partition.
type Consumer struct {
	Group     string `json:"group"`
	OffsetsIn string `json:"offsets_in"` // kafka.OffsetsInKafka or kafka.OffsetsInPostgres
	// Committed is its next offset on the event's partition, -1 if it has
	// none there.
	Committed int64 `json:"committed_offset"`
	// Seen: it has read past the event (Committed is above its offset).
	Seen bool `json:"seen"`
}

// Delivery is one webhook delivery of an event (webhook_deliveries).
type Delivery struct {
	Tenant         string     `json:"tenant"`
	SubscriptionID string     `json:"subscription_id"`
	Status         string     `json:"status"`
	Attempts       int        `json:"attempts"`
	LastStatus     *int       `json:"last_status,omitempty"`
	LastError      string     `json:"last_error,omitempty"`
	JobID          *int64     `json:"job_id,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	DeliveredAt    *time.Time `json:"delivered_at,omitempty"`
}

// Job is one River job of an event.
type Job struct {
	ID          int64      `json:"id"`
	Kind        string     `json:"kind"`
	Key         string     `json:"key"` // the Idempotency-Key of its calls
	State       string     `json:"state"`
	Attempt     int        `json:"attempt"`
	MaxAttempts int        `json:"max_attempts"`
	LastError   string     `json:"last_error,omitempty"`
	CreatedAt   time.Time  `json:"created_at"`
	FinalizedAt *time.Time `json:"finalized_at,omitempty"`
}

// Inbox is a consumer that applied an event.
type Inbox struct {
	Consumer   string    `json:"consumer"`
	ReceivedAt time.Time `json:"received_at"`
}

// Correction is a reconciliation of the command.
type Correction struct {
	Kind        string    `json:"kind"`
	Subject     string    `json:"subject"`
	Action      string    `json:"action"`
	CommandID   string    `json:"command_id"`
	Reason      string    `json:"reason"`
	CorrectedAt time.Time `json:"corrected_at"`
}

// ErrNotFound is Find's error when nothing matches the query.
var ErrNotFound = errors.New("no command, key, provider event or event matches")

// AmbiguousError is Find's error for an Idempotency-Key that several
// tenants used: the caller names the tenant.
type AmbiguousError struct{ Tenants []string }

func (e *AmbiguousError) Error() string {
	return fmt.Sprintf("the key is used by tenants %s: name one", strings.Join(e.Tenants, ", "))
}

const (
	byKeySQL = `SELECT tenant, key, route, command_id::text, response_status, replays, conflicts, created_at, coalesce(last_seen_at, created_at)
		FROM idempotency_keys WHERE key = $1 AND ($2 = '' OR tenant = $2) ORDER BY created_at DESC`
	keyOfSQL = `SELECT tenant, key, route, command_id::text, response_status, replays, conflicts, created_at, coalesce(last_seen_at, created_at)
		FROM idempotency_keys WHERE command_id = $1 AND tenant = $2 ORDER BY created_at DESC LIMIT 1`
	inboundSQL = `SELECT provider, event_id, event_type, status, deliveries, received_at, last_delivery_at, coalesce(command_id::text, '')
		FROM inbound_events WHERE (provider = $1 AND event_id = $2) OR command_id = $3::uuid LIMIT 1`
	commandSQL = `SELECT command_id::text, tenant, aggregate_id, command_type, status, coalesce(reason, ''), coalesce(detail, ''),
			ingested, event_ids::text[], created_at, updated_at
		FROM command_status WHERE command_id = $1 AND ($2 = '' OR tenant = $2)
		ORDER BY ingested DESC, created_at LIMIT 1`
	eventSQL  = `SELECT command_id::text, tenant FROM audit_log WHERE event_id = $1`
	outboxSQL = `SELECT id, shard, topic, created_at FROM outbox WHERE headers->>'command-id' = $1 AND key = $2 LIMIT 1`
	deadSQL   = `SELECT id, reason, detail, dead_at FROM outbox_dead WHERE headers->>'command-id' = $1 AND key = $2 LIMIT 1`
	eventsSQL = `SELECT event_id::text, event_type, version, occurred_at FROM audit_log
		WHERE command_id = $1 AND aggregate_id = $2 AND event_type <> 'onceflow.Reconciled' ORDER BY version`
	deliveriesSQL = `SELECT event_id::text, tenant, subscription_id::text, status, attempts, last_status, coalesce(last_error, ''),
			job_id, created_at, delivered_at
		FROM webhook_deliveries WHERE event_id = ANY($1::uuid[]) ORDER BY created_at, subscription_id`
	// jobsSQL: jobs name their event in args (event_id), a webhook fan-out
	// the range of its tenant's webhook_events it makes the deliveries of
	// (from, to: the event's seq); River's args are not indexed, and River
	// keeps finished jobs a day or a week.
	jobsSQL = `SELECT event_id, id, kind, coalesce(args->>'key', ''), state::text, attempt, max_attempts,
			coalesce(errors[array_length(errors, 1)]->>'error', ''), created_at, finalized_at
		FROM (SELECT args->>'event_id' AS event_id, * FROM river_job WHERE args->>'event_id' = ANY($1)
		      UNION ALL
		      SELECT e.event_id::text, j.* FROM webhook_events e JOIN river_job j
		      ON j.kind = 'webhook_fanout' AND j.args->>'tenant' = e.tenant
		         AND e.seq BETWEEN (j.args->>'from')::bigint AND (j.args->>'to')::bigint
		      WHERE e.event_id = ANY($1::uuid[])) AS j
		ORDER BY id`
	inboxSQL       = `SELECT event_id::text, consumer, received_at FROM inbox WHERE event_id = ANY($1::uuid[]) ORDER BY received_at`
	correctionsSQL = `SELECT kind, subject, action, command_id::text, reason, corrected_at FROM reconcile_corrections
		WHERE aggregate_id = $2 AND (command_id = $1 OR subject = $1::text OR subject = $3) ORDER BY corrected_at`
)

// Find reads what the database holds of the command q names: an
// Idempotency-Key (of tenant, when several tenants used it), a provider
// event (provider/event-id), a command id or an event id.
func Find(ctx context.Context, pool *pgxpool.Pool, q, tenant string) (*Trace, error) {
	t := &Trace{Query: q, Events: []Event{}, Derived: []Derived{}}
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx)
	commandID, err := resolve(ctx, tx, t, q, tenant)
	if err != nil {
		return nil, err
	}
	c := &Command{}
	err = tx.QueryRow(ctx, commandSQL, commandID, tenant).Scan(&c.CommandID, &c.Tenant, &c.AggregateID, &c.CommandType, &c.Status,
		&c.Reason, &c.Detail, &c.Ingested, &c.EventIDs, &c.CreatedAt, &c.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("command %s: %w", commandID, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read the command: %w", err)
	}
	t.Command = c
	if t.Key == nil {
		k := &KeyRecord{}
		var id string
		err := tx.QueryRow(ctx, keyOfSQL, c.CommandID, c.Tenant).Scan(&k.Tenant, &k.Key, &k.Route, &id, &k.ResponseStatus, &k.Replays, &k.Conflicts, &k.CreatedAt, &k.LastSeenAt)
		if err == nil {
			t.Key = k
		} else if !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("read the key: %w", err)
		}
	}
	if t.Inbound == nil {
		if err := readInbound(ctx, tx, t, "", "", c.CommandID); err != nil {
			return nil, err
		}
	}
	if t.Key == nil && t.Inbound == nil {
		if c.Ingested {
			t.Notes = append(t.Notes, "its Idempotency-Key is no longer kept (the idempotency retention)")
		} else {
			t.Notes = append(t.Notes, "it was produced straight to Kafka: no key record")
		}
	}
	o := &OutboxRow{}
	switch err := tx.QueryRow(ctx, outboxSQL, c.CommandID, []byte(c.AggregateID)).Scan(&o.ID, &o.Shard, &o.Topic, &o.CreatedAt); {
	case err == nil:
		t.Outbox = o
	case !errors.Is(err, pgx.ErrNoRows):
		return nil, fmt.Errorf("read the outbox: %w", err)
	}
	d := &DeadRow{}
	switch err := tx.QueryRow(ctx, deadSQL, c.CommandID, []byte(c.AggregateID)).Scan(&d.ID, &d.Reason, &d.Detail, &d.DeadAt); {
	case err == nil:
		t.Dead = d
	case !errors.Is(err, pgx.ErrNoRows):
		return nil, fmt.Errorf("read outbox_dead: %w", err)
	}
	if t.Events, err = readEvents(ctx, tx, c.CommandID, c.AggregateID); err != nil {
		return nil, err
	}
	ids := make([]string, len(t.Events))
	for i, e := range t.Events {
		ids[i] = e.EventID
	}
	if err := readEffects(ctx, tx, t, ids); err != nil {
		return nil, err
	}
	if err := readDerived(ctx, tx, t); err != nil {
		return nil, err
	}
	subject := ""
	if t.Inbound != nil {
		subject = t.Inbound.Provider + "/" + t.Inbound.EventID
	}
	rows, err := tx.Query(ctx, correctionsSQL, c.CommandID, c.AggregateID, subject)
	if err != nil {
		return nil, fmt.Errorf("read the corrections: %w", err)
	}
	for rows.Next() {
		var k Correction
		if err := rows.Scan(&k.Kind, &k.Subject, &k.Action, &k.CommandID, &k.Reason, &k.CorrectedAt); err != nil {
			return nil, err
		}
		t.Corrections = append(t.Corrections, k)
	}
	return t, rows.Err()
}

// resolve finds the command id q names.
func resolve(ctx context.Context, tx pgx.Tx, t *Trace, q, tenant string) (string, error) {
	if id, err := pipeline.ParseID(q); err == nil {
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM command_status WHERE command_id = $1`, id.String()).Scan(&n); err != nil {
			return "", err
		}
		if n > 0 {
			t.QueryKind = "command-id"
			return id.String(), nil
		}
		var cmd, tn string
		switch err := tx.QueryRow(ctx, eventSQL, id.String()).Scan(&cmd, &tn); {
		case err == nil:
			t.QueryKind = "event-id"
			return cmd, nil
		case !errors.Is(err, pgx.ErrNoRows):
			return "", err
		}
	}
	if provider, event, ok := strings.Cut(q, "/"); ok {
		if err := readInbound(ctx, tx, t, provider, event, pipeline.Nil.String()); err != nil {
			return "", err
		}
		if t.Inbound != nil {
			t.QueryKind = "provider-event"
			id := ""
			tx.QueryRow(ctx, `SELECT coalesce(command_id::text, '') FROM inbound_events WHERE provider = $1 AND event_id = $2`, provider, event).Scan(&id)
			if id == "" {
				return "", fmt.Errorf("provider event %s is %s: it made no command", q, t.Inbound.Status)
			}
			return id, nil
		}
	}
	rows, err := tx.Query(ctx, byKeySQL, q, tenant)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var keys []KeyRecord
	var ids []string
	for rows.Next() {
		var k KeyRecord
		var id string
		if err := rows.Scan(&k.Tenant, &k.Key, &k.Route, &id, &k.ResponseStatus, &k.Replays, &k.Conflicts, &k.CreatedAt, &k.LastSeenAt); err != nil {
			return "", err
		}
		keys, ids = append(keys, k), append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	if len(keys) == 0 {
		return "", ErrNotFound
	}
	tenants := map[string]bool{}
	for _, k := range keys {
		tenants[k.Tenant] = true
	}
	if len(tenants) > 1 {
		var ts []string
		for k := range tenants {
			ts = append(ts, k)
		}
		sort.Strings(ts)
		return "", &AmbiguousError{Tenants: ts}
	}
	t.QueryKind, t.Key = "idempotency-key", &keys[0]
	return ids[0], nil
}

// readEffects reads the webhook deliveries and jobs of the events ids.
func readEffects(ctx context.Context, tx pgx.Tx, t *Trace, ids []string) error {
	at := map[string]int{}
	for i, e := range t.Events {
		at[e.EventID] = i
	}
	rows, err := tx.Query(ctx, deliveriesSQL, ids)
	if err != nil {
		return fmt.Errorf("read the webhook deliveries: %w", err)
	}
	for rows.Next() {
		var id string
		var d Delivery
		if err := rows.Scan(&id, &d.Tenant, &d.SubscriptionID, &d.Status, &d.Attempts, &d.LastStatus, &d.LastError, &d.JobID, &d.CreatedAt, &d.DeliveredAt); err != nil {
			return err
		}
		if i, ok := at[id]; ok {
			t.Events[i].Deliveries = append(t.Events[i].Deliveries, d)
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	rows, err = tx.Query(ctx, jobsSQL, ids)
	if err != nil {
		return fmt.Errorf("read the jobs: %w", err)
	}
	for rows.Next() {
		var id string
		var j Job
		if err := rows.Scan(&id, &j.ID, &j.Kind, &j.Key, &j.State, &j.Attempt, &j.MaxAttempts, &j.LastError, &j.CreatedAt, &j.FinalizedAt); err != nil {
			return err
		}
		if i, ok := at[id]; ok {
			t.Events[i].Jobs = append(t.Events[i].Jobs, j)
		}
	}
	return rows.Err()
}

func readInbound(ctx context.Context, tx pgx.Tx, t *Trace, provider, event, commandID string) error {
	e := &InboundEvent{}
	var id string
	switch err := tx.QueryRow(ctx, inboundSQL, provider, event, commandID).Scan(&e.Provider, &e.EventID, &e.EventType, &e.Status,
		&e.Deliveries, &e.ReceivedAt, &e.LastDeliveryAt, &id); {
	case err == nil:
		t.Inbound = e
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("read the inbound event: %w", err)
	}
	return nil
}

// MaxScan bounds the records Locate reads per partition.
const MaxScan = 200_000

// Locate finds records of topic by a header's value (command-id, event-id)
// among wanted, reading every partition from the first record at or after
// since (a second earlier, for clocks) to its end, committed records only.
// It returns the positions found; a value not in the result was not found
// within MaxScan records of a partition.
func Locate(ctx context.Context, cl *kgo.Client, topic string, since time.Time, header string, wanted []string) (map[string]Position, error) {
	want := map[string]bool{}
	for _, w := range wanted {
		want[w] = true
	}
	found := map[string]Position{}
	if len(want) == 0 {
		return found, nil
	}
	offsets, err := kadm.NewClient(cl).ListOffsetsAfterMilli(ctx, since.Add(-time.Second).UnixMilli(), topic)
	if err != nil {
		return nil, fmt.Errorf("offsets of %s at %s: %w", topic, since, err)
	}
	if err := offsets.Error(); err != nil {
		return nil, fmt.Errorf("offsets of %s at %s: %w", topic, since, err)
	}
	errDone := errors.New("done")
	var errs []error
	offsets.Each(func(o kadm.ListedOffset) {
		if len(found) == len(want) {
			return
		}
		n := 0
		_, err := kafka.ReadPartitionFrom(ctx, cl, topic, o.Partition, o.Offset, true, func(r *kgo.Record) error {
			for _, h := range r.Headers {
				if h.Key == header && want[string(h.Value)] {
					found[string(h.Value)] = Position{Topic: topic, Partition: r.Partition, Offset: r.Offset, Time: r.Timestamp}
				}
			}
			if n++; n >= MaxScan || len(found) == len(want) {
				return errDone
			}
			return nil
		})
		if err != nil && !errors.Is(err, errDone) {
			errs = append(errs, err)
		}
	})
	return found, errors.Join(errs...)
}

// Consumers finds, for each event of t with a position on topic, which of
// sources — the consumers to ask, such as every consumer group of the
// cluster and the projectors whose offsets are in Postgres — have read
// past it, from their committed offsets (kafka.Committed). A committed
// offset is the next record the consumer reads, so a consumer has read
// past an event at offset o once its offset on o's partition is above o;
// that it has read the event is all it tells: what the consumer did with
// it is the consumer's own (a projector's inbox row says it applied it). A
// source with no offset on topic and not declared a reader of it does not
// read the topic and is left out; one that reads it but has no offset on
// the event's partition has not read the event.
func Consumers(ctx context.Context, cl *kgo.Client, topic string, sources []kafka.LagSource, t *Trace) error {
	committed, err := kafka.Committed(ctx, cl, sources)
	if err != nil {
		return fmt.Errorf("consumers of %s: %w", topic, err)
	}
	at := time.Now()
	t.ConsumersAt = &at
	for i := range t.Events {
		e := &t.Events[i]
		if e.Position == nil || e.Position.Topic != topic {
			continue
		}
		e.Consumers = []Consumer{}
		for j, src := range sources {
			offs, reads := committed[j][topic]
			if !reads && !slices.Contains(src.Topics, topic) {
				continue
			}
			c := Consumer{Group: src.Group, OffsetsIn: kafka.OffsetsInKafka, Committed: -1}
			if src.Offsets != nil {
				c.OffsetsIn = kafka.OffsetsInPostgres
			}
			if o, ok := offs[e.Position.Partition]; ok {
				c.Committed = o
			}
			c.Seen = c.Committed > e.Position.Offset
			e.Consumers = append(e.Consumers, c)
		}
		sort.SliceStable(e.Consumers, func(a, b int) bool { return e.Consumers[a].Group < e.Consumers[b].Group })
	}
	return nil
}

// Step is one line of a trace's timeline.
type Step struct {
	At    time.Time `json:"at"`
	Stage string    `json:"stage"`
	What  string    `json:"what"`
}

// Timeline is the trace as steps in the order of the path (key, provider
// event, command, outbox, shipped, events with their consumers, inbox rows, jobs and
// webhook deliveries, status, the commands it led to with their events
// and statuses and the outcome of the whole, corrections), each with its time. Not sorted by time: the stages of one
// command often share a millisecond, and records carry the command's time.
func (t *Trace) Timeline() []Step {
	var s []Step
	add := func(at time.Time, stage, format string, args ...any) {
		s = append(s, Step{At: at, Stage: stage, What: fmt.Sprintf(format, args...)})
	}
	if k := t.Key; k != nil {
		add(k.CreatedAt, "key", "Idempotency-Key %q of %s on %s answered %d; replays %d, conflicts %d, last seen %s",
			k.Key, k.Tenant, k.Route, k.ResponseStatus, k.Replays, k.Conflicts, k.LastSeenAt.UTC().Format(time.RFC3339Nano))
	}
	if e := t.Inbound; e != nil {
		add(e.ReceivedAt, "inbound", "provider event %s/%s (%s): %s, %d deliveries, the last at %s",
			e.Provider, e.EventID, e.EventType, e.Status, e.Deliveries, e.LastDeliveryAt.UTC().Format(time.RFC3339Nano))
	}
	c := t.Command
	add(c.CreatedAt, "command", "%s %s for %s, pending", c.CommandType, c.CommandID, c.AggregateID)
	if o := t.Outbox; o != nil {
		add(o.CreatedAt, "outbox", "row %d in shard %d, waiting for a relay to ship it to %s", o.ID, o.Shard, o.Topic)
	}
	if d := t.Dead; d != nil {
		add(d.DeadAt, "outbox", "row %d in outbox_dead: the broker refused it for good: %s", d.ID, d.Reason)
	}
	if p := t.Shipped; p != nil {
		add(p.Time, "shipped", "on %s partition %d offset %d", p.Topic, p.Partition, p.Offset)
	}
	for _, e := range t.Events {
		add(e.OccurredAt, "event", "%s %s version %d, %s", e.EventType, e.EventID, e.Version, where(e.Position))
		if e.Consumers != nil && t.ConsumersAt != nil {
			add(*t.ConsumersAt, "consumers", "%s", consumersLine(e.Consumers))
		}
		for _, in := range e.Inbox {
			add(in.ReceivedAt, "inbox", "%s applied %s", in.Consumer, e.EventID)
		}
		for _, j := range e.Jobs {
			what := fmt.Sprintf("%s job %d (key %s): %s, attempt %d of %d", j.Kind, j.ID, j.Key, j.State, j.Attempt, j.MaxAttempts)
			if j.LastError != "" {
				what += "; last error: " + j.LastError
			}
			add(j.CreatedAt, "job", "%s", what)
		}
		for _, d := range e.Deliveries {
			what := fmt.Sprintf("to subscription %s of %s: %s after %d attempts", d.SubscriptionID, d.Tenant, d.Status, d.Attempts)
			if d.LastStatus != nil {
				what += fmt.Sprintf(", last answer %d", *d.LastStatus)
			}
			if d.LastError != "" {
				what += ", last error: " + d.LastError
			}
			at := d.CreatedAt
			if d.DeliveredAt != nil {
				at = *d.DeliveredAt
			}
			add(at, "webhook", "%s", what)
		}
	}
	add(c.UpdatedAt, "status", "%s", statusText(c.Status, c.Reason))
	t.derivedSteps(add)
	for _, k := range t.Corrections {
		add(k.CorrectedAt, "reconcile", "%s %s: %s as %s (%s)", k.Kind, k.Subject, k.Action, k.CommandID, k.Reason)
	}
	return s
}

// consumersLine says which consumers have read past an event and which
// have not, with where those are on its partition.
func consumersLine(cs []Consumer) string {
	var seen, not []string
	for _, c := range cs {
		if c.Seen {
			seen = append(seen, c.Group)
			continue
		}
		where := "no offset on its partition"
		if c.Committed >= 0 {
			where = fmt.Sprintf("at offset %d", c.Committed)
		}
		not = append(not, fmt.Sprintf("%s (%s)", c.Group, where))
	}
	none := func(s []string) string {
		if len(s) == 0 {
			return "none"
		}
		return strings.Join(s, ", ")
	}
	return "read past it: " + none(seen) + "; not yet: " + none(not)
}
