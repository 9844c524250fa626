package ingest

import (
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// limiter is a token bucket per key, in memory. Keyed by tenant, it refuses a
// tenant over its rate before its requests cost a database round trip, so it
// cannot crowd another tenant out of the accept transactions. Keyed by client
// address, it counts failed authentications (see Server.authenticate). Each
// ingest process limits on its own: n processes behind a load balancer admit
// n times the rate (docs/decisions/0011-bounds-before-authentication.md).
type limiter struct {
	rate  float64 // tokens per second
	burst float64
	// maxKeys bounds the buckets (0: no bound). Keys beyond it share one
	// bucket, so a client that makes up addresses cannot grow the map, and
	// the addresses it makes up share one budget.
	maxKeys int

	mu        sync.Mutex
	buckets   map[string]*bucket
	lastSweep time.Time
}

type bucket struct {
	tokens float64
	last   time.Time
}

// overflowKey is the shared bucket of keys beyond maxKeys; no tenant or
// address is empty.
const overflowKey = ""

func newLimiter(rate float64, burst, maxKeys int) *limiter {
	if rate <= 0 {
		return nil // no limit
	}
	return &limiter{rate: rate, burst: float64(burst), maxKeys: maxKeys, buckets: map[string]*bucket{}}
}

// allow takes a token from key's bucket, or says how long until one is
// available.
func (l *limiter) allow(key string, now time.Time) (bool, time.Duration) {
	if l == nil {
		return true, 0
	}
	return l.take(key, now, true)
}

// blocked reports whether key's bucket is empty, and for how long, without
// taking a token: a client is refused while its failures have used its
// budget up.
func (l *limiter) blocked(key string, now time.Time) (bool, time.Duration) {
	if l == nil {
		return false, 0
	}
	ok, wait := l.take(key, now, false)
	return !ok, wait
}

// spend takes a token from key's bucket if it has one (a failure counted).
func (l *limiter) spend(key string, now time.Time) {
	if l != nil {
		l.take(key, now, true)
	}
}

// take reports whether key's bucket has a token, and takes it if spend,
// or says how long until one is available.
func (l *limiter) take(key string, now time.Time, spend bool) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.refill(key, now)
	if b.tokens >= 1 {
		if spend {
			b.tokens--
		}
		return true, 0
	}
	return false, l.wait(b)
}

// refund gives back a token taken for what turned out not to be a
// failure.
func (l *limiter) refund(key string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if b, ok := l.buckets[key]; ok {
		b.tokens = min(l.burst, b.tokens+1)
	}
}

func (l *limiter) wait(b *bucket) time.Duration {
	return time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
}

// refill returns key's bucket topped up to now. Called with mu held.
func (l *limiter) refill(key string, now time.Time) *bucket {
	l.sweep(now, false)
	b, ok := l.buckets[key]
	if !ok && l.maxKeys > 0 && len(l.buckets) >= l.maxKeys {
		l.sweep(now, true)
		if len(l.buckets) >= l.maxKeys {
			key = overflowKey
			b, ok = l.buckets[key]
		}
	}
	if !ok {
		b = &bucket{tokens: l.burst, last: now}
		l.buckets[key] = b
	}
	b.tokens = min(l.burst, b.tokens+now.Sub(b.last).Seconds()*l.rate)
	b.last = now
	return b
}

// sweep forgets, once a minute (or now, when forced by a full map), the
// buckets that have refilled: a full bucket is the same as none, so memory
// stays bounded by the keys that were active in the last minute.
func (l *limiter) sweep(now time.Time, force bool) {
	if !force && now.Sub(l.lastSweep) < time.Minute {
		return
	}
	l.lastSweep = now
	for k, b := range l.buckets {
		if b.tokens+now.Sub(b.last).Seconds()*l.rate >= l.burst {
			delete(l.buckets, k)
		}
	}
}

// maxTrackedAddrs bounds the failure limiter's buckets.
const maxTrackedAddrs = 100_000

// clientAddr is the address a request's failures are counted against:
// the peer's, or, from a trusted proxy, the last X-Forwarded-For hop
// before the trusted ones (the hops a client writes itself come first and
// are never reached past an untrusted one). IPv6 addresses count per /64,
// the block one host is usually given.
func clientAddr(r *http.Request, trusted []netip.Prefix) string {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	addr := ap.Addr().Unmap()
	if isTrusted(addr, trusted) {
		hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
		for i := len(hops) - 1; i >= 0; i-- {
			a, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
			if err != nil {
				break // unreadable: the last good hop stands
			}
			addr = a.Unmap()
			if !isTrusted(addr, trusted) {
				break
			}
		}
	}
	if addr.Is6() {
		p, _ := addr.Prefix(64)
		return p.String()
	}
	return addr.String()
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// waits counts the ?wait= long-polls in flight, in total and per tenant.
type waits struct {
	max, maxPerTenant int

	mu       sync.Mutex
	total    int
	byTenant map[string]int
}

// acquire reserves a long-poll for tenant, or says which bound refused it.
func (w *waits) acquire(tenant string) (ok bool, limit string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.total >= w.max:
		return false, "total"
	case w.byTenant[tenant] >= w.maxPerTenant:
		return false, "tenant"
	}
	if w.byTenant == nil {
		w.byTenant = map[string]int{}
	}
	w.total++
	w.byTenant[tenant]++
	return true, ""
}

func (w *waits) release(tenant string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.total--
	if w.byTenant[tenant]--; w.byTenant[tenant] == 0 {
		delete(w.byTenant, tenant)
	}
}
