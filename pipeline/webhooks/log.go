package webhooks

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/jobs"
)

// Delivery is one row of the delivery log: an event for a subscription.
type Delivery struct {
	Tenant         string      `json:"-"`
	SubscriptionID pipeline.ID `json:"subscription_id"`
	EventID        pipeline.ID `json:"event_id"`
	EventType      string      `json:"event_type"`
	// Status is pending, delivered, failed (retrying) or dead.
	Status     string     `json:"status"`
	Attempts   int        `json:"attempts"`
	LastStatus *int       `json:"last_status,omitempty"`
	LastError  *string    `json:"last_error,omitempty"`
	JobID      *int64     `json:"job_id,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	Delivered  *time.Time `json:"delivered_at,omitempty"`
}

// Key is the delivery's job key, also its Idempotency-Key.
func (d Delivery) Key() string { return jobs.Key(d.EventID, d.SubscriptionID.String()) }

// Filter selects rows of the delivery log.
type Filter struct {
	// Tenant is required.
	Tenant string
	// Subscription and Status, if set, narrow the rows.
	Subscription *pipeline.ID
	Status       string
	// Limit bounds the rows, newest first. Default 50.
	Limit int
}

const deliveriesSQL = `SELECT tenant, subscription_id, event_id, event_type, status, attempts, last_status, last_error, job_id, created_at, delivered_at
	FROM webhook_deliveries
	WHERE tenant = $1 AND ($2::uuid IS NULL OR subscription_id = $2) AND ($3 = '' OR status = $3)
	ORDER BY created_at DESC, event_id
	LIMIT $4`

// Deliveries reads the delivery log.
func Deliveries(ctx context.Context, db DB, f Filter) ([]Delivery, error) {
	if f.Limit <= 0 {
		f.Limit = 50
	}
	var sub any
	if f.Subscription != nil {
		sub = [16]byte(*f.Subscription)
	}
	rows, err := db.Query(ctx, deliveriesSQL, f.Tenant, sub, f.Status, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("read deliveries: %w", err)
	}
	defer rows.Close()
	out := []Delivery{}
	for rows.Next() {
		var d Delivery
		var subID, evID [16]byte
		if err := rows.Scan(&d.Tenant, &subID, &evID, &d.EventType, &d.Status, &d.Attempts, &d.LastStatus, &d.LastError, &d.JobID, &d.CreatedAt, &d.Delivered); err != nil {
			return nil, fmt.Errorf("read deliveries: %w", err)
		}
		d.SubscriptionID, d.EventID = subID, evID
		out = append(out, d)
	}
	return out, rows.Err()
}

const resetDeliverySQL = `UPDATE webhook_deliveries SET status = 'pending', updated_at = now()
	WHERE tenant = $1 AND subscription_id = $2 AND event_id = $3
	RETURNING (SELECT id FROM river_job WHERE kind = '` + Kind + `' AND args->>'key' = $4 ORDER BY id DESC LIMIT 1)`

const lockJobSQL = `SELECT state::text FROM river_job WHERE id = $1 FOR UPDATE`

// ErrRunning is Redeliver's error for a delivery whose job is running (or
// River has not yet written its last attempt's outcome): try again.
var ErrRunning = errors.New("webhooks: the delivery's job is running; redeliver it once it has finished")

// ErrNoJob is Redeliver's error for a delivery whose job River no longer
// has (cleaned up after its retention: completed 24 h, dead 7 days).
var ErrNoJob = errors.New("webhooks: the delivery's job is gone; River keeps finished jobs for a while only")

// Redeliver sends a delivery again, whatever its status: it goes back to
// pending and its job to available at once (River's JobRetry), so the
// receiver gets it with the same webhook-id and Idempotency-Key (and
// applies it once if it already had it). The subscription must be
// enabled for it to go out.
func Redeliver(ctx context.Context, pool *pgxpool.Pool, tenant string, subscription, event pipeline.ID) error {
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		return err
	}
	key := jobs.Key(event, subscription.String())
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var jobID *int64
		err := tx.QueryRow(ctx, resetDeliverySQL, tenant, [16]byte(subscription), [16]byte(event), key).Scan(&jobID)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return ErrNotFound
		case err != nil:
			return fmt.Errorf("reset delivery: %w", err)
		case jobID == nil:
			return ErrNoJob
		}
		var state string
		if err := tx.QueryRow(ctx, lockJobSQL, *jobID).Scan(&state); err != nil {
			return fmt.Errorf("lock job %d: %w", *jobID, err)
		}
		if state == "running" {
			return ErrRunning
		}
		if _, err := client.JobRetryTx(ctx, tx, *jobID); err != nil {
			return fmt.Errorf("retry job %d: %w", *jobID, err)
		}
		return nil
	})
}
