// Package stack assembles onceflow's reference pipeline (the ledger) from
// configuration: the schema registry and serdes, and each component ready
// to Run. The binaries in cmd/ and `onceflow dev` call it, so a component
// started on its own and the same component inside the dev stack are built
// the same way.
package onceflow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/ledger"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/processor"
	"github.com/onceflow/onceflow/pipeline/projector"
	"github.com/onceflow/onceflow/pipeline/relay"
	"github.com/onceflow/onceflow/schemas"
)

// Config is what every component needs (docs/architecture.md#configuration).
type Config struct {
	Kafka       kafka.Config
	Topics      kafka.Topics
	DatabaseURL string // DATABASE_URL
	// SchemaRegistry is the registry to use (SCHEMA_REGISTRY_URL,
	// SCHEMA_REGISTRY_USER, SCHEMA_REGISTRY_PASSWORD,
	// SCHEMA_REGISTRY_CA_FILE); an empty URL uses the embedded registry.
	SchemaRegistry avro.ClientConfig
	InstanceID     string // processor instance id (transactional id suffix)
	Logger         *slog.Logger
	// OutboxShards is the outbox's shard count (ONCEFLOW_OUTBOX_SHARDS),
	// given to ingest and the relay alike so they agree. Default
	// pipeline.DefaultOutboxShards.
	OutboxShards int
	// IdempotencyRetention is how long ingest remembers an Idempotency-Key
	// and after which the relay's janitor drops its partition
	// (ONCEFLOW_IDEMPOTENCY_RETENTION), given to both so they agree.
	// Default 24h.
	IdempotencyRetention time.Duration
	// TenantRateLimit is ingest's per-tenant rate in requests per second
	// (ONCEFLOW_TENANT_RATE_LIMIT; negative: none). Default 1000.
	TenantRateLimit float64
}

// Registry returns the Confluent-compatible registry cfg.SchemaRegistry names,
// or an embedded one with the ledger's schemas registered in a fixed order
// (commands, events, state), so every process that builds one assigns the
// same ids.
func Registry(ctx context.Context, cfg Config) (avro.Registry, error) {
	if cfg.SchemaRegistry.URL != "" {
		return cfg.SchemaRegistry.NewClient()
	}
	return EmbeddedRegistry(ctx, cfg.Topics)
}

// EmbeddedRegistry returns an in-process registry holding the ledger's
// schemas for topics, registered in a fixed order so ids are the same in
// every process.
func EmbeddedRegistry(ctx context.Context, topics kafka.Topics) (*avro.Embedded, error) {
	reg := avro.NewEmbedded()
	return reg, RegisterSchemas(ctx, reg, topics)
}

// RegisterSchemas registers the ledger's schemas for topics in reg, in the
// order commands, events, state. A schema the registry refuses as
// incompatible with an earlier version stops the start.
func RegisterSchemas(ctx context.Context, reg avro.Registry, topics kafka.Topics) error {
	for _, suffix := range []string{schemas.Commands, schemas.Events, schemas.State} {
		schema, err := schemas.FS.ReadFile(schemas.File(suffix))
		if err != nil {
			return err
		}
		if _, err := reg.Register(ctx, avro.ValueSubject(topicOf(topics, suffix)), string(schema)); err != nil {
			return registerError(suffix, err)
		}
	}
	return nil
}

// registerError says which schema a registry refused, and where to read
// how schemas evolve when it refused it as incompatible.
func registerError(suffix string, err error) error {
	if errors.Is(err, avro.ErrIncompatibleSchema) {
		return fmt.Errorf("register %s schema: %w (docs/schemas.md#evolving-schemas)", suffix, err)
	}
	return fmt.Errorf("register %s schema: %w", suffix, err)
}

func topicOf(t kafka.Topics, suffix string) string {
	switch suffix {
	case schemas.Commands:
		return t.Commands()
	case schemas.Events:
		return t.Events()
	}
	return t.State()
}

// Serdes are the ledger's serdes over a registry.
type Serdes struct {
	Commands, Events, State *avro.Serde
}

// NewSerdes builds the ledger's serdes and registers their schemas.
func NewSerdes(ctx context.Context, reg avro.Registry, topics kafka.Topics) (Serdes, error) {
	mk := func(topic, suffix string, types map[string]any) (*avro.Serde, error) {
		schema, err := schemas.FS.ReadFile(schemas.File(suffix))
		if err != nil {
			return nil, err
		}
		s, err := avro.NewSerde(reg, avro.ValueSubject(topic), string(schema), types)
		if err != nil {
			return nil, fmt.Errorf("%s serde: %w", suffix, err)
		}
		if _, err := s.Register(ctx); err != nil {
			return nil, registerError(suffix, err)
		}
		return s, nil
	}
	var s Serdes
	var err error
	if s.Commands, err = mk(topics.Commands(), schemas.Commands, ledger.CommandTypes()); err != nil {
		return s, err
	}
	if s.Events, err = mk(topics.Events(), schemas.Events, ledger.EventTypes()); err != nil {
		return s, err
	}
	s.State, err = mk(topics.State(), schemas.State, map[string]any{"onceflow.Snapshot": processor.Snapshot[ledger.Account]{}})
	return s, err
}

// ProcessorSerdes adapts Serdes for the processor.
func (s Serdes) ProcessorSerdes() processor.Serdes {
	return processor.Serdes{Commands: s.Commands, Events: s.Events, State: s.State}
}

// OpenDatabase connects to DatabaseURL and applies pending migrations
// (under goose's advisory lock, so components starting together migrate
// once), retrying while the database is not up yet.
func OpenDatabase(ctx context.Context, cfg Config, maxConns int32) (*pgxpool.Pool, error) {
	if cfg.DatabaseURL == "" {
		return nil, errors.New("DATABASE_URL is required")
	}
	warnPlaintext(cfg.Logger, cfg.DatabaseURL)
	var err error
	for attempt := 0; attempt < 30; attempt++ {
		if err = postgres.Migrate(ctx, cfg.DatabaseURL, nil); err == nil {
			break
		}
		if !postgres.IsUnavailable(err) {
			return nil, err
		}
		cfg.Logger.Warn("database not reachable yet", "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
	if err != nil {
		return nil, err
	}
	return postgres.Connect(ctx, cfg.DatabaseURL, maxConns)
}

// warnPlaintext warns when the database is on another machine and the
// connection may go without TLS: pgx's default sslmode, prefer, like
// disable and allow, falls back to plaintext whenever TLS is declined,
// and does not check whom it talks to.
func warnPlaintext(logger *slog.Logger, url string) {
	if host, ok := postgres.PlaintextRemote(url); ok {
		logger.Warn("the database connection may be unencrypted and its server unverified: use sslmode=verify-full with sslrootcert (docs/security.md)",
			"host", host)
	}
}

// EnsureTopics creates the topics if missing and checks them (cleanup
// policies, equal partition counts for commands and state).
func EnsureTopics(ctx context.Context, cfg Config) error {
	cl, err := cfg.Kafka.NewClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return kafka.Provision(ctx, kadm.NewClient(cl), cfg.Topics)
}

// NewIngest builds the ingest server.
func NewIngest(cfg Config, icfg ingest.Config, pool *pgxpool.Pool, s Serdes, reg prometheus.Registerer) (*ingest.Server, error) {
	icfg.CommandsTopic = cfg.Topics.Commands()
	if icfg.Shards == 0 {
		icfg.Shards = cfg.OutboxShards
	}
	if icfg.IdempotencyRetention == 0 {
		icfg.IdempotencyRetention = cfg.IdempotencyRetention
	}
	if icfg.RateLimit == 0 {
		icfg.RateLimit = cfg.TenantRateLimit
	}
	return ingest.New(icfg, pool, s.Commands, cfg.Logger, reg)
}

// NewRelay builds the relay; it makes and closes its own (transactional,
// one per shard) producers.
func NewRelay(cfg Config, rcfg relay.Config, pool *pgxpool.Pool, reg prometheus.Registerer) (*relay.Relay, error) {
	if rcfg.Shards == 0 {
		rcfg.Shards = cfg.OutboxShards
	}
	if rcfg.IdempotencyRetention == 0 {
		rcfg.IdempotencyRetention = cfg.IdempotencyRetention
	}
	if rcfg.InstanceID == "" {
		rcfg.InstanceID = cfg.InstanceID
	}
	if rcfg.TransactionalIDPrefix == "" {
		rcfg.TransactionalIDPrefix = "onceflow-relay-" + cfg.Topics.Prefix
	}
	return relay.New(rcfg, pool, cfg.Kafka, cfg.Logger, reg)
}

// NewProcessor builds the ledger processor.
func NewProcessor(cfg Config, pcfg processor.Config, s Serdes, reg prometheus.Registerer) (*processor.Processor[ledger.Account], error) {
	pcfg.Topics = cfg.Topics
	if pcfg.InstanceID == "" {
		pcfg.InstanceID = cfg.InstanceID
	}
	return processor.New(pcfg, cfg.Kafka, ledger.NewDecider(), s.ProcessorSerdes(), cfg.Logger, reg)
}

// NewProjector builds the ledger projector.
func NewProjector(cfg Config, pcfg projector.Config, pool *pgxpool.Pool, s Serdes, reg prometheus.Registerer) (*projector.Projector, error) {
	pcfg.Topic = cfg.Topics.Events()
	return projector.New(pcfg, cfg.Kafka, pool, s.Events, ledger.Projections(), cfg.Logger, reg)
}
