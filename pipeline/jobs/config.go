package jobs

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Defaults of Config.
const (
	DefaultQueue      = "onceflow"
	DefaultMaxWorkers = 50
	// DefaultBacklogWorkers is BacklogWorkers unless set.
	DefaultBacklogWorkers = 10
	DefaultLease          = time.Minute
	DefaultMaxAttempts    = 10
	DefaultBaseDelay      = time.Second
	DefaultMaxDelay       = 10 * time.Minute
	// DefaultFetchCooldown is a tenth of River's default: River waits at
	// least this long between two fetches, and its inserts notify the workers
	// at most this often, so it bounds the added latency of a job
	// (docs/benchmarks.md#outbound-webhooks-deliveries-against-rivers-bare-jobs-and-the-latency-they-add).
	DefaultFetchCooldown = 10 * time.Millisecond
)

// Config is one worker process's settings; zero means the default.
type Config struct {
	// Queue is the River queue the worker takes jobs from and Projection
	// puts them in. Default "onceflow".
	Queue string
	// MaxWorkers is how many jobs the process runs at once. Default 50.
	MaxWorkers int
	// BacklogWorkers is how many jobs of the backlog queue (Queue +
	// "-backlog": the jobs of a tenant with a backlog of its own, which
	// InsertTx puts there) the process runs at once, besides MaxWorkers: a
	// tenant's backlog takes these, never the others'
	// (docs/webhooks.md#what-the-answer-does, Fairness). Default 10.
	BacklogWorkers int
	// Lease is how long an attempt may run before River's rescuer gives
	// the job to another worker (River's RescueStuckJobsAfter); the
	// rescuer looks every 30 s, so a job waits up to Lease + 30 s after
	// its worker died. Default 1m.
	Lease time.Duration
	// AttemptTimeout bounds one attempt (River's JobTimeout); below Lease,
	// so that a live attempt ends before its job is rescued. Default
	// Lease / 2.
	AttemptTimeout time.Duration
	// MaxAttempts bounds the attempts of a job; after the last it is
	// discarded with its errors kept. Default 10.
	MaxAttempts int
	// BaseDelay and MaxDelay bound the wait before a retry (full jitter):
	// a random duration up to BaseDelay × 2^(attempt-1), at most MaxDelay,
	// unless the attempt asked for longer (pipeline.RetryAfter). Defaults
	// 1s and 10m.
	BaseDelay, MaxDelay time.Duration
	// FetchPollInterval is how often the worker looks for jobs when no
	// insert notification came (River LISTENs for inserts). Default
	// River's, 1s.
	FetchPollInterval time.Duration
	// FetchCooldown is the least time between two fetches of a worker,
	// and between two insert notifications of a projector. Default 10ms.
	FetchCooldown time.Duration
	// ID names the worker process in River (attempted_by). Default River's
	// (host name and time).
	ID string
	// TracerProvider, if set, gets River's OpenTelemetry middleware on the
	// projector's inserts and the worker's attempts
	// (docs/observability.md). Nil: none (a job's traceparent still goes
	// on with its calls).
	TracerProvider trace.TracerProvider
}

func (c *Config) setDefaults() {
	c.Queue = cmp.Or(c.Queue, DefaultQueue)
	c.MaxWorkers = cmp.Or(c.MaxWorkers, DefaultMaxWorkers)
	c.BacklogWorkers = cmp.Or(c.BacklogWorkers, DefaultBacklogWorkers)
	c.Lease = cmp.Or(c.Lease, DefaultLease)
	c.AttemptTimeout = cmp.Or(c.AttemptTimeout, c.Lease/2)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.BaseDelay = cmp.Or(c.BaseDelay, DefaultBaseDelay)
	c.MaxDelay = cmp.Or(c.MaxDelay, DefaultMaxDelay)
	c.FetchCooldown = cmp.Or(c.FetchCooldown, DefaultFetchCooldown)
}

// BacklogQueue is the River queue of the backlog's jobs.
func (c Config) BacklogQueue() string { return c.Queue + "-backlog" }

func (c *Config) validate() error {
	var errs []error
	if c.MaxWorkers < 1 || c.BacklogWorkers < 1 {
		errs = append(errs, fmt.Errorf("jobs: MaxWorkers %d, BacklogWorkers %d: want 1 or more", c.MaxWorkers, c.BacklogWorkers))
	}
	if c.Lease < time.Second {
		errs = append(errs, fmt.Errorf("jobs: Lease %s: want at least 1s", c.Lease))
	}
	if c.AttemptTimeout <= 0 || c.AttemptTimeout >= c.Lease {
		errs = append(errs, fmt.Errorf("jobs: AttemptTimeout %s: want more than 0 and less than the lease (%s)", c.AttemptTimeout, c.Lease))
	}
	if c.MaxAttempts < 1 || c.MaxAttempts > 1000 {
		errs = append(errs, fmt.Errorf("jobs: MaxAttempts %d: want 1 to 1000", c.MaxAttempts))
	}
	if c.BaseDelay <= 0 || c.MaxDelay < c.BaseDelay {
		errs = append(errs, errors.New("jobs: want 0 < BaseDelay <= MaxDelay"))
	}
	return errors.Join(errs...)
}
