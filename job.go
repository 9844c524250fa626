package onceflow

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/jobs"
)

// JobArgs are a job's arguments (jobs.Args): a struct River stores as
// JSON, whose Kind() names its job kind and whose JobKey() is its key,
// the field holding the key tagged `river:"unique"` (the only one so
// tagged). The key names the job's effect: make it with JobKey from the
// event that causes the job and what the job is for.
type JobArgs = jobs.Args

// JobKey is the key of the job the event eventID causes for purpose (a
// kind of call): a UUIDv5 of both (jobs.Key), the same however often the
// event is applied.
func JobKey(eventID pipeline.ID, purpose string) string { return jobs.Key(eventID, purpose) }

// JobKind is one kind of job a domain declares, made by Job.
type JobKind interface {
	jobKind() *jobSpec
}

// Job is a kind of job of a domain: an effect beyond the database that
// the domain's events cause — a call to a payment provider, a carrier —
// run by the worker with the guarantees of docs/jobs.md (each attempt
// fenced, retried with backoff or after the receiver's Retry-After, dead
// after its last attempt with its errors kept, `onceflow jobs list` and
// `onceflow jobs retry`). A is its arguments.
//
// Its jobs are enqueued in the projector's transaction, by Enqueue, from
// the events the domain's decisions recorded: the jobs commit with the
// read models and the offsets, so an event applied once makes its jobs
// once, and the key keeps an event applied again from making them twice
// (docs/decisions/0046-jobs-on-river.md).
type Job[A JobArgs] struct {
	// Enqueue returns the jobs of this kind ev causes (none, for most
	// events). It runs in the projector's transaction, after the domain's
	// projections applied ev: it may read the read models through tx.
	// Each job's key is JobKey(ev.ID, purpose). Required.
	Enqueue func(ctx context.Context, tx pgx.Tx, ev pipeline.Event) ([]A, error)
	// Work runs one attempt of a job: it makes the call with
	// attempt.Call (the job's key as its Idempotency-Key), records what
	// it must with attempt.Complete, and returns nil; or returns the
	// error (pipeline.Permanent ends the job, pipeline.RetryAfter sets the
	// wait). Required.
	Work func(ctx context.Context, attempt *JobAttempt[A]) error
	// MaxAttempts bounds its attempts; after the last the job is
	// discarded (dead), its errors kept. Default the worker's
	// (ONCEFLOW_WORKER_MAX_ATTEMPTS).
	MaxAttempts int
	// BaseDelay and MaxDelay bound the wait before a retry (full
	// jitter: a random wait up to BaseDelay × 2^(attempt-1), at most
	// MaxDelay) when the attempt did not ask for one. Default the
	// worker's.
	BaseDelay, MaxDelay time.Duration
}

// JobAttempt is one attempt of a job of kind A.
type JobAttempt[A JobArgs] struct {
	// Args are the job's arguments.
	Args A
	// Key is the job's key (Args.JobKey()): the Idempotency-Key of its
	// calls.
	Key string
	// Attempt is the attempt's number, from 1: its fencing token.
	Attempt int
	// ID is River's id of the job (`onceflow jobs list`).
	ID int64
	// Tenant is the tenant of the event that caused the job. Complete's
	// transaction is scoped to it: with row-level security it sees and
	// writes that tenant's rows only.
	Tenant string

	job    *river.Job[A]
	pool   *pgxpool.Pool
	client *http.Client
}

// Call makes the attempt's call, req with Idempotency-Key: Key, through
// the worker's guarded client (the webhooks' dial-time address guard and
// its ONCEFLOW_WEBHOOK_ALLOW_NETWORKS, no proxy, no redirect followed),
// and classifies the answer for the job's retries (jobs.Call): 2xx is the
// response (its body is the caller's to close); 429 and 503 are retried
// after their Retry-After; 408, 425, other 5xx and no answer after the
// backoff; other 4xx end the job.
func (a *JobAttempt[A]) Call(ctx context.Context, req *http.Request) (*http.Response, error) {
	return jobs.Call(ctx, a.client, req, a.Key)
}

// Complete runs fn and completes the job in one transaction, fenced: if
// a later attempt holds the job (this one outlived its lease), nothing fn
// wrote is kept and the error is jobs.ErrFenced (jobs.Complete). The
// transaction is scoped to the job's Tenant (jobs.CompleteScoped). Work
// returns nil after it.
func (a *JobAttempt[A]) Complete(ctx context.Context, fn func(pgx.Tx) error) error {
	return jobs.CompleteScoped(ctx, a.pool, a.job, a.Tenant, fn)
}

// Note records a short note of what the attempt did, shown by `onceflow
// jobs list` (jobs.Note).
func (a *JobAttempt[A]) Note(ctx context.Context, note string) { jobs.Note(ctx, note) }

func (j Job[A]) jobKind() *jobSpec {
	var zero A
	spec := &jobSpec{kind: zero.Kind(), maxAttempts: j.MaxAttempts, base: j.BaseDelay, max: j.MaxDelay,
		complete: j.Enqueue != nil && j.Work != nil}
	spec.router = routerFunc(func(ctx context.Context, tx pgx.Tx, evs []pipeline.Event) ([][]jobs.Args, error) {
		out := make([][]jobs.Args, len(evs))
		for i, ev := range evs {
			as, err := j.Enqueue(ctx, tx, ev)
			if err != nil {
				return nil, fmt.Errorf("%s jobs of event %s: %w", spec.kind, ev.ID, err)
			}
			for _, a := range as {
				out[i] = append(out[i], a)
			}
		}
		return out, nil
	})
	spec.register = func(w *jobs.Worker, ws *river.Workers, client *http.Client) error {
		return river.AddWorkerSafely(ws, &jobWorker[A]{job: j, spec: spec, w: w, client: client})
	}
	return spec
}

// jobSpec is a Job without its arguments' type.
type jobSpec struct {
	kind        string
	maxAttempts int
	base, max   time.Duration
	complete    bool // Enqueue and Work are set
	router      jobs.Router
	register    func(*jobs.Worker, *river.Workers, *http.Client) error
}

func (s *jobSpec) validate(domain string) error {
	var errs []error
	if !nameRE.MatchString(s.kind) || strings.HasPrefix(s.kind, "webhook_") {
		errs = append(errs, fmt.Errorf("domain %s: job kind %q: want lowercase letters, digits, '-' and '_', not starting with webhook_ (onceflow's)", domain, s.kind))
	}
	if !s.complete {
		errs = append(errs, fmt.Errorf("domain %s, job kind %s: Enqueue and Work are required", domain, s.kind))
	}
	if s.maxAttempts < 0 || s.maxAttempts > 1000 {
		errs = append(errs, fmt.Errorf("domain %s, job kind %s: MaxAttempts %d: want 1 to 1000 (0: the worker's)", domain, s.kind, s.maxAttempts))
	}
	if s.base < 0 || s.max < 0 || (s.base > 0) != (s.max > 0) || s.max < s.base {
		errs = append(errs, fmt.Errorf("domain %s, job kind %s: want BaseDelay and MaxDelay both 0 (the worker's) or 0 < BaseDelay <= MaxDelay", domain, s.kind))
	}
	return errors.Join(errs...)
}

// routerFunc is a jobs.Router.
type routerFunc func(ctx context.Context, tx pgx.Tx, evs []pipeline.Event) ([][]jobs.Args, error)

func (f routerFunc) Jobs(ctx context.Context, tx pgx.Tx, evs []pipeline.Event) ([][]jobs.Args, error) {
	return f(ctx, tx, evs)
}

// jobWorker runs a domain's job kind in the worker's River client.
type jobWorker[A JobArgs] struct {
	river.WorkerDefaults[A]
	job    Job[A]
	spec   *jobSpec
	w      *jobs.Worker
	client *http.Client
}

func (jw *jobWorker[A]) Work(ctx context.Context, job *river.Job[A]) error {
	return jw.job.Work(ctx, &JobAttempt[A]{Args: job.Args, Key: job.Args.JobKey(), Attempt: job.Attempt, ID: job.ID,
		Tenant: jobs.Tenant(job.JobRow), job: job, pool: jw.w.Pool(), client: jw.client})
}

// NextRetry is the kind's own backoff, if it has one (River asks the
// job's worker before the client's policy); a Retry-After the attempt
// asked for wins as it does for every kind.
func (jw *jobWorker[A]) NextRetry(job *river.Job[A]) time.Time {
	if jw.spec.base == 0 {
		return time.Time{}
	}
	return jw.w.NextRetry(job.JobRow, jw.spec.base, jw.spec.max)
}

// jobProjections are d's job kinds' projections: each enqueues its kind's
// jobs in the projector's transaction, with the kind's attempts.
func jobProjections(d *DeployedDomain, wcfg jobs.Config, reg prometheus.Registerer) ([]pipeline.Projection[pgx.Tx], error) {
	var out []pipeline.Projection[pgx.Tx]
	for _, k := range d.Jobs {
		spec := k.jobKind()
		cfg := wcfg
		if spec.maxAttempts > 0 {
			cfg.MaxAttempts = spec.maxAttempts
		}
		p, err := jobs.NewProjection("jobs-"+spec.kind, cfg, spec.router, reg)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// registerJobs adds the deployment's job kinds to a worker, their calls
// made by client.
func (dep *Deployment) registerJobs(w *jobs.Worker, ws *river.Workers, client *http.Client) error {
	for _, d := range dep.Domains {
		for _, k := range d.Jobs {
			if err := k.jobKind().register(w, ws, client); err != nil {
				return err
			}
		}
	}
	return nil
}
