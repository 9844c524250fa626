package webhooks

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/jobs"
)

// fanout is the River worker of webhook_fanout jobs: it makes an event's
// deliveries (doc.go).
type fanout struct {
	river.WorkerDefaults[FanoutArgs]
	d *Deliverer
}

const (
	// lockEventSQL reads the event's body and whether its fan-out ran,
	// and holds the row against a concurrent run of it (a late attempt).
	lockEventSQL = `SELECT event_type, body, expanded_at IS NOT NULL FROM webhook_events
		WHERE tenant = $1 AND event_id = $2 FOR UPDATE`
	// fanOutSQL makes a delivery row for each enabled subscription of the
	// tenant that wants the event's type, and returns the ones it made:
	// only those get a job.
	fanOutSQL = `INSERT INTO webhook_deliveries (tenant, subscription_id, event_id, event_type)
		SELECT tenant, id, $2, $3 FROM webhook_subscriptions
		WHERE tenant = $1 AND status = 'enabled' AND (cardinality(event_types) = 0 OR $3 = ANY (event_types))
		ON CONFLICT DO NOTHING
		RETURNING subscription_id`
	expandedSQL = `UPDATE webhook_events SET expanded_at = now() WHERE tenant = $1 AND event_id = $2`
	// backlogSQL counts a tenant's deliveries in flight, up to $2.
	backlogSQL = `SELECT count(*) FROM (SELECT 1 FROM webhook_deliveries
		WHERE tenant = $1 AND status IN ('pending', 'failed') LIMIT $2) AS in_flight`
)

// Work implements river.Worker: an event's fan-out, fenced by its attempt
// (jobs.Complete), so the rows and jobs it makes commit with its
// completion or not at all.
func (f *fanout) Work(ctx context.Context, job *river.Job[FanoutArgs]) error {
	d, a := f.d, job.Args
	backlog, err := d.backlog(ctx, a.Tenant)
	if err != nil {
		return err
	}
	if backlog >= d.cfg.MaxPending {
		d.capped(a.Tenant, backlog)
		// The event waits, fanned out once the tenant's backlog is below
		// the cap again; a snooze spends no attempt.
		return river.JobSnooze(cappedWait + time.Duration(rand.IntN(int(cappedWait/time.Millisecond)))*time.Millisecond) // #nosec G404 -- spreading retries
	}
	made := 0
	err = jobs.Complete(ctx, d.pool, job, func(tx pgx.Tx) error {
		var typ string
		var body []byte
		var expanded bool
		err := tx.QueryRow(ctx, lockEventSQL, a.Tenant, [16]byte(a.EventID)).Scan(&typ, &body, &expanded)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return nil // deleted after its retention: nothing left to do
		case err != nil:
			return fmt.Errorf("read webhook event: %w", err)
		case expanded:
			return nil
		}
		rows, err := tx.Query(ctx, fanOutSQL, a.Tenant, [16]byte(a.EventID), typ)
		if err != nil {
			return fmt.Errorf("record webhook deliveries: %w", err)
		}
		var args []jobs.Args
		for rows.Next() {
			var sub [16]byte
			if err := rows.Scan(&sub); err != nil {
				rows.Close()
				return fmt.Errorf("record webhook deliveries: %w", err)
			}
			id := pipeline.ID(sub)
			args = append(args, DeliveryArgs{Key: jobs.Key(a.EventID, id.String()), Tenant: a.Tenant, SubscriptionID: id,
				EventID: a.EventID, EventType: typ, Body: body})
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("record webhook deliveries: %w", err)
		}
		if len(args) > 0 {
			if _, err := d.w.InsertTx(ctx, tx, args, backlog >= BacklogThreshold, Priority(backlog)); err != nil {
				return err
			}
		}
		made = len(args)
		jobs.Note(ctx, fmt.Sprintf("%d deliveries", made))
		_, err = tx.Exec(ctx, expandedSQL, a.Tenant, [16]byte(a.EventID))
		return err
	})
	if err != nil {
		return err
	}
	d.grew(a.Tenant, made)
	d.metrics.fanouts.WithLabelValues("expanded").Inc()
	return nil
}

// cappedWait is about how long a capped tenant's fan-out waits before it
// looks again (and as much again at random).
const cappedWait = 5 * time.Second

// backlogTTL is how long a worker trusts its count of a tenant's
// deliveries in flight: counting a large backlog reads its index.
const backlogTTL = 2 * time.Second

// BacklogThreshold is the backlog of deliveries in flight from which a
// tenant's new deliveries go to the worker's backlog queue
// (jobs.Config.BacklogWorkers): a tenant whose endpoint is slow or down, or
// that bursts, queues its deliveries where only those slots take them, and
// the other tenants' deliveries never wait behind them.
const BacklogThreshold = 1000

// priorityBacklogs order the backlog queue by backlog: below each a
// delivery gets priority 1, 2, 3; 4 at or above the last. River takes
// priority 1 first, so a tenant with a smaller backlog is not queued
// behind a larger one's.
var priorityBacklogs = [...]int{10_000, 50_000, 100_000}

// Priority is the River priority of a delivery made when its tenant had
// backlog deliveries in flight.
func Priority(backlog int) int {
	for i, n := range priorityBacklogs {
		if backlog < n {
			return i + 1
		}
	}
	return len(priorityBacklogs) + 1
}

type backlogCount struct {
	n  int
	at time.Time
}

// backlog returns how many of tenant's deliveries are in flight (pending
// or failed, up to MaxPending), counted within backlogTTL.
func (d *Deliverer) backlog(ctx context.Context, tenant string) (int, error) {
	d.mu.Lock()
	b, ok := d.backlogs[tenant]
	d.mu.Unlock()
	if ok && time.Since(b.at) < backlogTTL {
		return b.n, nil
	}
	var n int
	if err := d.pool.QueryRow(ctx, backlogSQL, tenant, d.cfg.MaxPending).Scan(&n); err != nil {
		return 0, fmt.Errorf("count webhook backlog: %w", err)
	}
	d.mu.Lock()
	if len(d.backlogs) > 100_000 {
		clear(d.backlogs) // bounded: it is only a cache
	}
	d.backlogs[tenant] = backlogCount{n: n, at: time.Now()}
	capped := 0
	for _, c := range d.backlogs {
		if c.n >= d.cfg.MaxPending && time.Since(c.at) < time.Minute {
			capped++
		}
	}
	d.metrics.capped.Set(float64(capped))
	d.mu.Unlock()
	return n, nil
}

// grew adds a fan-out's deliveries to the tenant's counted backlog, so a
// burst within backlogTTL does not overshoot the cap by much.
func (d *Deliverer) grew(tenant string, n int) {
	d.mu.Lock()
	if b, ok := d.backlogs[tenant]; ok {
		b.n += n
		d.backlogs[tenant] = b
	}
	d.mu.Unlock()
}

// capped counts and says (once a minute per tenant) that a tenant's
// backlog is at its cap.
func (d *Deliverer) capped(tenant string, backlog int) {
	d.metrics.fanouts.WithLabelValues("capped").Inc()
	d.mu.Lock()
	last, logged := d.cappedLogged[tenant]
	if !logged || time.Since(last) >= time.Minute {
		if len(d.cappedLogged) > 10_000 {
			clear(d.cappedLogged)
		}
		d.cappedLogged[tenant] = time.Now()
	}
	d.mu.Unlock()
	if !logged || time.Since(last) >= time.Minute {
		d.logger.Warn("a tenant's webhook backlog is at its cap: its new events wait to be fanned out until deliveries finish (ONCEFLOW_WEBHOOK_MAX_PENDING)",
			"tenant", tenant, "in_flight", backlog, "max_pending", d.cfg.MaxPending)
	}
}
