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
	t := token{job.ID, job.Attempt}
	p.mu.Lock()
	d, ok := p.asked[t]
	delete(p.asked, t)
	p.mu.Unlock()
	if !ok {
		d = pipeline.Backoff(p.base, p.max, job.Attempt)
	}
	return time.Now().Add(d)
}
