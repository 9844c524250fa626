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

// Router is the webhooks projection's jobs.Router: each event of a
// tenant's enabled subscriptions' event types gets a delivery row and a
// delivery job per subscription, in the projector's transaction.
type Router struct{}

var _ jobs.Router = Router{}

const subscribedSQL = `SELECT tenant, id, event_types FROM webhook_subscriptions
	WHERE tenant = ANY($1) AND status = 'enabled'`

const insertDeliveriesSQL = `INSERT INTO webhook_deliveries (tenant, subscription_id, event_id, event_type)
	SELECT * FROM unnest($1::text[], $2::uuid[], $3::uuid[], $4::text[])
	ON CONFLICT DO NOTHING
	RETURNING subscription_id, event_id`

type subscribed struct {
	id    [16]byte
	types []string
}

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
	subs := map[string][]subscribed{}
	for rows.Next() {
		var tenant string
		var s subscribed
		if err := rows.Scan(&tenant, &s.id, &s.types); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read webhook subscriptions: %w", err)
		}
		subs[tenant] = append(subs[tenant], s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read webhook subscriptions: %w", err)
	}
	out := make([][]jobs.Args, len(evs))
	var dTenants, dTypes []string
	var dSubs, dEvents [][16]byte
	for i, ev := range evs {
		var body []byte
		for _, s := range subs[ev.Tenant] {
			if len(s.types) > 0 && !slices.Contains(s.types, ev.Type()) {
				continue
			}
			if body == nil {
				if body, err = EventBody(ev); err != nil {
					return nil, err
				}
			}
			sub := pipeline.ID(s.id)
			out[i] = append(out[i], DeliveryArgs{Key: jobs.Key(ev.ID, sub.String()), Tenant: ev.Tenant, SubscriptionID: sub,
				EventID: ev.ID, EventType: ev.Type(), Body: body})
			dTenants, dSubs, dEvents, dTypes = append(dTenants, ev.Tenant), append(dSubs, s.id), append(dEvents, [16]byte(ev.ID)), append(dTypes, ev.Type())
		}
	}
	if len(dTenants) == 0 {
		return out, nil
	}
	// Only the deliveries this transaction made get a job: the row is the
	// lasting memory (River forgets a finished job after its retention), so
	// an event applied again, however much later, sends nothing again.
	rows, err = tx.Query(ctx, insertDeliveriesSQL, dTenants, dSubs, dEvents, dTypes)
	if err != nil {
		return nil, fmt.Errorf("record webhook deliveries: %w", err)
	}
	made := map[[2][16]byte]bool{}
	for rows.Next() {
		var sub, ev [16]byte
		if err := rows.Scan(&sub, &ev); err != nil {
			rows.Close()
			return nil, fmt.Errorf("record webhook deliveries: %w", err)
		}
		made[[2][16]byte{sub, ev}] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("record webhook deliveries: %w", err)
	}
	for i, jobs := range out {
		kept := jobs[:0]
		for _, j := range jobs {
			a := j.(DeliveryArgs)
			if k := [2][16]byte{a.SubscriptionID, a.EventID}; made[k] {
				kept = append(kept, j)
				delete(made, k) // the same event twice in a batch: one job
			}
		}
		out[i] = kept
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
