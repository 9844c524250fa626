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
			logger: logger.With("component", "worker"), metrics: m, inflight: map[string]int{}}
		return river.AddWorkerSafely(ws, d)
	}, nil
}

// Timeout implements river.Worker: an attempt is its request and the
// writes around it.
func (d *Deliverer) Timeout(*river.Job[DeliveryArgs]) time.Duration {
	return d.cfg.Timeout + 10*time.Second
}

const deliveryStateSQL = `SELECT d.status, s.url, s.secrets, s.status, s.disabled_reason, greatest(s.open_until - now(), '0'::interval)
	FROM webhook_deliveries d
	LEFT JOIN webhook_subscriptions s ON s.tenant = d.tenant AND s.id = d.subscription_id
	WHERE d.tenant = $1 AND d.subscription_id = $2 AND d.event_id = $3`

// Work implements river.Worker: one attempt of one delivery (doc.go).
func (d *Deliverer) Work(ctx context.Context, job *river.Job[DeliveryArgs]) error {
	a := job.Args
	if !d.acquire(a.Tenant) {
		d.metrics.deliveries.WithLabelValues("deferred-fairness").Inc()
		return river.JobSnooze(time.Duration(100+rand.IntN(400)) * time.Millisecond) // #nosec G404 -- spreading retries
	}
	defer d.release(a.Tenant)

	var status string
	var url, subStatus, reason *string
	var secrets []string
	var openFor time.Duration
	err := d.pool.QueryRow(ctx, deliveryStateSQL, a.Tenant, [16]byte(a.SubscriptionID), [16]byte(a.EventID)).
		Scan(&status, &url, &secrets, &subStatus, &reason, &openFor)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return pipeline.Permanent(fmt.Errorf("no delivery row for event %s to subscription %s", a.EventID, a.SubscriptionID))
	case err != nil:
		return fmt.Errorf("read delivery: %w", err)
	case status == "delivered":
		// An earlier attempt delivered and recorded it; only River's
		// completion of that attempt was lost.
		d.w.Skipped(Kind)
		d.metrics.deliveries.WithLabelValues("skipped").Inc()
		return jobs.Complete(ctx, d.pool, job, nil)
	case url == nil:
		return d.dead(ctx, job, 0, "the subscription was deleted")
	case *subStatus != "enabled":
		return d.dead(ctx, job, 0, "the endpoint is disabled: "+deref(reason))
	case openFor > 0:
		d.metrics.deliveries.WithLabelValues("deferred-breaker").Inc()
		return river.JobSnooze(openFor + time.Duration(rand.IntN(1000))*time.Millisecond) // #nosec G404 -- spreading retries
	}

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

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
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

const deliveredSQL = `UPDATE webhook_deliveries
	SET status = 'delivered', attempts = $4, last_status = $5, last_error = NULL, job_id = $6, delivered_at = now(), updated_at = now()
	WHERE tenant = $1 AND subscription_id = $2 AND event_id = $3
	RETURNING extract(epoch FROM now() - created_at)`

const closeBreakerSQL = `UPDATE webhook_subscriptions SET failures = 0, open_until = NULL
	WHERE tenant = $1 AND id = $2 AND (failures > 0 OR open_until IS NOT NULL)`

func (d *Deliverer) delivered(ctx context.Context, job *river.Job[DeliveryArgs], code int) error {
	a := job.Args
	var latency float64
	err := jobs.Complete(context.WithoutCancel(ctx), d.pool, job, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, deliveredSQL, a.Tenant, [16]byte(a.SubscriptionID), [16]byte(a.EventID), job.Attempt, code, job.ID).Scan(&latency); err != nil {
			return fmt.Errorf("record delivery: %w", err)
		}
		_, err := tx.Exec(ctx, closeBreakerSQL, a.Tenant, [16]byte(a.SubscriptionID))
		return err
	})
	if err != nil {
		return err
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
