package webhooks

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/jobs"
)

// Kind is the job kind of a delivery.
const Kind = "webhook_delivery"

// DeliveryArgs are a delivery job's arguments: which event goes to which
// subscription, and the body that is signed and sent.
type DeliveryArgs struct {
	Key            string          `json:"key" river:"unique"`
	Tenant         string          `json:"tenant"`
	SubscriptionID pipeline.ID     `json:"subscription_id"`
	EventID        pipeline.ID     `json:"event_id"`
	EventType      string          `json:"event_type"`
	Body           json.RawMessage `json:"body"`
}

// Kind implements river.JobArgs.
func (DeliveryArgs) Kind() string { return Kind }

// JobKey implements jobs.Args.
func (a DeliveryArgs) JobKey() string { return a.Key }

// Body is what a delivery POSTs (Standard Webhooks' payload shape): the
// event's type, its time, and its data.
type Body struct {
	Type      string    `json:"type"`
	Timestamp time.Time `json:"timestamp"`
	Data      Data      `json:"data"`
}

// Data is a delivered event: its identity and its fields as the events
// topic's schema names them.
type Data struct {
	EventID     pipeline.ID    `json:"event_id"`
	AggregateID string         `json:"aggregate_id"`
	Version     int64          `json:"version"`
	CommandID   pipeline.ID    `json:"command_id"`
	Event       map[string]any `json:"event"`
}

// FanoutKind is the job kind of an event's fan-out.
const FanoutKind = "webhook_fanout"

// FanoutArgs are a fan-out job's arguments: the tenant's events whose
// deliveries the worker makes, the webhook_events rows of the tenant with
// seq From to To (their bodies and types are there). The projector's
// transaction enqueues one for the events of each tenant it stored.
type FanoutArgs struct {
	Key    string `json:"key" river:"unique"`
	Tenant string `json:"tenant"`
	From   int64  `json:"from"`
	To     int64  `json:"to"`
}

// Kind implements river.JobArgs.
func (FanoutArgs) Kind() string { return FanoutKind }

// JobKey implements jobs.Args.
func (a FanoutArgs) JobKey() string { return a.Key }

// fanoutPurpose names a fan-out job among the jobs of the event its
// range begins with (jobs.Key): a delivery's purpose is a subscription
// id, never this.
const fanoutPurpose = "webhooks"

// Router is the webhooks projection's jobs.Router. In the projector's
// transaction it writes, for each event some enabled subscription of its
// tenant wants, one webhook_events row (its body, once), and for each
// tenant of the batch one fan-out job naming the range of rows it wrote,
// whatever the number of subscriptions: what the projector writes for an
// event is bounded, so one tenant's hundred subscriptions cost every
// tenant's read models no more than one. The worker's fan-out (fanout.go)
// writes the delivery rows and their jobs. A tenant with one subscription
// and less than BacklogThreshold deliveries in flight has its events'
// deliveries made here instead (one row and one job an event, the fan-out's
// own bound), without the fan-out's hop.
type Router struct {
	// MaxPending is the workers' Config.MaxPending: a tenant with that
	// many deliveries in flight has its events fanned out (and capped
	// there), never made inline. Default DefaultMaxPending.
	MaxPending int
	// MaxQueued bounds a capped tenant's events waiting to be fanned out
	// (webhook_fanout_waiting.queued): past it, an event is stored
	// refused, without its body, and its fan-out makes its deliveries
	// dead with the reason. Default DefaultMaxQueued.
	MaxQueued int
}

var _ jobs.Router = Router{}

const (
	subscribedSQL = `SELECT tenant, id, event_types FROM webhook_subscriptions
		WHERE tenant = ANY($1) AND status = 'enabled'`
	// inFlightSQL counts each tenant's deliveries in flight, up to $2:
	// at most $2 entries of the in-flight index a tenant.
	inFlightSQL = `SELECT t, (SELECT count(*) FROM (SELECT 1 FROM webhook_deliveries
			WHERE tenant = t AND status IN ('pending', 'failed') LIMIT $2) AS in_flight)
		FROM unnest($1::text[]) AS t`
	// insertEventsSQL stores the events; those made inline ($5) are
	// expanded as they are stored.
	insertEventsSQL = `INSERT INTO webhook_events (tenant, event_id, event_type, body, expanded_at, refused)
		SELECT t, id, typ, CASE WHEN refused THEN ''::bytea ELSE body END, CASE WHEN inline THEN now() END, refused
		FROM unnest($1::text[], $2::uuid[], $3::text[], $4::bytea[], $5::bool[], $6::bool[]) AS e (t, id, typ, body, inline, refused)
		ON CONFLICT DO NOTHING
		RETURNING tenant, event_id, seq, expanded_at IS NOT NULL`
	// queueSQL adds each capped tenant's events of the batch ($2) to its
	// count of queued events, and returns the count before them: only a
	// tenant with a fan-out waiting has a row.
	queueSQL = `UPDATE webhook_fanout_waiting w SET queued = w.queued + q.n
		FROM unnest($1::text[], $2::bigint[]) AS q (t, n) WHERE w.tenant = q.t
		RETURNING w.tenant, w.queued - q.n`
	insertDeliveriesSQL = `INSERT INTO webhook_deliveries (tenant, subscription_id, event_id, event_type)
		SELECT * FROM unnest($1::text[], $2::uuid[], $3::uuid[], $4::text[])
		ON CONFLICT DO NOTHING
		RETURNING tenant, event_id`
)

// sub is what the router reads of an enabled subscription.
type sub struct {
	id    pipeline.ID
	types []string
}

func (s sub) wants(typ string) bool { return len(s.types) == 0 || slices.Contains(s.types, typ) }

// Jobs implements jobs.Router.
func (r Router) Jobs(ctx context.Context, tx pgx.Tx, evs []pipeline.Event) ([][]jobs.Args, error) {
	var tenants []string
	for _, ev := range evs {
		if !slices.Contains(tenants, ev.Tenant) {
			tenants = append(tenants, ev.Tenant)
		}
	}
	subs, err := subscribed(ctx, tx, tenants)
	if err != nil {
		return nil, err
	}
	below := BacklogThreshold
	if r.MaxPending > 0 {
		below = min(below, r.MaxPending)
	}
	inline, err := inlined(ctx, tx, subs, below)
	if err != nil {
		return nil, err
	}
	out := make([][]jobs.Args, len(evs))
	var eTenants, eTypes []string
	var eIDs [][16]byte
	var eBodies [][]byte
	var eInline []bool
	at := map[[2]string]int{}  // (tenant, event id) -> the event's first index in evs
	row := map[[2]string]int{} // (tenant, event id) -> its index in the e arrays
	for i, ev := range evs {
		wanted := slices.ContainsFunc(subs[ev.Tenant], func(s sub) bool { return s.wants(ev.Type()) })
		k := [2]string{ev.Tenant, ev.ID.String()}
		if _, dup := at[k]; !wanted || dup {
			continue
		}
		body, err := EventBody(ev)
		if err != nil {
			return nil, err
		}
		at[k], row[k] = i, len(eTenants)
		eTenants, eIDs, eTypes, eBodies = append(eTenants, ev.Tenant), append(eIDs, [16]byte(ev.ID)), append(eTypes, ev.Type()), append(eBodies, body)
		eInline = append(eInline, inline[ev.Tenant])
	}
	if len(eTenants) == 0 {
		return out, nil
	}
	eRefused, err := r.refuse(ctx, tx, eTenants, eInline)
	if err != nil {
		return nil, err
	}
	// Only an event this transaction stored gets a fan-out or a delivery:
	// the row is the lasting memory (River forgets a finished job after
	// its retention), so an event applied again, however much later, sends
	// nothing again.
	rows, err := tx.Query(ctx, insertEventsSQL, eTenants, eIDs, eTypes, eBodies, eInline, eRefused)
	if err != nil {
		return nil, fmt.Errorf("record webhook events: %w", err)
	}
	// One fan-out per tenant: the range of seq its stored events got (a
	// concurrent batch of the tenant may hold seq within it; the fan-out
	// finds those too once committed, or its own fan-out does), on the
	// job list of the tenant's first stored event, keyed by that event.
	type span struct {
		first    int // index in evs
		from, to int64
	}
	spans := map[string]*span{}
	var dTenants, dTypes []string
	var dSubs, dIDs [][16]byte
	for rows.Next() {
		var tenant string
		var id [16]byte
		var seq int64
		var expanded bool
		if err := rows.Scan(&tenant, &id, &seq, &expanded); err != nil {
			rows.Close()
			return nil, fmt.Errorf("record webhook events: %w", err)
		}
		i := at[[2]string{tenant, pipeline.ID(id).String()}]
		if expanded { // inline: its tenant's one subscription
			dTenants, dSubs, dIDs, dTypes = append(dTenants, tenant), append(dSubs, [16]byte(subs[tenant][0].id)), append(dIDs, id), append(dTypes, evs[i].Type())
			continue
		}
		s, ok := spans[tenant]
		if !ok {
			spans[tenant] = &span{first: i, from: seq, to: seq}
			continue
		}
		s.first, s.from, s.to = min(s.first, i), min(s.from, seq), max(s.to, seq)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("record webhook events: %w", err)
	}
	for tenant, s := range spans {
		out[s.first] = append(out[s.first], FanoutArgs{Key: jobs.Key(evs[s.first].ID, fanoutPurpose), Tenant: tenant, From: s.from, To: s.to})
	}
	if len(dTenants) == 0 {
		return out, nil
	}
	rows, err = tx.Query(ctx, insertDeliveriesSQL, dTenants, dSubs, dIDs, dTypes)
	if err != nil {
		return nil, fmt.Errorf("record webhook deliveries: %w", err)
	}
	for rows.Next() {
		var tenant string
		var id [16]byte
		if err := rows.Scan(&tenant, &id); err != nil {
			rows.Close()
			return nil, fmt.Errorf("record webhook deliveries: %w", err)
		}
		k := [2]string{tenant, pipeline.ID(id).String()}
		i, s := at[k], subs[tenant][0].id
		out[i] = append(out[i], DeliveryArgs{Key: jobs.Key(evs[i].ID, s.String()), Tenant: tenant, SubscriptionID: s,
			EventID: evs[i].ID, EventType: evs[i].Type(), Body: eBodies[row[k]]})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("record webhook deliveries: %w", err)
	}
	return out, nil
}

// refuse says which of the batch's events (by tenant, and whether made
// inline) are past their capped tenant's bound of queued events: the
// last ones of the batch past it. A tenant with no fan-out waiting is not
// capped, and queues nothing.
func (r Router) refuse(ctx context.Context, tx pgx.Tx, tenants []string, inline []bool) ([]bool, error) {
	bound := int64(cmp.Or(r.MaxQueued, DefaultMaxQueued))
	counts := map[string]int64{}
	var order []string
	for i, t := range tenants {
		if inline[i] {
			continue
		}
		if counts[t] == 0 {
			order = append(order, t)
		}
		counts[t]++
	}
	refused := make([]bool, len(tenants))
	if len(order) == 0 {
		return refused, nil
	}
	slices.Sort(order) // rows locked in one order by every batch
	ns := make([]int64, len(order))
	for i, t := range order {
		ns[i] = counts[t]
	}
	rows, err := tx.Query(ctx, queueSQL, order, ns)
	if err != nil {
		return nil, fmt.Errorf("count queued webhook events: %w", err)
	}
	room := map[string]int64{}
	for rows.Next() {
		var t string
		var before int64
		if err := rows.Scan(&t, &before); err != nil {
			rows.Close()
			return nil, fmt.Errorf("count queued webhook events: %w", err)
		}
		room[t] = max(0, bound-before)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count queued webhook events: %w", err)
	}
	for i, t := range tenants {
		left, capped := room[t]
		if inline[i] || !capped {
			continue
		}
		if left == 0 {
			refused[i] = true
			continue
		}
		room[t] = left - 1
	}
	return refused, nil
}

// subscribed reads the enabled subscriptions of tenants.
func subscribed(ctx context.Context, tx pgx.Tx, tenants []string) (map[string][]sub, error) {
	rows, err := tx.Query(ctx, subscribedSQL, tenants)
	if err != nil {
		return nil, fmt.Errorf("read webhook subscriptions: %w", err)
	}
	subs := map[string][]sub{}
	for rows.Next() {
		var tenant string
		var s sub
		var id [16]byte
		if err := rows.Scan(&tenant, &id, &s.types); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read webhook subscriptions: %w", err)
		}
		s.id = pipeline.ID(id)
		subs[tenant] = append(subs[tenant], s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read webhook subscriptions: %w", err)
	}
	return subs, nil
}

// inlined says which tenants get their deliveries made in the projector's
// transaction: those with one subscription (an event makes one delivery
// at most, as it makes one fan-out) and fewer than below deliveries in
// flight, so the cap and the backlog queue, which the fan-out applies,
// are not passed by (a batch passes the cap by its events at most).
func inlined(ctx context.Context, tx pgx.Tx, subs map[string][]sub, below int) (map[string]bool, error) {
	var one []string
	for tenant, s := range subs {
		if len(s) == 1 {
			one = append(one, tenant)
		}
	}
	inline := map[string]bool{}
	if len(one) == 0 {
		return inline, nil
	}
	rows, err := tx.Query(ctx, inFlightSQL, one, below)
	if err != nil {
		return nil, fmt.Errorf("count webhook backlog: %w", err)
	}
	for rows.Next() {
		var tenant string
		var n int
		if err := rows.Scan(&tenant, &n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("count webhook backlog: %w", err)
		}
		inline[tenant] = n < below
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count webhook backlog: %w", err)
	}
	return inline, nil
}

// EventBody is the body a delivery of ev sends.
func EventBody(ev pipeline.Event) ([]byte, error) {
	var fields map[string]any
	if reflect.ValueOf(ev.Payload).Kind() == reflect.Struct {
		f, err := avro.Fields(ev.Payload)
		if err != nil {
			return nil, fmt.Errorf("webhook body of %s %s: %w", ev.Type(), ev.ID, err)
		}
		fields = f
	}
	b, err := json.Marshal(Body{Type: ev.Type(), Timestamp: ev.Time.UTC(), Data: Data{
		EventID: ev.ID, AggregateID: ev.AggregateID, Version: ev.Version, CommandID: ev.CommandID, Event: fields,
	}})
	if err != nil {
		return nil, fmt.Errorf("webhook body of %s %s: %w", ev.Type(), ev.ID, err)
	}
	return b, nil
}
