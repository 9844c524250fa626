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
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/tracing"
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
	lastLog  time.Time // of a failed attempt (logFailure)
	unlogged int       // failed attempts not logged since
	recorder recorder
	// backlogs is each tenant's deliveries in flight as last counted
	// (fanout.go), cappedLogged when its cap was last logged.
	backlogs     map[string]backlogCount
	cappedLogged map[string]time.Time
	// cappedMarked is when this worker last wrote a tenant's
	// webhook_capped row (capped.go).
	cappedMarked map[string]time.Time
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
			logger: logger.With("component", "worker"), metrics: m, inflight: map[string]int{}, subs: map[subKey]subscription{},
			backlogs: map[string]backlogCount{}, cappedLogged: map[string]time.Time{}, cappedMarked: map[string]time.Time{}}
		if cfg.TracerProvider != nil {
			d.client.Transport = otelhttp.NewTransport(d.client.Transport,
				otelhttp.WithTracerProvider(tracing.ChildOnly(cfg.TracerProvider)), otelhttp.WithPropagators(tracing.Propagator))
		}
		w.Periodic(RetentionKind, RetentionInterval, RetentionArgs{})
		return errors.Join(river.AddWorkerSafely(ws, d), river.AddWorkerSafely(ws, &fanout{d: d}), river.AddWorkerSafely(ws, &retention{d: d}))
	}, nil
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

// deliveredSQL records deliveries — tenants $1, subscriptions $2, events
// $3, attempts $4, answers $5, jobs $6 — each fenced by its attempt in the
// same statement (the job's row locked, its attempt the running one), and
// closes their endpoints' breakers. It returns the jobs it recorded: one
// missing no longer holds its job. River completes the jobs afterwards, in
// its batch: a crash in between leaves a job to run again, and that
// attempt finds its delivery recorded and does not send it again.
const deliveredSQL = `WITH input AS (
		SELECT * FROM unnest($1::text[], $2::uuid[], $3::uuid[], $4::int[], $5::int[], $6::bigint[]) AS t(tenant, sub, event, attempt, code, job)),
	fence AS (
		SELECT j.id FROM river_job j JOIN input i ON j.id = i.job AND j.attempt = i.attempt AND j.state = 'running'
		ORDER BY j.id FOR UPDATE OF j),
	d AS (
		UPDATE webhook_deliveries w
		SET status = 'delivered', attempts = i.attempt, last_status = i.code, last_error = NULL, job_id = i.job, delivered_at = now(), updated_at = now()
		FROM input i
		WHERE w.tenant = i.tenant AND w.subscription_id = i.sub AND w.event_id = i.event AND i.job IN (SELECT id FROM fence)
		RETURNING i.job, i.tenant, i.sub, extract(epoch FROM now() - w.created_at) AS latency),
	s AS (
		UPDATE webhook_subscriptions s SET failures = 0, open_until = NULL
		FROM (SELECT DISTINCT tenant, sub FROM d) x
		WHERE s.tenant = x.tenant AND s.id = x.sub AND (s.failures > 0 OR s.open_until IS NOT NULL))
	SELECT job, latency FROM d`

// record is one delivery waiting for its write.
type record struct {
	args    DeliveryArgs
	attempt int
	code    int
	job     int64
	latency float64
	err     error
	done    chan struct{} // closed once written (or failed)
	lead    chan struct{} // closed when this caller is to write the batch
}

// recorder writes the deliveries of concurrent attempts together, one
// statement and one commit for all that wait (group commit): a commit per
// delivery was most of a delivery's cost. The caller that finds no write
// running writes everything waiting; whoever waits meanwhile goes in the
// next one, written by the first of them.
type recorder struct {
	mu      sync.Mutex
	pending []*record
	running bool
}

func (d *Deliverer) delivered(ctx context.Context, job *river.Job[DeliveryArgs], code int) error {
	r := &record{args: job.Args, attempt: job.Attempt, code: code, job: job.ID, done: make(chan struct{}), lead: make(chan struct{})}
	rec := &d.recorder
	rec.mu.Lock()
	rec.pending = append(rec.pending, r)
	lead := !rec.running
	rec.running = true
	rec.mu.Unlock()
	if !lead {
		select {
		case <-r.done:
		case <-r.lead:
			lead = true
		}
	}
	if lead {
		rec.mu.Lock()
		batch := rec.pending
		rec.pending = nil
		rec.mu.Unlock()
		d.write(batch)
		rec.mu.Lock()
		if len(rec.pending) > 0 {
			close(rec.pending[0].lead)
		} else {
			rec.running = false
		}
		rec.mu.Unlock()
		<-r.done
	}
	if r.err != nil {
		return r.err
	}
	jobs.Note(ctx, fmt.Sprintf("delivered %d", code))
	d.metrics.deliveries.WithLabelValues("delivered").Inc()
	d.metrics.latency.Observe(r.latency)
	return nil
}

// write records batch in one statement and tells each of them.
func (d *Deliverer) write(batch []*record) {
	n := len(batch)
	tenants, subs, events := make([]string, n), make([][16]byte, n), make([][16]byte, n)
	attempts, codes, ids := make([]int, n), make([]int, n), make([]int64, n)
	for i, r := range batch {
		tenants[i], subs[i], events[i] = r.args.Tenant, r.args.SubscriptionID, r.args.EventID
		attempts[i], codes[i], ids[i] = r.attempt, r.code, r.job
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.Timeout)
	defer cancel()
	written := map[int64]float64{}
	rows, err := d.pool.Query(ctx, deliveredSQL, tenants, subs, events, attempts, codes, ids)
	if err == nil {
		for rows.Next() {
			var id int64
			var latency float64
			if err = rows.Scan(&id, &latency); err != nil {
				break
			}
			written[id] = latency
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	d.metrics.batchSize.Observe(float64(n))
	for _, r := range batch {
		switch latency, ok := written[r.job]; {
		case err != nil:
			r.err = fmt.Errorf("record delivery: %w", err)
		case !ok:
			r.err = jobs.ErrFenced
		default:
			r.latency = latency
		}
		close(r.done)
	}
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
	category := Category(callErr)
	var opened bool
	err := jobs.Record(context.WithoutCancel(ctx), d.pool, job, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, failedSQL, a.Tenant, [16]byte(a.SubscriptionID), [16]byte(a.EventID), status, job.Attempt, code, category, job.ID); err != nil {
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
	d.logFailure(job, status, category, callErr)
	jobs.Note(ctx, status+": "+callErr.Error())
	d.metrics.deliveries.WithLabelValues(status).Inc()
	return callErr
}

// failureLogInterval spaces the worker's log lines of failed attempts:
// one endpoint that fails every delivery would otherwise fill the log.
const failureLogInterval = time.Second

// logFailure writes a failed attempt with the transport's text (made
// printable: jobs.CallError) to the operator's log, at most once per
// failureLogInterval with the count of those left out; the tenant's
// delivery log has its category only.
func (d *Deliverer) logFailure(job *river.Job[DeliveryArgs], status, category string, err error) {
	d.mu.Lock()
	if time.Since(d.lastLog) < failureLogInterval {
		d.unlogged++
		d.mu.Unlock()
		return
	}
	left := d.unlogged
	d.lastLog, d.unlogged = time.Now(), 0
	d.mu.Unlock()
	a := job.Args
	d.logger.Info("webhook delivery failed", "tenant", a.Tenant, "subscription_id", a.SubscriptionID, "event_id", a.EventID,
		"attempt", job.Attempt, "status", status, "category", category, "err", err, "failures_not_logged", left)
}

const disableSQL = `UPDATE webhook_subscriptions SET status = 'disabled', disabled_reason = $3, disabled_at = now(), updated_at = now()
	WHERE tenant = $1 AND id = $2 AND status = 'enabled'`

// gone disables the endpoint that answered 410 and ends the delivery.
func (d *Deliverer) gone(ctx context.Context, job *river.Job[DeliveryArgs], ce *jobs.CallError) error {
	a := job.Args
	reason := fmt.Sprintf("410 Gone at %s (delivery of event %s)", time.Now().UTC().Format(time.RFC3339), a.EventID)
	err := jobs.Record(context.WithoutCancel(ctx), d.pool, job, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, failedSQL, a.Tenant, [16]byte(a.SubscriptionID), [16]byte(a.EventID), "dead", job.Attempt, ce.Status, Category(ce), job.ID); err != nil {
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
