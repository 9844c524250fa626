package webhooks

import (
	"cmp"
	"fmt"
	"net/netip"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Defaults of Config.
const (
	DefaultTimeout         = 10 * time.Second
	DefaultBreakerFailures = 5
	DefaultBreakerCooldown = 30 * time.Second
	DefaultMaxPerTenant    = 10
	DefaultCacheTTL        = time.Second
	DefaultMaxPending      = 100_000
	DefaultMaxQueued       = 100_000
	DefaultMaxFanout       = 1000
	// DefaultRetention is three times the projector's inbox (30 days):
	// an event the projector reads again within it is absorbed by the
	// inbox, after it by the delivery log, until its rows go.
	DefaultRetention = 90 * 24 * time.Hour
	// RetentionInterval is how often the retention job runs.
	RetentionInterval = time.Hour
)

// Config is how a worker delivers; zero means the default.
type Config struct {
	// Allow are networks deliveries may reach although the guard refuses
	// them otherwise (ONCEFLOW_WEBHOOK_ALLOW_NETWORKS). Default none.
	Allow []netip.Prefix
	// Timeout bounds one delivery's request, connect to last byte
	// (ONCEFLOW_WEBHOOK_TIMEOUT); below the job's attempt timeout. Default
	// 10s.
	Timeout time.Duration
	// BreakerFailures failures in a row open an endpoint's circuit
	// breaker for BreakerCooldown: its deliveries wait (without spending
	// attempts) until then, and one success closes it. Defaults 5 and 30s.
	BreakerFailures int
	BreakerCooldown time.Duration
	// MaxPerTenant is how many deliveries of one tenant a worker process
	// runs at once; more of that tenant's wait briefly, so other tenants
	// keep workers. Default 10.
	MaxPerTenant int
	// CacheTTL is how long a worker keeps what it read of a subscription
	// (URL, secrets, status, breaker): a change made elsewhere (a
	// rotation, a deletion, another worker's breaker) reaches it within
	// that. Default 1s.
	CacheTTL time.Duration
	// MaxPending caps a tenant's deliveries in flight (pending or failed,
	// ONCEFLOW_WEBHOOK_MAX_PENDING): at the cap the tenant's new events
	// wait to be fanned out until deliveries finish — counted
	// (onceflow_webhooks_fanouts_total{outcome="capped"},
	// onceflow_webhooks_capped_tenants), logged once a minute, and shown
	// to the tenant (TenantCapped). Nothing is dropped. Default 100,000.
	MaxPending int
	// MaxQueued bounds a capped tenant's events waiting to be fanned out
	// (Router.MaxQueued, which the projector holds them to; give both the
	// same): past it an event is stored refused, without its body, and its
	// deliveries are made dead ("queue-full") when the tenant's fan-out
	// runs, counted in onceflow_webhooks_deliveries_total{outcome="refused"}.
	// Default 100,000.
	MaxQueued int
	// MaxFanout is how many deliveries one fan-out transaction makes at
	// most (at least one event's): the projector's batch of a tenant's
	// events is fanned out in transactions of about that many delivery
	// rows and jobs, so the worker's transactions are bounded too and a
	// capped tenant overshoots its cap by at most that. Default 1000.
	MaxFanout int
	// Retention is how long finished deliveries (delivered, dead) and
	// fanned-out events are kept (ONCEFLOW_WEBHOOK_RETENTION): the delivery
	// log, and the memory that keeps an event applied again from being
	// sent again. Default 90 days; at least a day.
	Retention time.Duration
	// TracerProvider, if set, makes otelhttp's client span of each
	// delivery's request (docs/observability.md), a child of the job's
	// work span; its traceparent goes with the request. Nil: no span, and
	// the request carries the job's traceparent as it is.
	TracerProvider trace.TracerProvider
}

func (c *Config) setDefaults() {
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.BreakerFailures = cmp.Or(c.BreakerFailures, DefaultBreakerFailures)
	c.BreakerCooldown = cmp.Or(c.BreakerCooldown, DefaultBreakerCooldown)
	c.MaxPerTenant = cmp.Or(c.MaxPerTenant, DefaultMaxPerTenant)
	c.CacheTTL = cmp.Or(c.CacheTTL, DefaultCacheTTL)
	c.MaxPending = cmp.Or(c.MaxPending, DefaultMaxPending)
	c.MaxQueued = cmp.Or(c.MaxQueued, DefaultMaxQueued)
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.MaxFanout = cmp.Or(c.MaxFanout, DefaultMaxFanout)
}

func (c *Config) validate() error {
	switch {
	case c.Timeout < 0:
		return fmt.Errorf("webhooks: Timeout %s: want a positive duration", c.Timeout)
	case c.BreakerFailures < 1:
		return fmt.Errorf("webhooks: BreakerFailures %d: want 1 or more", c.BreakerFailures)
	case c.BreakerCooldown <= 0:
		return fmt.Errorf("webhooks: BreakerCooldown %s: want a positive duration", c.BreakerCooldown)
	case c.MaxPerTenant < 1:
		return fmt.Errorf("webhooks: MaxPerTenant %d: want 1 or more", c.MaxPerTenant)
	case c.MaxPending < 1:
		return fmt.Errorf("webhooks: MaxPending %d: want 1 or more", c.MaxPending)
	case c.MaxQueued < 1:
		return fmt.Errorf("webhooks: MaxQueued %d: want 1 or more", c.MaxQueued)
	case c.MaxFanout < 1:
		return fmt.Errorf("webhooks: MaxFanout %d: want 1 or more", c.MaxFanout)
	case c.Retention < 24*time.Hour:
		return fmt.Errorf("webhooks: Retention %s: want at least a day", c.Retention)
	}
	return nil
}
