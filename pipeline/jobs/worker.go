package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
)

// Worker is the worker component: a River client that runs the job kinds
// registered with it on the queue of Config, under the fence.
type Worker struct {
	cfg     Config
	pool    *pgxpool.Pool
	client  *river.Client[pgx.Tx]
	logger  *slog.Logger
	metrics *metrics
	retry   *retryPolicy
	ready   chan struct{}
	// periodic are the periodic jobs the registered kinds asked for
	// (Periodic), run by River's leader.
	periodic []*river.PeriodicJob
}

// New builds a worker over pool. register adds the job kinds it runs
// (river.AddWorker on workers); it gets the worker, so that a kind's
// worker can use Skipped and Complete's pool.
func New(cfg Config, pool *pgxpool.Pool, register func(*Worker, *river.Workers) error, logger *slog.Logger, reg prometheus.Registerer) (*Worker, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	w := &Worker{cfg: cfg, pool: pool, logger: logger.With("component", "worker"), metrics: newMetrics(reg),
		retry: newRetryPolicy(cfg.BaseDelay, cfg.MaxDelay), ready: make(chan struct{})}
	workers := river.NewWorkers()
	if err := register(w, workers); err != nil {
		return nil, err
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		ID:                   cfg.ID,
		Queues:               map[string]river.QueueConfig{cfg.Queue: {MaxWorkers: cfg.MaxWorkers}, cfg.BacklogQueue(): {MaxWorkers: cfg.BacklogWorkers}},
		Workers:              workers,
		Middleware:           append(append([]rivertype.Middleware{&traceContext{}}, riverTracing(cfg.TracerProvider)...), &fence{w: w}),
		RescueStuckJobsAfter: cfg.Lease,
		JobTimeout:           cfg.AttemptTimeout,
		MaxAttempts:          cfg.MaxAttempts,
		RetryPolicy:          w.retry,
		PeriodicJobs:         w.periodic,
		FetchPollInterval:    cfg.FetchPollInterval,
		FetchCooldown:        cfg.FetchCooldown,
		Logger:               w.logger,
	})
	if err != nil {
		return nil, fmt.Errorf("jobs: river client: %w", err)
	}
	w.client = client
	return w, nil
}

// Periodic has River's leader insert a job with args on the worker's
// queue every interval, and once at start (River's periodic jobs; id
// names it among them); call it from New's register.
func (w *Worker) Periodic(id string, every time.Duration, args river.JobArgs) {
	w.periodic = append(w.periodic, river.NewPeriodicJob(river.PeriodicInterval(every),
		func() (river.JobArgs, *river.InsertOpts) {
			return args, &river.InsertOpts{Queue: w.cfg.Queue, MaxAttempts: w.cfg.MaxAttempts}
		},
		&river.PeriodicJobOpts{ID: id, RunOnStart: true}))
}

// InsertTx enqueues jobs in tx, as a projection does (unique by key in
// every state, MaxAttempts): a worker's job that makes more jobs, such as
// a webhook fan-out. On the worker's queue, or with backlog on the backlog
// queue, whose BacklogWorkers slots are the only ones its jobs take: the
// jobs of a tenant with a backlog of its own wait there, not ahead of
// every other tenant's in the queue they share. River takes a queue's jobs
// of priority 1 first, then 2, to 4.
func (w *Worker) InsertTx(ctx context.Context, tx pgx.Tx, args []Args, backlog bool, priority int) ([]*rivertype.JobInsertResult, error) {
	queue := w.cfg.Queue
	if backlog {
		queue = w.cfg.BacklogQueue()
	}
	params := make([]river.InsertManyParams, len(args))
	for i, a := range args {
		params[i] = river.InsertManyParams{Args: a, InsertOpts: &river.InsertOpts{
			Queue: queue, MaxAttempts: w.cfg.MaxAttempts, Priority: priority,
			UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: allStates},
		}}
	}
	res, err := w.client.InsertManyTx(ctx, tx, params)
	if err != nil {
		return nil, fmt.Errorf("enqueue jobs: %w", err)
	}
	return res, nil
}

// Pool is the worker's database.
func (w *Worker) Pool() *pgxpool.Pool { return w.pool }

// Client is the worker's River client (tests, benchmarks: its events).
func (w *Worker) Client() *river.Client[pgx.Tx] { return w.client }

// Ready is closed once the worker takes jobs.
func (w *Worker) Ready() <-chan struct{} { return w.ready }

// Run takes and runs jobs until ctx ends, then stops in two phases: it
// takes no new jobs and lets running attempts finish (each is bounded by
// AttemptTimeout); after that it cancels the ones left, which River
// retries.
func (w *Worker) Run(ctx context.Context) error {
	if err := w.client.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("jobs: start: %w", err)
	}
	close(w.ready)
	w.logger.Info("worker started", "queue", w.cfg.Queue, "max_workers", w.cfg.MaxWorkers, "backlog_workers", w.cfg.BacklogWorkers, "lease", w.cfg.Lease)
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), w.cfg.AttemptTimeout+time.Second)
	defer cancel()
	if err := w.client.Stop(stopCtx); err != nil {
		w.logger.Warn("attempts still running at shutdown: canceled, River retries them", "err", err)
		hard, cancelHard := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancelHard()
		if err := w.client.StopAndCancel(hard); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("jobs: stop: %w", err)
		}
	}
	return nil
}
