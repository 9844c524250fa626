package webhooks

import (
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

// FanoutArgs are a fan-out job's arguments: the event whose deliveries
// the worker makes (its body and type are in webhook_events).
type FanoutArgs struct {
	Key     string      `json:"key" river:"unique"`
	Tenant  string      `json:"tenant"`
	EventID pipeline.ID `json:"event_id"`
}

// Kind implements river.JobArgs.
func (FanoutArgs) Kind() string { return FanoutKind }

// JobKey implements jobs.Args.
func (a FanoutArgs) JobKey() string { return a.Key }

// fanoutPurpose names an event's fan-out job among the jobs it makes
// (jobs.Key): a delivery's purpose is a subscription id, never this.
const fanoutPurpose = "webhooks"

// Router is the webhooks projection's jobs.Router. In the projector's
// transaction it writes, for each event some enabled subscription of its
// tenant wants, one webhook_events row (its body, once) and one fan-out
// job, whatever the number of subscriptions: what the projector writes for
// an event is bounded, so one tenant's hundred subscriptions cost every
// tenant's read models no more than one. The worker's fan-out (Fanout)
// writes the delivery rows and their jobs.
type Router struct{}

var _ jobs.Router = Router{}

const subscribedSQL = `SELECT tenant, event_types FROM webhook_subscriptions
	WHERE tenant = ANY($1) AND status = 'enabled'`

const insertEventsSQL = `INSERT INTO webhook_events (tenant, event_id, event_type, body)
	SELECT * FROM unnest($1::text[], $2::uuid[], $3::text[], $4::bytea[])
	ON CONFLICT DO NOTHING
	RETURNING tenant, event_id`

// Jobs implements jobs.Router.
func (Router) Jobs(ctx context.Context, tx pgx.Tx, evs []pipeline.Event) ([][]jobs.Args, error) {
	var tenants []string
	for _, ev := range evs {
		if !slices.Contains(tenants, ev.Tenant) {
			tenants = append(tenants, ev.Tenant)
		}
	}
	rows, err := tx.Query(ctx, subscribedSQL, tenants)
	if err != nil {
		return nil, fmt.Errorf("read webhook subscriptions: %w", err)
	}
	subs := map[string][][]string{} // tenant -> each subscription's event types
	for rows.Next() {
		var tenant string
		var types []string
		if err := rows.Scan(&tenant, &types); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read webhook subscriptions: %w", err)
		}
		subs[tenant] = append(subs[tenant], types)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read webhook subscriptions: %w", err)
	}
	out := make([][]jobs.Args, len(evs))
	var eTenants, eTypes []string
	var eIDs [][16]byte
	var eBodies [][]byte
	at := map[[2]string]int{} // (tenant, event id) -> the event's first index in evs
	for i, ev := range evs {
		wanted := slices.ContainsFunc(subs[ev.Tenant], func(types []string) bool {
			return len(types) == 0 || slices.Contains(types, ev.Type())
		})
		k := [2]string{ev.Tenant, ev.ID.String()}
		if _, dup := at[k]; !wanted || dup {
			continue
		}
		body, err := EventBody(ev)
		if err != nil {
			return nil, err
		}
		at[k] = i
		eTenants, eIDs, eTypes, eBodies = append(eTenants, ev.Tenant), append(eIDs, [16]byte(ev.ID)), append(eTypes, ev.Type()), append(eBodies, body)
	}
	if len(eTenants) == 0 {
		return out, nil
	}
	// Only an event this transaction stored gets a fan-out: the row is the
	// lasting memory (River forgets a finished job after its retention),
	// so an event applied again, however much later, sends nothing again.
	rows, err = tx.Query(ctx, insertEventsSQL, eTenants, eIDs, eTypes, eBodies)
	if err != nil {
		return nil, fmt.Errorf("record webhook events: %w", err)
	}
	for rows.Next() {
		var tenant string
		var id [16]byte
		if err := rows.Scan(&tenant, &id); err != nil {
			rows.Close()
			return nil, fmt.Errorf("record webhook events: %w", err)
		}
		ev := pipeline.ID(id)
		i := at[[2]string{tenant, ev.String()}]
		out[i] = append(out[i], FanoutArgs{Key: jobs.Key(ev, fanoutPurpose), Tenant: tenant, EventID: ev})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("record webhook events: %w", err)
	}
	return out, nil
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
