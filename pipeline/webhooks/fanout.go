package webhooks

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/jobs"
)

// fanout is the River worker of webhook_fanout jobs: it makes the
// deliveries of a range of a tenant's events (doc.go).
type fanout struct {
	river.WorkerDefaults[FanoutArgs]
	d *Deliverer
}

const (
	// subscriptionsSQL counts the tenant's enabled subscriptions: the most
	// deliveries an event of it makes.
	subscriptionsSQL = `SELECT count(*) FROM webhook_subscriptions WHERE tenant = $1 AND status = 'enabled'`
	// lockEventsSQL takes the range's events not fanned out yet, the first
	// $4 of them by seq, and holds them against a concurrent fan-out of
	// them (a late attempt, an overlapping range): that one waits, then
	// finds them expanded.
	lockEventsSQL = `SELECT seq FROM webhook_events
		WHERE tenant = $1 AND seq BETWEEN $2 AND $3 AND expanded_at IS NULL
		ORDER BY seq LIMIT $4 FOR UPDATE`
	// fanOutSQL makes, in one statement, a delivery row for each locked
	// event (seq $2 to $3 not expanded yet) and each subscription of the
	// tenant that wants its type and was enabled when the event was stored
	// (disabled since included: its job ends it dead, the endpoint
	// disabled), marks the events expanded, and returns the deliveries it
	// made with their events' type and body: only those get a job. An event
	// the projector refused past the tenant's bound of queued events
	// (refused, no body) makes its deliveries dead with the reason, and no
	// job.
	fanOutSQL = `WITH chunk AS (
			SELECT tenant, event_id, event_type, body, refused, created_at FROM webhook_events
			WHERE tenant = $1 AND seq BETWEEN $2 AND $3 AND expanded_at IS NULL
		), expanded AS (
			UPDATE webhook_events e SET expanded_at = now() FROM chunk c
			WHERE e.tenant = c.tenant AND e.event_id = c.event_id
		), made AS (
			INSERT INTO webhook_deliveries (tenant, subscription_id, event_id, event_type, status, last_error)
			SELECT c.tenant, s.id, c.event_id, c.event_type,
				CASE WHEN c.refused THEN 'dead' ELSE 'pending' END, CASE WHEN c.refused THEN $4 END
			FROM chunk c JOIN webhook_subscriptions s
			ON s.tenant = c.tenant AND (s.status = 'enabled' OR s.disabled_at >= c.created_at)
				AND (cardinality(s.event_types) = 0 OR c.event_type = ANY (s.event_types))
			ON CONFLICT DO NOTHING
			RETURNING event_id, subscription_id, status
		)
		SELECT m.event_id, m.subscription_id, c.event_type, c.body, m.status = 'dead' FROM made m JOIN chunk c USING (event_id)
		ORDER BY m.event_id, m.subscription_id`
	// backlogSQL counts a tenant's deliveries in flight, up to $2.
	backlogSQL = `SELECT count(*) FROM (SELECT 1 FROM webhook_deliveries
		WHERE tenant = $1 AND status IN ('pending', 'failed') LIMIT $2) AS in_flight`
)

// Work implements river.Worker: a fan-out of a range of events, fenced by
// its attempt (jobs.Complete), so the rows and jobs it makes commit with
// its completion or not at all. It makes at most MaxFanout deliveries (at
// least one event's); what is left of the range goes to a job of its own,
// enqueued in the same transaction. At the tenant's cap it waits, or
// leaves its events to the fan-out already waiting (wait); the waiting
// one, once below the cap, fans out every event of the tenant not
// expanded yet.
func (f *fanout) Work(ctx context.Context, job *river.Job[FanoutArgs]) error {
	d, a := f.d, job.Args
	backlog, err := d.backlog(ctx, a.Tenant)
	if err != nil {
		return err
	}
	if backlog >= d.cfg.MaxPending {
		d.capped(a.Tenant, backlog)
		d.markCapped(ctx, a.Tenant, backlog)
		waiting, err := d.wait(ctx, a.Tenant, job.ID)
		if err != nil {
			return err
		}
		if !waiting {
			// Another fan-out of the tenant waits, and will find these
			// events unexpanded: one waiting fan-out a tenant, however
			// many batches come (docs/webhooks.md).
			d.metrics.fanouts.WithLabelValues("left").Inc()
			return jobs.Complete(ctx, d.pool, job, func(tx pgx.Tx) error {
				jobs.Note(ctx, "left to the tenant's waiting fan-out")
				return nil
			})
		}
		// The events wait, fanned out once the tenant's backlog is below
		// the cap again; a snooze spends no attempt.
		return river.JobSnooze(cappedWait + time.Duration(rand.IntN(int(cappedWait/time.Millisecond)))*time.Millisecond) // #nosec G404 -- spreading retries
	}
	d.unmarkCapped(ctx, a.Tenant)
	made, refused := 0, 0
	err = jobs.Complete(ctx, d.pool, job, func(tx pgx.Tx) error {
		var err error
		made, refused, err = d.fanOut(ctx, tx, job, backlog)
		return err
	})
	if err != nil {
		return err
	}
	d.grew(a.Tenant, made)
	d.metrics.fanouts.WithLabelValues("expanded").Inc()
	if refused > 0 {
		d.metrics.deliveries.WithLabelValues("refused").Add(float64(refused))
	}
	return nil
}

// fanOut makes in tx the deliveries of job's range (of every event of
// the tenant not expanded yet, when job was its waiting fan-out) and
// their jobs; it returns how many it made pending and how many dead for
// events refused past the bound of queued events.
func (d *Deliverer) fanOut(ctx context.Context, tx pgx.Tx, job *river.Job[FanoutArgs], backlog int) (made, refused int, err error) {
	a := job.Args
	// The waiting fan-out stops waiting in this transaction: a fan-out
	// that finds the row (before this commits) leaves its events, stored
	// before it ran, to this one, whose reads come after; one that comes
	// later waits on the row's lock, then waits itself or fans out.
	tag, err := tx.Exec(ctx, unwaitSQL, a.Tenant, job.ID)
	if err != nil {
		return 0, 0, fmt.Errorf("end the waiting fan-out: %w", err)
	}
	if tag.RowsAffected() == 1 {
		a.From, a.To = 0, math.MaxInt64
	}
	var subs int
	if err := tx.QueryRow(ctx, subscriptionsSQL, a.Tenant).Scan(&subs); err != nil {
		return 0, 0, fmt.Errorf("count webhook subscriptions: %w", err)
	}
	limit := max(1, d.cfg.MaxFanout/max(1, subs))
	rows, err := tx.Query(ctx, lockEventsSQL, a.Tenant, a.From, a.To, limit)
	if err != nil {
		return 0, 0, fmt.Errorf("read webhook events: %w", err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, 0, fmt.Errorf("read webhook events: %w", err)
	}
	if len(seqs) == 0 {
		return 0, 0, nil // fanned out already, or deleted after the retention
	}
	last := seqs[len(seqs)-1]
	rows, err = tx.Query(ctx, fanOutSQL, a.Tenant, a.From, last, queueFullError)
	if err != nil {
		return 0, 0, fmt.Errorf("record webhook deliveries: %w", err)
	}
	var args []jobs.Args
	for rows.Next() {
		var ev, sub [16]byte
		var typ string
		var body []byte
		var dead bool
		if err := rows.Scan(&ev, &sub, &typ, &body, &dead); err != nil {
			rows.Close()
			return 0, 0, fmt.Errorf("record webhook deliveries: %w", err)
		}
		if dead {
			refused++
			continue
		}
		e, s := pipeline.ID(ev), pipeline.ID(sub)
		args = append(args, DeliveryArgs{Key: jobs.Key(e, s.String()), Tenant: a.Tenant, SubscriptionID: s,
			EventID: e, EventType: typ, Body: body})
	}
	if err := rows.Err(); err != nil {
		return 0, 0, fmt.Errorf("record webhook deliveries: %w", err)
	}
	if len(seqs) == limit && last < a.To {
		// The rest of the range, after this transaction's: keyed by
		// this job's key and where it starts, so a run again makes
		// the same job, once.
		k, err := pipeline.ParseID(a.Key)
		if err != nil {
			return 0, 0, fmt.Errorf("fan-out key %q: %w", a.Key, err)
		}
		rest := FanoutArgs{Key: jobs.Key(k, fmt.Sprint(fanoutPurpose, " from ", last+1)), Tenant: a.Tenant, From: last + 1, To: a.To}
		if _, err := d.w.InsertTx(ctx, tx, []jobs.Args{rest}, false, 1); err != nil {
			return 0, 0, err
		}
	}
	if len(args) > 0 {
		if _, err := d.w.InsertTx(ctx, tx, args, backlog >= BacklogThreshold, Priority(backlog)); err != nil {
			return 0, 0, err
		}
	}
	jobs.Note(ctx, fmt.Sprintf("%d deliveries of %d events", len(args)+refused, len(seqs)))
	return len(args), refused, nil
}

// queueFullError is a refused event's deliveries' last error: the
// tenant's delivery log says why they were not sent.
const queueFullError = "queue-full: the tenant was at its cap of deliveries in flight with its bound of queued events (ONCEFLOW_WEBHOOK_MAX_PENDING, webhooks MaxQueued) reached when the event came; it was not sent"

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
