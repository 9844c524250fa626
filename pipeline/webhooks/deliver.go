package webhooks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/jobs"
)

// Deliverer is the River worker of webhook_delivery jobs.
type Deliverer struct {
	river.WorkerDefaults[DeliveryArgs]
	cfg     Config
	w       *jobs.Worker
	pool    *pgxpool.Pool
	client  *http.Client
	logger  *slog.Logger
	metrics *metrics

	mu       sync.Mutex
	inflight map[string]int // per tenant
	subs     map[subKey]subscription
}

// Register returns what jobs.New needs to run deliveries with cfg.
func Register(cfg Config, logger *slog.Logger, reg prometheus.Registerer) (func(*jobs.Worker, *river.Workers) error, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m := newMetrics(reg)
	return func(w *jobs.Worker, ws *river.Workers) error {
		d := &Deliverer{cfg: cfg, w: w, pool: w.Pool(), client: Guard{Allow: cfg.Allow}.Client(cfg.Timeout),
			logger: logger.With("component", "worker"), metrics: m, inflight: map[string]int{}, subs: map[subKey]subscription{}}
		return river.AddWorkerSafely(ws, d)
	}, nil
}

// Timeout implements river.Worker: an attempt is its request and the
// writes around it.
func (d *Deliverer) Timeout(*river.Job[DeliveryArgs]) time.Duration {
	return d.cfg.Timeout + 10*time.Second
}

// subscriptionSQL reads what a delivery needs of its subscription; the
// worker keeps it for CacheTTL.
const subscriptionSQL = `SELECT url, secrets, status, coalesce(disabled_reason, ''), greatest(open_until - now(), '0'::interval)
	FROM webhook_subscriptions WHERE tenant = $1 AND id = $2`

const deliveryStatusSQL = `SELECT status FROM webhook_deliveries WHERE tenant = $1 AND subscription_id = $2 AND event_id = $3`

// subscription is a cached read of a subscription.
type subscription struct {
	gone      bool // deleted
	url       string
	secrets   []string
	status    string
	reason    string
	openUntil time.Time // local clock
	readAt    time.Time
}

type subKey struct {
	tenant string
	id     pipeline.ID
}

// subscription returns the delivery's subscription, from the cache when
// it was read within CacheTTL.
func (d *Deliverer) subscription(ctx context.Context, tenant string, id pipeline.ID) (subscription, error) {
	k := subKey{tenant, id}
	d.mu.Lock()
	s, ok := d.subs[k]
	d.mu.Unlock()
	if ok && time.Since(s.readAt) < d.cfg.CacheTTL {
		return s, nil
	}
	s = subscription{readAt: time.Now()}
	var open time.Duration
	err := d.pool.QueryRow(ctx, subscriptionSQL, tenant, [16]byte(id)).Scan(&s.url, &s.secrets, &s.status, &s.reason, &open)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		s.gone = true
	case err != nil:
		return subscription{}, fmt.Errorf("read subscription: %w", err)
	}
	s.openUntil = s.readAt.Add(open)
	d.mu.Lock()
	if len(d.subs) > 100_000 {
		clear(d.subs) // bounded: it is only a cache
	}
	d.subs[k] = s
	d.mu.Unlock()
	return s, nil
}

// forget drops a subscription from the cache (this worker changed it).
func (d *Deliverer) forget(tenant string, id pipeline.ID) {
	d.mu.Lock()
	delete(d.subs, subKey{tenant, id})
	d.mu.Unlock()
}

// Work implements river.Worker: one attempt of one delivery (doc.go).
func (d *Deliverer) Work(ctx context.Context, job *river.Job[DeliveryArgs]) error {
	a := job.Args
	if !d.acquire(a.Tenant) {
		d.metrics.deliveries.WithLabelValues("deferred-fairness").Inc()
		return river.JobSnooze(time.Duration(100+rand.IntN(400)) * time.Millisecond) // #nosec G404 -- spreading retries
	}
	defer d.release(a.Tenant)

	if job.Attempt > 1 {
		// Only an earlier attempt of this job can have delivered it (a
		// redelivery resets the row): its River completion was lost.
		var status string
		err := d.pool.QueryRow(ctx, deliveryStatusSQL, a.Tenant, [16]byte(a.SubscriptionID), [16]byte(a.EventID)).Scan(&status)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return pipeline.Permanent(fmt.Errorf("no delivery row for event %s to subscription %s", a.EventID, a.SubscriptionID))
		case err != nil:
			return fmt.Errorf("read delivery: %w", err)
		case status == "delivered":
			d.w.Skipped(Kind)
			d.metrics.deliveries.WithLabelValues("skipped").Inc()
			return nil
		}
	}
	sub, err := d.subscription(ctx, a.Tenant, a.SubscriptionID)
	if err == nil && (sub.gone || sub.status != "enabled") {
		// Ending a delivery is decided on a fresh read, never on the
		// cache: the subscription may have been enabled again since.
		d.forget(a.Tenant, a.SubscriptionID)
		sub, err = d.subscription(ctx, a.Tenant, a.SubscriptionID)
	}
	switch {
	case err != nil:
		return err
	case sub.gone:
		return d.dead(ctx, job, 0, "the subscription was deleted")
	case sub.status != "enabled":
		return d.dead(ctx, job, 0, "the endpoint is disabled: "+sub.reason)
	case time.Until(sub.openUntil) > 0:
		d.metrics.deliveries.WithLabelValues("deferred-breaker").Inc()
		return river.JobSnooze(time.Until(sub.openUntil) + time.Duration(rand.IntN(1000))*time.Millisecond) // #nosec G404 -- spreading retries
	}
	url, secrets := &sub.url, sub.secrets

	req, err := http.NewRequest(http.MethodPost, *url, bytes.NewReader(a.Body))
	if err != nil {
		return d.dead(ctx, job, 0, "the URL cannot be requested: "+err.Error())
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "onceflow-webhooks")
	if err := Sign(req.Header, secrets, a.EventID.String(), time.Now(), a.Body); err != nil {
		return d.dead(ctx, job, 0, "signing: "+err.Error())
	}
	start := time.Now()
	resp, callErr := jobs.Call(ctx, d.client, req, a.Key)
	d.metrics.requestSeconds.Observe(time.Since(start).Seconds())
	if callErr == nil {
		resp.Body.Close()
		return d.delivered(ctx, job, resp.StatusCode)
	}
	ce, _ := jobs.AsCallError(callErr)
	if ce != nil && ce.Status == http.StatusGone {
		return d.gone(ctx, job, ce)
	}
	return d.failed(ctx, job, ce, callErr)
}

func (d *Deliverer) acquire(tenant string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.inflight[tenant] >= d.cfg.MaxPerTenant {
		return false
	}
	d.inflight[tenant]++
	return true
}

func (d *Deliverer) release(tenant string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.inflight[tenant]--; d.inflight[tenant] <= 0 {
		delete(d.inflight, tenant)
	}
}

// deliveredSQL records a delivery, fenced by the attempt ($6, $4) in the
// same statement, and closes the endpoint's breaker; no row means the
// attempt no longer holds the job. River completes the job afterwards, in
// its batch: a crash in between leaves the job to run again, and that
// attempt finds the delivery recorded and does not send it again.
var deliveredSQL = `WITH d AS (
		UPDATE webhook_deliveries
		SET status = 'delivered', attempts = $4, last_status = $5, last_error = NULL, job_id = $6, delivered_at = now(), updated_at = now()
		WHERE tenant = $1 AND subscription_id = $2 AND event_id = $3 AND ` + jobs.Fence(6, 4) + `
		RETURNING created_at),
	s AS (
		UPDATE webhook_subscriptions SET failures = 0, open_until = NULL
		WHERE tenant = $1 AND id = $2 AND (failures > 0 OR open_until IS NOT NULL) AND EXISTS (SELECT 1 FROM d))
	SELECT extract(epoch FROM now() - created_at) FROM d`

func (d *Deliverer) delivered(ctx context.Context, job *river.Job[DeliveryArgs], code int) error {
	a := job.Args
	var latency float64
	err := d.pool.QueryRow(context.WithoutCancel(ctx), deliveredSQL, a.Tenant, [16]byte(a.SubscriptionID), [16]byte(a.EventID), job.Attempt, code, job.ID).Scan(&latency)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return jobs.ErrFenced
	case err != nil:
		return fmt.Errorf("record delivery: %w", err)
	}
	jobs.Note(ctx, fmt.Sprintf("delivered %d", code))
	d.metrics.deliveries.WithLabelValues("delivered").Inc()
	d.metrics.latency.Observe(latency)
	return nil
}

const failedSQL = `UPDATE webhook_deliveries
	SET status = $4, attempts = $5, last_status = $6, last_error = $7, job_id = $8, updated_at = now()
	WHERE tenant = $1 AND subscription_id = $2 AND event_id = $3`

const openBreakerSQL = `UPDATE webhook_subscriptions
	SET failures = failures + 1,
	    open_until = CASE WHEN failures + 1 >= $3 THEN now() + $4::interval ELSE open_until END
	WHERE tenant = $1 AND id = $2
	RETURNING failures >= $3`

// failed records a failed attempt (dead when it was permanent or the
// last) and counts it against the endpoint's breaker, then returns the
// attempt's error for River's retry.
func (d *Deliverer) failed(ctx context.Context, job *river.Job[DeliveryArgs], ce *jobs.CallError, callErr error) error {
	a := job.Args
	if errors.Is(callErr, ErrForbiddenAddress) {
		callErr = pipeline.Permanent(callErr) // the same address would be refused again
	}
	status := "failed"
	if pipeline.IsPermanent(callErr) || job.Attempt >= job.MaxAttempts {
		status = "dead"
	}
	var code *int
	if ce != nil && ce.Status != 0 {
		code = &ce.Status
	}
	var opened bool
	err := jobs.Record(context.WithoutCancel(ctx), d.pool, job, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, failedSQL, a.Tenant, [16]byte(a.SubscriptionID), [16]byte(a.EventID), status, job.Attempt, code, callErr.Error(), job.ID); err != nil {
			return fmt.Errorf("record delivery: %w", err)
		}
		err := tx.QueryRow(ctx, openBreakerSQL, a.Tenant, [16]byte(a.SubscriptionID), d.cfg.BreakerFailures, d.cfg.BreakerCooldown.String()).Scan(&opened)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // deleted meanwhile
		}
		return err
	})
	if err != nil {
		if errors.Is(err, jobs.ErrFenced) {
			return err
		}
		return errors.Join(callErr, err)
	}
	if opened {
		d.metrics.breakerOpen.Inc()
		d.forget(a.Tenant, a.SubscriptionID)
	}
	jobs.Note(ctx, status+": "+callErr.Error())
	d.metrics.deliveries.WithLabelValues(status).Inc()
	return callErr
}

const disableSQL = `UPDATE webhook_subscriptions SET status = 'disabled', disabled_reason = $3, updated_at = now()
	WHERE tenant = $1 AND id = $2 AND status = 'enabled'`

// gone disables the endpoint that answered 410 and ends the delivery.
func (d *Deliverer) gone(ctx context.Context, job *river.Job[DeliveryArgs], ce *jobs.CallError) error {
	a := job.Args
	reason := fmt.Sprintf("410 Gone at %s (delivery of event %s)", time.Now().UTC().Format(time.RFC3339), a.EventID)
	err := jobs.Record(context.WithoutCancel(ctx), d.pool, job, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, failedSQL, a.Tenant, [16]byte(a.SubscriptionID), [16]byte(a.EventID), "dead", job.Attempt, ce.Status, ce.Error(), job.ID); err != nil {
			return fmt.Errorf("record delivery: %w", err)
		}
		tag, err := tx.Exec(ctx, disableSQL, a.Tenant, [16]byte(a.SubscriptionID), reason)
		if err == nil && tag.RowsAffected() == 1 {
			d.forget(a.Tenant, a.SubscriptionID)
			d.metrics.disabled.Inc()
			d.logger.Warn("webhook endpoint answered 410 Gone: disabled", "tenant", a.Tenant, "subscription_id", a.SubscriptionID)
		}
		return err
	})
	if err != nil {
		return err
	}
	d.metrics.deliveries.WithLabelValues("dead").Inc()
	return pipeline.Permanent(ce)
}

// dead ends a delivery that cannot be made, with why.
func (d *Deliverer) dead(ctx context.Context, job *river.Job[DeliveryArgs], code int, why string) error {
	a := job.Args
	var status *int
	if code != 0 {
		status = &code
	}
	err := jobs.Record(context.WithoutCancel(ctx), d.pool, job, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, failedSQL, a.Tenant, [16]byte(a.SubscriptionID), [16]byte(a.EventID), "dead", job.Attempt, status, why, job.ID)
		return err
	})
	if err != nil {
		return err
	}
	d.metrics.deliveries.WithLabelValues("dead").Inc()
	return pipeline.Permanent(errors.New(why))
}
