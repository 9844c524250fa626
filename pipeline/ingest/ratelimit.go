package ingest

import (
	"sync"
	"time"
)

// limiter is a token bucket per tenant, in memory, so a tenant over its
// rate is refused before its requests cost a database round trip and
// cannot crowd another tenant out of the accept transactions. Each ingest
// process limits on its own: n processes behind a load balancer admit n
// times the rate (docs/decisions.md).
type limiter struct {
	rate  float64 // tokens per second
	burst float64

	mu        sync.Mutex
	buckets   map[string]*bucket
	lastSweep time.Time
}

type bucket struct {
	tokens float64
	last   time.Time
}

func newLimiter(rate float64, burst int) *limiter {
	if rate <= 0 {
		return nil // no limit
	}
	return &limiter{rate: rate, burst: float64(burst), buckets: map[string]*bucket{}}
}

// allow takes a token from tenant's bucket, or says how long until one is
// available.
func (l *limiter) allow(tenant string, now time.Time) (bool, time.Duration) {
	if l == nil {
		return true, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweep(now)
	b, ok := l.buckets[tenant]
	if !ok {
		b = &bucket{tokens: l.burst, last: now}
		l.buckets[tenant] = b
	}
	b.tokens = min(l.burst, b.tokens+now.Sub(b.last).Seconds()*l.rate)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
}

// sweep forgets, once a minute, the buckets that have refilled: a full
// bucket is the same as none, so memory stays bounded by the tenants that
// were active in the last minute.
func (l *limiter) sweep(now time.Time) {
	if now.Sub(l.lastSweep) < time.Minute {
		return
	}
	l.lastSweep = now
	for t, b := range l.buckets {
		if b.tokens+now.Sub(b.last).Seconds()*l.rate >= l.burst {
			delete(l.buckets, t)
		}
	}
}
