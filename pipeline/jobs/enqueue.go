package jobs

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/onceflow/onceflow/pipeline"
)

// Key is the key of the job an event produces for purpose (a webhook
// subscription's id, a kind of call): the UUIDv5 of the event id and
// purpose. It names the job's effect everywhere: River's unique key, the
// Idempotency-Key of its outbound call, a webhook's delivery.
func Key(eventID pipeline.ID, purpose string) string {
	return pipeline.NameID(eventID, []byte(purpose)).String()
}

// Args are a job's arguments with its key. The key field must be tagged
// `river:"unique"` (and be the only one so tagged): River's uniqueness is
// by it.
type Args interface {
	river.JobArgs
	// JobKey is the job's key (from Key).
	JobKey() string
}

// Router says which jobs each of a batch of events produces. It runs
// inside the projector's transaction and may read and write there (a
// tenant's webhook subscriptions, a delivery's row).
type Router interface {
	Jobs(ctx context.Context, tx pgx.Tx, evs []pipeline.Event) ([][]Args, error)
}

// allStates makes a job unique in every state: an event applied again
// (after the inbox forgot it) never re-enqueues a job, not even a dead
// one (a redelivery is an operator's act: `onceflow webhooks redeliver`).
var allStates = []rivertype.JobState{
	rivertype.JobStateAvailable, rivertype.JobStateCancelled, rivertype.JobStateCompleted, rivertype.JobStateDiscarded,
	rivertype.JobStatePending, rivertype.JobStateRetryable, rivertype.JobStateRunning, rivertype.JobStateScheduled,
}

// Projection enqueues the jobs its Router finds for each event, in the
// projector's transaction (pipeline.BatchProjection): an event produces
// its jobs once. It is not rebuildable: a rebuild must not call out again.
type Projection struct {
	name     string
	queue    string
	attempts int
	router   Router
	client   *river.Client[pgx.Tx]
	enqueued *prometheus.CounterVec
	dups     *prometheus.CounterVec
}

var _ pipeline.BatchProjection[pgx.Tx] = (*Projection)(nil)

// NewProjection returns a projection named name that enqueues router's
// jobs on cfg's queue.
func NewProjection(name string, cfg Config, router Router, reg prometheus.Registerer) (*Projection, error) {
	cfg.setDefaults()
	// An insert-only client: no queues, no pool (it writes through the
	// projector's transaction).
	client, err := river.NewClient(riverpgxv5.New(nil), &river.Config{MaxAttempts: cfg.MaxAttempts, FetchCooldown: cfg.FetchCooldown,
		Middleware: riverTracing(cfg.TracerProvider)})
	if err != nil {
		return nil, fmt.Errorf("jobs: river client: %w", err)
	}
	p := &Projection{name: name, queue: cfg.Queue, attempts: cfg.MaxAttempts, router: router, client: client,
		enqueued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_projector_jobs_enqueued_total",
			Help: "Jobs the projector enqueued from events, by kind.",
		}, []string{"kind"}),
		dups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_projector_jobs_duplicate_total",
			Help: "Jobs an event produced that were already enqueued (same key: an event applied again after the inbox forgot it), by kind.",
		}, []string{"kind"}),
	}
	if reg != nil {
		// Every projection of a registry counts in the same counters (a
		// domain's job kinds beside the webhooks').
		for _, c := range []**prometheus.CounterVec{&p.enqueued, &p.dups} {
			if err := reg.Register(*c); err != nil {
				are, ok := err.(prometheus.AlreadyRegisteredError)
				if !ok {
					return nil, err
				}
				*c = are.ExistingCollector.(*prometheus.CounterVec)
			}
		}
	}
	return p, nil
}

// Name implements pipeline.Projection.
func (p *Projection) Name() string { return p.name }

// Apply implements pipeline.Projection.
func (p *Projection) Apply(ctx context.Context, tx pgx.Tx, ev pipeline.Event) error {
	out, err := p.ApplyBatch(ctx, tx, []pipeline.Event{ev})
	if err != nil {
		return err
	}
	return out[0]
}

// ApplyBatch implements pipeline.BatchProjection.
func (p *Projection) ApplyBatch(ctx context.Context, tx pgx.Tx, evs []pipeline.Event) ([]error, error) {
	perEvent, err := p.router.Jobs(ctx, tx, evs)
	if err != nil {
		return nil, err
	}
	if len(perEvent) != len(evs) {
		return nil, fmt.Errorf("jobs: the router answered %d events of %d", len(perEvent), len(evs))
	}
	var params []river.InsertManyParams
	seen := map[[2]string]bool{} // one insert per key: River refuses a key twice in one statement
	for i, jobs := range perEvent {
		for _, args := range jobs {
			k := [2]string{args.Kind(), args.JobKey()}
			if seen[k] {
				p.dups.WithLabelValues(args.Kind()).Inc()
				continue
			}
			seen[k] = true
			params = append(params, river.InsertManyParams{Args: args, InsertOpts: &river.InsertOpts{
				Queue: p.queue, MaxAttempts: p.attempts,
				UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: allStates},
				Metadata:   jobMetadata(evs[i].Traceparent, evs[i].Tenant), // #nosec G602 -- perEvent has evs' length (checked above)
			}})
		}
	}
	if len(params) > 0 {
		res, err := p.client.InsertManyTx(ctx, tx, params)
		if err != nil {
			return nil, fmt.Errorf("enqueue jobs: %w", err)
		}
		for _, r := range res {
			if r.UniqueSkippedAsDuplicate {
				p.dups.WithLabelValues(r.Job.Kind).Inc()
			} else {
				p.enqueued.WithLabelValues(r.Job.Kind).Inc()
			}
		}
	}
	return make([]error, len(evs)), nil
}
