package jobs

import (
	"sync"
	"time"

	"github.com/riverqueue/river/rivertype"

	"github.com/onceflow/onceflow/pipeline"
)

// retryPolicy is River's ClientRetryPolicy for onceflow's jobs: full
// jitter (pipeline.Backoff) unless the failed attempt asked for a wait
// (pipeline.RetryAfter, e.g. a 429's Retry-After), which the fence
// middleware leaves here for River's executor, which asks right after the
// attempt returned, in the same process.
type retryPolicy struct {
	base, max time.Duration
	mu        sync.Mutex
	asked     map[token]time.Duration
}

// token names one attempt of one job.
type token struct {
	id      int64
	attempt int
}

func newRetryPolicy(base, max time.Duration) *retryPolicy {
	return &retryPolicy{base: base, max: max, asked: map[token]time.Duration{}}
}

// ask records that attempt t asked to be retried no sooner than d.
func (p *retryPolicy) ask(t token, d time.Duration) {
	p.mu.Lock()
	p.asked[t] = d
	p.mu.Unlock()
}

// forget drops what t asked (an attempt that did not fail).
func (p *retryPolicy) forget(t token) {
	p.mu.Lock()
	delete(p.asked, t)
	p.mu.Unlock()
}

// NextRetry implements river.ClientRetryPolicy.
func (p *retryPolicy) NextRetry(job *rivertype.JobRow) time.Time {
	return p.next(job, p.base, p.max)
}

// NextRetry is when job's failed attempt is retried by a job kind with a
// backoff of its own (a River worker's NextRetry, which River asks before
// the worker's policy): after what the attempt asked for
// (pipeline.RetryAfter), else a random wait up to base × 2^(attempt-1),
// at most max.
func (w *Worker) NextRetry(job *rivertype.JobRow, base, max time.Duration) time.Time {
	return w.retry.next(job, base, max)
}

func (p *retryPolicy) next(job *rivertype.JobRow, base, max time.Duration) time.Time {
	t := token{job.ID, job.Attempt}
	p.mu.Lock()
	d, ok := p.asked[t]
	delete(p.asked, t)
	p.mu.Unlock()
	if !ok {
		d = pipeline.Backoff(base, max, job.Attempt)
	}
	return time.Now().Add(d)
}
