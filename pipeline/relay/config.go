package relay

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/onceflow/onceflow/pipeline"
)

// Config configures the relay. Zero values mean the defaults.
type Config struct {
	// InstanceID names this relay in the lease table and in `onceflow
	// outbox status` (ONCEFLOW_INSTANCE_ID). A relay that starts with the
	// instance id of a previous incarnation takes over that incarnation's
	// leases at once instead of waiting for them to expire, so it must be
	// stable and unique per relay. Default: the host name.
	InstanceID string
	// Shards is the number of outbox shards (ONCEFLOW_OUTBOX_SHARDS). It
	// must be the count ingest computes shards with; a relay refuses to
	// start against an outbox whose leases were created with another count.
	// Default pipeline.DefaultOutboxShards (16).
	Shards int
	// LeaseDuration is how long a shard's lease lasts without renewal
	// (ONCEFLOW_RELAY_LEASE). A relay that stops renewing (dead, paused,
	// cut off from Postgres) loses its shards to the others after this
	// long; it is also the Kafka transaction timeout of its producers.
	// Default 10s; at least 200ms.
	LeaseDuration time.Duration
	// TransactionalIDPrefix names the Kafka transactional producers: shard s
	// is produced with the transactional id "{prefix}-{s}", whichever relay
	// holds it, so a new holder fences the previous one in Kafka. It must
	// be unique per deployment on a cluster. Default "onceflow-relay".
	TransactionalIDPrefix string
	// BatchSize is how many rows of a shard are read, produced in one Kafka
	// transaction and deleted at once (ONCEFLOW_RELAY_BATCH_SIZE). Default 500.
	BatchSize int
	// PollInterval is how often an idle relay looks at the outbox when
	// nothing wakes it. Default 100ms.
	PollInterval time.Duration
	// MaxBackoff caps the wait between attempts while Kafka or Postgres is
	// unavailable. Default 5s.
	MaxBackoff time.Duration
	// IdempotencyRetention is how long idempotency keys are kept (must
	// match ingest's). Default 24h.
	IdempotencyRetention time.Duration
	// InboxRetention is how long the projectors' inbox remembers event ids
	// (the projector's dedup window). Default 30 days.
	InboxRetention time.Duration
	// JanitorInterval is how often partitions are created and dropped.
	// Default 1h.
	JanitorInterval time.Duration
	// BacklogMetricsTTL is how long a reading of the outbox's backlog (the
	// onceflow_outbox_backlog_rows family, read from Postgres when
	// /metrics is scraped) and of the pending commands
	// (onceflow_commands_pending, onceflow_commands_oldest_pending_age_seconds)
	// is reused: the read counts the whole outbox, so it runs at most once
	// per this period whatever the scrape rate. Default 10s.
	BacklogMetricsTTL time.Duration
}

// The defaults of Config's settings that the application also shows.
const (
	DefaultLeaseDuration = 10 * time.Second
	DefaultBatchSize     = 500
)

// TransactionalID is shard's producer's transactional id:
// "{TransactionalIDPrefix}-{shard}".
func (c Config) TransactionalID(shard int) string {
	return fmt.Sprintf("%s-%d", c.TransactionalIDPrefix, shard)
}

func (c *Config) setDefaults() {
	if c.InstanceID == "" {
		c.InstanceID, _ = os.Hostname()
		c.InstanceID = cmp.Or(c.InstanceID, "relay")
	}
	c.Shards = cmp.Or(c.Shards, pipeline.DefaultOutboxShards)
	c.LeaseDuration = cmp.Or(c.LeaseDuration, DefaultLeaseDuration)
	c.TransactionalIDPrefix = cmp.Or(c.TransactionalIDPrefix, "onceflow-relay")
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.PollInterval = cmp.Or(c.PollInterval, 100*time.Millisecond)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, 5*time.Second)
	c.IdempotencyRetention = cmp.Or(c.IdempotencyRetention, pipeline.DefaultIdempotencyRetention)
	c.InboxRetention = cmp.Or(c.InboxRetention, 30*24*time.Hour)
	c.JanitorInterval = cmp.Or(c.JanitorInterval, time.Hour)
	c.BacklogMetricsTTL = cmp.Or(c.BacklogMetricsTTL, 10*time.Second)
}

func (c *Config) validate() error {
	var errs []error
	if err := pipeline.CheckOutboxShards(c.Shards); err != nil {
		errs = append(errs, fmt.Errorf("relay: %w", err))
	}
	if c.LeaseDuration < 200*time.Millisecond {
		errs = append(errs, fmt.Errorf("relay: LeaseDuration must be at least 200ms, got %s", c.LeaseDuration))
	}
	if c.BatchSize < 1 {
		errs = append(errs, errors.New("relay: BatchSize must be positive"))
	}
	if c.PollInterval < 0 || c.MaxBackoff < 0 || c.JanitorInterval < 0 || c.BacklogMetricsTTL < 0 {
		errs = append(errs, errors.New("relay: intervals must not be negative"))
	}
	if c.IdempotencyRetention < time.Minute || c.InboxRetention < time.Minute {
		errs = append(errs, errors.New("relay: retentions must be at least a minute"))
	}
	return errors.Join(errs...)
}

// margin is how long before a lease's local deadline a relay stops
// waiting for Kafka: it covers the drift between the local and the
// database clocks' rates and the time the delete takes.
func (c *Config) margin() time.Duration {
	return min(c.LeaseDuration/10, time.Second)
}
