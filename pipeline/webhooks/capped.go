package webhooks

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Capped is what a tenant sees of its cap of deliveries in flight
// (Config.MaxPending) while it is at it: GET /v1/webhooks and a
// subscription's deliveries answer it (docs/webhooks.md).
type Capped struct {
	// InFlight is how many of the tenant's deliveries were in flight
	// (pending or failed; counted up to the cap) when a fan-out last
	// found it at the cap, at CheckedAt.
	InFlight   int       `json:"in_flight"`
	MaxPending int       `json:"max_pending"`
	Since      time.Time `json:"since"`
	CheckedAt  time.Time `json:"checked_at"`
	Detail     string    `json:"detail"`
}

// cappedDetail is what Capped says to the tenant.
const cappedDetail = "this tenant's webhook deliveries in flight (pending or failed) are at its cap: " +
	"its new events wait to be fanned out until deliveries finish, and none is dropped unseen " +
	"(past its bound of queued events an event's deliveries are made dead, queue-full, in its delivery log); " +
	"deliveries to an endpoint that is down or slow count until they are delivered or dead"

// cappedFresh is how long a fan-out's finding that a tenant is at its cap
// holds: a capped tenant's fan-outs wake every cappedWait or so and say it
// again (cappedMark), so a row older than this is one that no worker
// has confirmed, ended (the worker that found it stopped before its
// fan-out ran again).
const cappedFresh = 30 * time.Second

// cappedMark is how often a worker says again that a tenant is still at
// its cap: at most one write a tenant and worker in that time, whatever
// the number of its fan-outs waiting.
const cappedMark = 5 * time.Second

const (
	// markCappedSQL records tenant $1 at its cap $3 with $2 deliveries in
	// flight: since is kept while the finding holds ($4 seconds), else it
	// starts again.
	markCappedSQL = `INSERT INTO webhook_capped AS c (tenant, since, seen_at, in_flight, max_pending)
		VALUES ($1, now(), now(), $2, $3)
		ON CONFLICT (tenant) DO UPDATE SET
			since = CASE WHEN c.seen_at > now() - $4 * interval '1 second' THEN c.since ELSE now() END,
			seen_at = now(), in_flight = excluded.in_flight, max_pending = excluded.max_pending`
	unmarkCappedSQL = `DELETE FROM webhook_capped WHERE tenant = $1`
	cappedSQL       = `SELECT in_flight, max_pending, since, seen_at FROM webhook_capped
		WHERE tenant = $1 AND seen_at > now() - $2 * interval '1 second'`
)

// TenantCapped returns tenant's cap state, or nil when it is not at its
// cap: one lookup by primary key.
func TenantCapped(ctx context.Context, db DB, tenant string) (*Capped, error) {
	c := Capped{Detail: cappedDetail}
	err := db.QueryRow(ctx, cappedSQL, tenant, cappedFresh.Seconds()).Scan(&c.InFlight, &c.MaxPending, &c.Since, &c.CheckedAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read webhook cap: %w", err)
	}
	c.Since, c.CheckedAt = c.Since.UTC(), c.CheckedAt.UTC()
	return &c, nil
}

// markCapped writes that tenant is at its cap, unless this worker did
// within cappedMark. A failure is logged: the fan-out waits all the same.
func (d *Deliverer) markCapped(ctx context.Context, tenant string, backlog int) {
	d.mu.Lock()
	last, marked := d.cappedMarked[tenant]
	fresh := marked && time.Since(last) < cappedMark
	if !fresh {
		if len(d.cappedMarked) > 10_000 {
			clear(d.cappedMarked) // bounded: the rows outlive it, and end on their own
		}
		d.cappedMarked[tenant] = time.Now()
	}
	d.mu.Unlock()
	if fresh {
		return
	}
	if _, err := d.pool.Exec(ctx, markCappedSQL, tenant, backlog, d.cfg.MaxPending, cappedFresh.Seconds()); err != nil {
		d.logger.Warn("cannot record a tenant at its webhook cap", "tenant", tenant, "err", err)
	}
}

// unmarkCapped deletes tenant's cap row when this worker wrote it: its
// fan-outs run again. A row another worker wrote ends with cappedFresh.
func (d *Deliverer) unmarkCapped(ctx context.Context, tenant string) {
	d.mu.Lock()
	_, marked := d.cappedMarked[tenant]
	delete(d.cappedMarked, tenant)
	d.mu.Unlock()
	if !marked {
		return
	}
	if _, err := d.pool.Exec(ctx, unmarkCappedSQL, tenant); err != nil {
		d.logger.Warn("cannot record a tenant below its webhook cap again", "tenant", tenant, "err", err)
	}
}

// waitingStates are the River states of a fan-out that is still to run
// (running included: it has not fanned out yet, or is about to wait
// again). A waiting row whose job is in none of them (discarded,
// cancelled, gone) is taken over.
const waitingStates = `'available', 'pending', 'retryable', 'running', 'scheduled'`

const (
	// waitAgainSQL: fan-out $2 still waits for tenant $1.
	waitAgainSQL = `UPDATE webhook_fanout_waiting SET queued = queued WHERE tenant = $1 AND job_id = $2`
	// waitSQL makes fan-out $2 the one waiting for tenant $1, unless
	// another fan-out waits already: it returns a row only when $2 waits.
	// queued starts at the tenant's events not expanded yet (up to $3).
	waitSQL = `INSERT INTO webhook_fanout_waiting AS w (tenant, job_id, queued)
		VALUES ($1, $2, (SELECT count(*) FROM (SELECT 1 FROM webhook_events
			WHERE tenant = $1 AND expanded_at IS NULL LIMIT $3) AS q))
		ON CONFLICT (tenant) DO UPDATE SET job_id = excluded.job_id, queued = excluded.queued, since = now()
		WHERE NOT EXISTS (SELECT 1 FROM river_job j WHERE j.id = w.job_id AND j.state IN (` + waitingStates + `))
		RETURNING job_id`
	// unwaitSQL ends fan-out $2's wait for tenant $1 (in its fan-out's
	// transaction): it affects a row only when $2 was the one waiting.
	unwaitSQL = `DELETE FROM webhook_fanout_waiting WHERE tenant = $1 AND job_id = $2`
)

// wait reports whether fan-out job is the one waiting for tenant, at its
// cap: it was already, or no other is (then it is now). A tenant at its
// cap has at most one fan-out waiting, however many projector batches
// come; the others leave their events to it.
func (d *Deliverer) wait(ctx context.Context, tenant string, job int64) (bool, error) {
	tag, err := d.pool.Exec(ctx, waitAgainSQL, tenant, job)
	if err != nil {
		return false, fmt.Errorf("webhook fan-out wait: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return true, nil
	}
	var id int64
	err = d.pool.QueryRow(ctx, waitSQL, tenant, job, d.cfg.MaxQueued).Scan(&id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("webhook fan-out wait: %w", err)
	}
	return true, nil
}
