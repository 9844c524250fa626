package inventoryapp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/inventory"
	"github.com/onceflow/onceflow/pipeline"
)

// Carrier is the carrier the inventory books a confirmed order's
// shipment with: an HTTP service that takes POST {URL}/bookings with an
// Idempotency-Key and applies each key once. The worker reaches it through
// the webhooks' address guard: a carrier on a private network or this
// machine needs ONCEFLOW_WEBHOOK_ALLOW_NETWORKS.
type Carrier struct {
	// URL is the carrier's base URL (INVENTORY_CARRIER_URL for
	// cmd/inventory). Empty: no bookings (the domain declares no job).
	URL string
	// MaxAttempts bounds a booking's attempts, and BaseDelay and MaxDelay
	// its backoff (onceflow.Job). Defaults the worker's.
	MaxAttempts         int
	BaseDelay, MaxDelay time.Duration
}

// CarrierBooking is the job that books one confirmed order's shipment:
// an order is confirmed when its item reserved the stock, which is when it
// can ship.
type CarrierBooking struct {
	// Key is the booking's key, from the OrderConfirmed event: the
	// Idempotency-Key of every attempt's call.
	Key      string `json:"key" river:"unique"`
	EventID  string `json:"event_id"` // onceflow trace finds the job by it
	Tenant   string `json:"tenant"`
	OrderID  string `json:"order_id"`
	ItemID   string `json:"item_id"`
	Quantity int64  `json:"quantity"`
}

// Kind implements onceflow.JobArgs.
func (CarrierBooking) Kind() string { return "carrier_booking" }

// JobKey implements onceflow.JobArgs.
func (b CarrierBooking) JobKey() string { return b.Key }

// CarrierJob is the carrier booking's job kind: each OrderConfirmed
// event enqueues one booking, which the worker sends to c.
func CarrierJob(c Carrier) onceflow.Job[CarrierBooking] {
	base := strings.TrimRight(c.URL, "/")
	return onceflow.Job[CarrierBooking]{
		MaxAttempts: c.MaxAttempts, BaseDelay: c.BaseDelay, MaxDelay: c.MaxDelay,
		Enqueue: func(_ context.Context, _ pgx.Tx, ev pipeline.Event) ([]CarrierBooking, error) {
			confirmed, ok := ev.Payload.(inventory.OrderConfirmed)
			if !ok {
				return nil, nil
			}
			_, order, err := pipeline.SplitAggregateID(ev.AggregateID)
			if err != nil {
				return nil, err
			}
			return []CarrierBooking{{Key: onceflow.JobKey(ev.ID, "carrier_booking"), EventID: ev.ID.String(), Tenant: ev.Tenant,
				OrderID: order, ItemID: confirmed.ItemID, Quantity: confirmed.Quantity}}, nil
		},
		Work: func(ctx context.Context, a *onceflow.JobAttempt[CarrierBooking]) error {
			// The carrier books for a tenant: the job's, its event's.
			body, err := json.Marshal(map[string]any{"tenant": a.Tenant, "order_id": a.Args.OrderID, "item_id": a.Args.ItemID, "quantity": a.Args.Quantity})
			if err != nil {
				return pipeline.Permanent(err)
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/bookings", bytes.NewReader(body))
			if err != nil {
				return pipeline.Permanent(err)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := a.Call(ctx, req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			var booked struct {
				BookingID string `json:"booking_id"`
			}
			if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&booked); err != nil {
				return fmt.Errorf("the carrier's answer: %w", err) // booked or not, the same key finds out
			}
			a.Note(ctx, "booked "+booked.BookingID)
			return nil
		},
	}
}
