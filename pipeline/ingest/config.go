package ingest

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pipeline"
)

// Config configures the ingest server. Zero values mean the defaults.
type Config struct {
	// Addr is the HTTP listen address (HTTP_ADDR). Default ":8080".
	Addr string
	// Shards is the number of outbox shards; it must match the relay's.
	// Default pipeline.DefaultOutboxShards (16).
	Shards int
	// IdempotencyRetention is how long a key is remembered
	// (ONCEFLOW_IDEMPOTENCY_RETENTION, shared with the relay's janitor,
	// which drops the partitions). Default 24h; at least a minute.
	IdempotencyRetention time.Duration
	// MaxBodyBytes bounds request bodies; a larger one is a 413. Default
	// 1 MiB.
	MaxBodyBytes int64
	// MaxStringBytes bounds every string of a command, as the processor
	// bounds them in commands produced to Kafka. Default
	// pipeline.DefaultMaxStringBytes.
	MaxStringBytes int
	// RateLimit is each tenant's sustained rate in requests per second, in
	// this process (ONCEFLOW_TENANT_RATE_LIMIT); above it requests are a
	// 429 with Retry-After. Default 1000. Negative: no limit.
	RateLimit float64
	// RateBurst is how many requests a tenant may send at once before the
	// rate applies. Default twice RateLimit.
	RateBurst int
	// MaxBatch is how many concurrent accepts may share one Postgres
	// transaction (group commit). Default 128; 1 gives every request its
	// own transaction.
	MaxBatch int
	// Committers is how many accept transactions may be in flight at once;
	// each holds a connection while requests keep coming. Default 2 (one
	// commits while the other gathers the next batch; more committers make
	// smaller batches and cost more per command), at most half the pool's
	// connections so reads keep the rest.
	Committers int
	// MaxPending bounds the accepts waiting for a transaction; beyond it
	// requests are a 503 with Retry-After instead of piling up. Default
	// 8192.
	MaxPending int
	// RequestTimeout bounds how long a request waits for the database
	// before it is answered 503 with Retry-After. Default 10s.
	RequestTimeout time.Duration
	// WriteTimeout bounds how long a request may take from its headers to
	// the last byte of its answer (ONCEFLOW_INGEST_WRITE_TIMEOUT; the HTTP
	// server's WriteTimeout): a client that does not read its answer holds
	// its connection and the handler that writes it for this long, then
	// the connection is closed. A ?wait= adds its wait to it, so a long
	// poll is never cut. Default 30s; longer than RequestTimeout, so the
	// 503 of a request that waited for the database is still written.
	WriteTimeout time.Duration
	// MaxWait caps the ?wait= of GET /v1/commands/{id}. Default 30s.
	MaxWait time.Duration
	// WaitPoll is how often a ?wait= reads its command again when no
	// notification of the projector woke it (one may be lost with its
	// connection). Default 500ms.
	WaitPoll time.Duration
	// MaxWaits bounds the ?wait= long-polls in flight in this process, and
	// MaxWaitsPerTenant those of one tenant: each polls the database a few
	// times a second. A request beyond either answers at once with the
	// command's current status and Retry-After: 1, as a wait that ran out
	// would. Defaults 512 and 32.
	MaxWaits, MaxWaitsPerTenant int

	// BadKeyCacheSize bounds the negative cache: the hashes of keys found
	// unknown or revoked, refused again without a database lookup for
	// BadKeyTTL. Defaults 65536 and 10m.
	BadKeyCacheSize int
	BadKeyTTL       time.Duration
	// AuthFailureRate is how many failed authentications per second one
	// client address may sustain, AuthFailureBurst how many at once; beyond
	// them its requests with a key this process does not know valid are a
	// 429 with Retry-After before any lookup. Defaults 1 and 20; a negative
	// rate: no limit. IPv6 clients are counted per /64.
	AuthFailureRate  float64
	AuthFailureBurst int
	// TrustedProxies are the networks of the load balancers in front of
	// ingest (ONCEFLOW_TRUSTED_PROXIES): from a peer in one of them, the
	// client address is the last X-Forwarded-For hop outside them. Default
	// none: the peer's own address, and X-Forwarded-For is ignored.
	TrustedProxies []netip.Prefix
	// KeyRefresh is how often ingest reads the API keys made since it last
	// read them, so that a key is known valid before its first request:
	// all the active keys are read at start (the newest maxCachedKeys/2),
	// and a restarted process is not left to learn each key on its first
	// request, through the failure limit and MaxKeyLookups, while a flood
	// of made-up keys holds both. Default 10s; negative: keys are learned
	// at their first request only.
	KeyRefresh time.Duration
	// MaxKeyLookups bounds the database lookups of keys this process does
	// not know yet that run at once (a key's first request, unknown keys);
	// concurrent requests with one key share its lookup. Beyond it a
	// request is a 503 with Retry-After rather than a wait for a
	// connection. Default a quarter of the pool's connections, at least 2.
	MaxKeyLookups int
	// Providers are the senders of webhooks accepted at POST
	// /v1/inbound/{provider} (ONCEFLOW_INBOUND_CONFIG, docs/inbound.md).
	// Default none: the route answers 404 for every name.
	Providers []Provider
	// InboundRetention is how long a provider's event ids are remembered
	// (ONCEFLOW_INBOUND_RETENTION); a delivery of an event older than
	// that is a new event. Default 30 days (DefaultInboundRetention); at
	// least an hour.
	InboundRetention time.Duration
	// AfterInbound, if set, is called after the transaction that stored
	// an inbound event committed and before the delivery is answered.
	// Test-only (InboundHoldEnv): a test that kills ingest there proves a
	// stored but unanswered event makes one command when it is delivered
	// again.
	AfterInbound func(eventID string)
	// OnAccept, if set, is called after each transaction that accepted
	// commands commits, with the outbox shards of their rows (one per
	// command, repeated when commands share a shard), and returns the
	// shards it did not see to: the notification to the relays
	// (postgres.OutboxChannel) names only those, and is not sent when
	// none is left. A process that runs the relay too wires it to the
	// relay's wake-up (relay.Relay.WakeHeld), so commands leave the outbox
	// at once, and the shards that relay holds cost no notification.
	OnAccept func(shards []int) (others []int)
	// TracerProvider, if set, makes ingest's spans (docs/observability.md):
	// otelhttp's server span of each request, and a command's outbox
	// insert, whose traceparent the command record carries on. Nil: none,
	// and a request's traceparent header goes on as it came.
	TracerProvider trace.TracerProvider
}

// DefaultRateLimit is each tenant's default rate, requests per second.
const DefaultRateLimit = 1000

// DefaultWriteTimeout is Config.WriteTimeout's default.
const DefaultWriteTimeout = 30 * time.Second

func (c *Config) setDefaults() {
	c.Addr = cmp.Or(c.Addr, ":8080")
	c.Shards = cmp.Or(c.Shards, pipeline.DefaultOutboxShards)
	c.IdempotencyRetention = cmp.Or(c.IdempotencyRetention, pipeline.DefaultIdempotencyRetention)
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, 1<<20)
	c.MaxStringBytes = cmp.Or(c.MaxStringBytes, pipeline.DefaultMaxStringBytes)
	c.RateLimit = cmp.Or(c.RateLimit, DefaultRateLimit)
	c.RateBurst = cmp.Or(c.RateBurst, max(1, int(2*c.RateLimit)))
	c.MaxBatch = cmp.Or(c.MaxBatch, 128)
	c.MaxPending = cmp.Or(c.MaxPending, 8192)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, 10*time.Second)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, DefaultWriteTimeout)
	c.MaxWait = cmp.Or(c.MaxWait, 30*time.Second)
	c.WaitPoll = cmp.Or(c.WaitPoll, 500*time.Millisecond)
	c.MaxWaits = cmp.Or(c.MaxWaits, 512)
	c.MaxWaitsPerTenant = cmp.Or(c.MaxWaitsPerTenant, 32)
	c.InboundRetention = cmp.Or(c.InboundRetention, DefaultInboundRetention)
	c.BadKeyCacheSize = cmp.Or(c.BadKeyCacheSize, 65536)
	c.BadKeyTTL = cmp.Or(c.BadKeyTTL, 10*time.Minute)
	c.AuthFailureRate = cmp.Or(c.AuthFailureRate, 1)
	c.AuthFailureBurst = cmp.Or(c.AuthFailureBurst, 20)
	c.KeyRefresh = cmp.Or(c.KeyRefresh, 10*time.Second)
}

func (c *Config) validate() error {
	var errs []error
	if err := pipeline.CheckOutboxShards(c.Shards); err != nil {
		errs = append(errs, fmt.Errorf("ingest: %w", err))
	}
	if c.IdempotencyRetention < time.Minute {
		errs = append(errs, errors.New("ingest: IdempotencyRetention must be at least a minute"))
	}
	if c.MaxBodyBytes < 1 {
		errs = append(errs, errors.New("ingest: MaxBodyBytes must be positive"))
	}
	if c.RateBurst < 1 {
		errs = append(errs, errors.New("ingest: RateBurst must be positive"))
	}
	if c.MaxBatch < 1 || c.Committers < 1 || c.MaxPending < 1 {
		errs = append(errs, errors.New("ingest: MaxBatch, Committers and MaxPending must be positive"))
	}
	if c.RequestTimeout < 0 || c.MaxWait < 0 {
		errs = append(errs, errors.New("ingest: RequestTimeout and MaxWait must not be negative"))
	}
	if c.WriteTimeout <= c.RequestTimeout {
		errs = append(errs, fmt.Errorf("ingest: WriteTimeout %s must be longer than RequestTimeout (%s): a request that waited for the database could not be answered", c.WriteTimeout, c.RequestTimeout))
	}
	if c.MaxWaits < 1 || c.MaxWaitsPerTenant < 1 || c.BadKeyCacheSize < 1 || c.BadKeyTTL < 0 || c.AuthFailureBurst < 1 || c.MaxKeyLookups < 1 {
		errs = append(errs, errors.New("ingest: MaxWaits, MaxWaitsPerTenant, BadKeyCacheSize, AuthFailureBurst and MaxKeyLookups must be positive, BadKeyTTL not negative"))
	}
	if c.InboundRetention < time.Hour {
		errs = append(errs, errors.New("ingest: InboundRetention must be at least an hour"))
	}
	return errors.Join(errs...)
}
