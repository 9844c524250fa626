package onceflow

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/twmb/franz-go/pkg/kadm"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/natsink"
	"github.com/onceflow/onceflow/pipeline/postgres"
	"github.com/onceflow/onceflow/pipeline/processor"
	"github.com/onceflow/onceflow/pipeline/projector"
	"github.com/onceflow/onceflow/pipeline/relay"
	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// Config is what every component needs (docs/architecture.md#configuration).
type Config struct {
	// Domains are the domains the deployment runs. Required.
	Domains []*Domain
	Kafka   kafka.Config
	// Topics holds the topics' partitions and retentions; its Prefix, if
	// set (ONCEFLOW_TOPIC_PREFIX), replaces the one domain's name as its
	// topic prefix.
	Topics      kafka.Topics
	DatabaseURL string // DATABASE_URL
	// DatabaseMigrationURL, if set, is the role that migrates
	// (DATABASE_MIGRATION_URL), the owner of the tables; DatabaseURL is then
	// the runtime role, which only reads and writes rows
	// (docs/security.md#database-roles).
	DatabaseMigrationURL string
	// DatabaseMaxConns is each component's pool size (DATABASE_MAX_CONNS).
	// Default 10.
	DatabaseMaxConns int32
	// SchemaRegistry is the registry to use (SCHEMA_REGISTRY_URL,
	// SCHEMA_REGISTRY_USER, SCHEMA_REGISTRY_PASSWORD,
	// SCHEMA_REGISTRY_CA_FILE); an empty URL uses the embedded registry.
	SchemaRegistry avro.ClientConfig
	InstanceID     string // processor instance id (transactional id suffix)
	Logger         *slog.Logger
	// OutboxShards is the outbox's shard count (ONCEFLOW_OUTBOX_SHARDS),
	// 1 to pipeline.MaxOutboxShards: its one home, given to ingest, the
	// relay and reconcile alike so they agree (RunConfig.Ingest.Shards,
	// Relay.Shards and Reconcile.Shards are left 0). Default
	// pipeline.DefaultOutboxShards.
	OutboxShards int
	// IdempotencyRetention is how long ingest remembers an Idempotency-Key
	// and after which the relay's janitor drops its partition
	// (ONCEFLOW_IDEMPOTENCY_RETENTION), given to both so they agree.
	// Default 24h.
	IdempotencyRetention time.Duration
	// TracerProvider receives the components' spans (docs/observability.md):
	// the command line gives them an OTLP exporter's (pipeline/tracing/otlp)
	// when OTEL_EXPORTER_OTLP_ENDPOINT or _TRACES_ENDPOINT is set. Nil: no
	// spans and no instrumentation installed.
	TracerProvider trace.TracerProvider
	// TenantRateLimit is ingest's per-tenant rate in requests per second
	// (ONCEFLOW_TENANT_RATE_LIMIT; negative: none). Default 1000.
	TenantRateLimit float64
	// applicationName names the process's connections in Postgres
	// (application_name); "onceflow" unless the process says which
	// components it runs.
	applicationName string
}

// outboxShards is the outbox's shard count every component uses:
// Config.OutboxShards, or its default.
func (cfg Config) outboxShards() int { return cmp.Or(cfg.OutboxShards, pipeline.DefaultOutboxShards) }

// checkOutboxShards refuses a shard count given anywhere but in its home,
// Config.OutboxShards: ingest and the relay must agree on it.
func checkOutboxShards(cfg Config, roles map[string]int) error {
	for field, n := range roles {
		if n != 0 {
			return fmt.Errorf("%s is %d: the outbox's shard count is Config.OutboxShards (ONCEFLOW_OUTBOX_SHARDS) alone, for ingest and the relay to agree: leave %s 0", field, n, field)
		}
	}
	return pipeline.CheckOutboxShards(cfg.outboxShards())
}

// Deployment resolves cfg's domains: their topics, consumer groups and
// projector consumers.
func (cfg Config) Deployment() (*Deployment, error) {
	return newDeployment(cfg.Domains, cfg.Topics.Prefix, cfg.Topics)
}

// registry returns the Confluent-compatible registry cfg.SchemaRegistry
// names, or an embedded one with the deployment's schemas registered in a
// fixed order, so every process that builds one assigns the same ids.
func registry(ctx context.Context, cfg Config, dep *Deployment) (avro.Registry, error) {
	if cfg.SchemaRegistry.URL != "" {
		return cfg.SchemaRegistry.NewClient()
	}
	reg := avro.NewEmbedded()
	return reg, dep.RegisterSchemas(ctx, reg)
}

// subject is one schema of the deployment with the topic it describes
// and the Go types of its records.
type subject struct {
	topic, what string
	schema      string
	types       map[string]any
}

// subjects lists the deployment's schemas in the order they are
// registered: for each domain, each aggregate type's commands, the
// domain's events, each aggregate type's state.
func (dep *Deployment) subjects() ([]subject, error) {
	var out []subject
	for _, d := range dep.Domains {
		for _, a := range d.aggregates {
			schema, types, err := a.CommandsSchema()
			if err != nil {
				return nil, err
			}
			out = append(out, subject{a.Topics.Commands(), a.String() + " commands", schema, types})
		}
		schema, types, err := d.eventsSchema()
		if err != nil {
			return nil, err
		}
		out = append(out, subject{d.EventsTopic(), d.Name + " events", schema, types})
		for _, a := range d.aggregates {
			schema, types, err := a.stateSchema()
			if err != nil {
				return nil, err
			}
			out = append(out, subject{a.Topics.State(), a.String() + " state", schema, types})
		}
	}
	return out, nil
}

// RegisterSchemas registers the deployment's schemas in reg, in a fixed
// order, so that every process that registers them assigns the same ids.
// A schema the registry refuses as incompatible with an earlier version
// stops the start.
func (dep *Deployment) RegisterSchemas(ctx context.Context, reg avro.Registry) error {
	subjects, err := dep.subjects()
	if err != nil {
		return err
	}
	for _, s := range subjects {
		if _, err := reg.Register(ctx, avro.ValueSubject(s.topic), s.schema); err != nil {
			return registerError(s.what, err)
		}
	}
	return nil
}

// registerError says which schema a registry refused, and where to read
// how schemas evolve when it refused it as incompatible.
func registerError(what string, err error) error {
	if errors.Is(err, avro.ErrIncompatibleSchema) {
		return fmt.Errorf("register the %s schema: %w (docs/schemas.md#evolving-schemas)", what, err)
	}
	return fmt.Errorf("register the %s schema: %w", what, err)
}

// TopicSerdes returns the deployment's serdes by topic (each aggregate
// type's commands and state topics, each domain's events topic) over the
// registry the components use, their schemas registered: what a tool that
// produces the deployment's commands or reads its events needs.
func (cfg Config) TopicSerdes(ctx context.Context) (map[string]*avro.Serde, error) {
	dep, err := cfg.Deployment()
	if err != nil {
		return nil, err
	}
	reg, err := registry(ctx, cfg, dep)
	if err != nil {
		return nil, err
	}
	return newSerdes(ctx, reg, dep)
}

// serdes are the deployment's serdes by topic.
type serdes map[string]*avro.Serde

// newSerdes builds the deployment's serdes and registers their schemas.
func newSerdes(ctx context.Context, reg avro.Registry, dep *Deployment) (serdes, error) {
	subjects, err := dep.subjects()
	if err != nil {
		return nil, err
	}
	out := serdes{}
	for _, s := range subjects {
		serde, err := avro.NewSerde(reg, avro.ValueSubject(s.topic), s.schema, s.types)
		if err != nil {
			return nil, fmt.Errorf("%s serde: %w", s.what, err)
		}
		if _, err := serde.Register(ctx); err != nil {
			return nil, registerError(s.what, err)
		}
		out[s.topic] = serde
	}
	return out, nil
}

// processorSerdes are the serdes a's processor uses: its commands, its
// domain's events, its state, and the commands topics of the other
// aggregate types its decisions send commands to.
func (s serdes) processorSerdes(dep *Deployment, a *DeployedAggregate) processor.Serdes {
	ps := processor.Serdes{Commands: s[a.Topics.Commands()], Events: s[a.Topics.Events()], State: s[a.Topics.State()],
		Targets: map[string]processor.Target{}}
	for _, other := range dep.Aggregates() {
		if other == a {
			continue
		}
		for _, ct := range other.commandTypes {
			ps.Targets[ct] = processor.Target{Topic: other.Topics.Commands(), Commands: s[other.Topics.Commands()]}
		}
	}
	return ps
}

// Serdes are one aggregate type's serdes: its commands topic's, its
// domain's events topic's and its state topic's.
type Serdes struct {
	Commands, Events, State *avro.Serde
}

// NewSerdes returns the serdes of the aggregate type of d named aggregate
// (empty: d's only one) with topics' prefix, registering their schemas in
// reg: what a test or a tool that produces d's commands or reads its
// events needs.
func NewSerdes(ctx context.Context, reg avro.Registry, d *Domain, aggregate string, topics kafka.Topics) (Serdes, error) {
	dep, err := newDeployment([]*Domain{d}, topics.Prefix, topics)
	if err != nil {
		return Serdes{}, err
	}
	all, err := newSerdes(ctx, reg, dep)
	if err != nil {
		return Serdes{}, err
	}
	for _, a := range dep.Domains[0].aggregates {
		if a.name == aggregate || aggregate == "" && len(dep.Domains[0].aggregates) == 1 {
			return Serdes{Commands: all[a.Topics.Commands()], Events: all[a.Topics.Events()], State: all[a.Topics.State()]}, nil
		}
	}
	return Serdes{}, fmt.Errorf("domain %s has no aggregate type %q", d.Name, aggregate)
}

// Migrations are the deployment's domain migrations, in order.
func (dep *Deployment) Migrations() []postgres.Migrations {
	var out []postgres.Migrations
	for _, d := range dep.Domains {
		if d.Migrations != nil {
			out = append(out, postgres.Migrations{Name: d.Name, FS: d.Migrations})
		}
	}
	return out
}

// OpenDatabase applies pending migrations, onceflow's and the domains'
// (under goose's advisory lock, so components starting together migrate
// once), as DatabaseMigrationURL's role if set, retrying while the
// database is not up yet; then connects to DatabaseURL with maxConns
// connections (0: DatabaseMaxConns).
func (cfg Config) OpenDatabase(ctx context.Context, maxConns int32) (*pgxpool.Pool, error) {
	if cfg.DatabaseURL == "" {
		return nil, errors.New("DATABASE_URL is required")
	}
	dep, err := cfg.Deployment()
	if err != nil {
		return nil, err
	}
	if maxConns == 0 {
		maxConns = cfg.DatabaseMaxConns
	}
	if maxConns == 0 {
		maxConns = DefaultDatabaseMaxConns
	}
	warnPlaintext(cfg.Logger, cfg.DatabaseURL)
	migrateURL := cfg.DatabaseURL
	if cfg.DatabaseMigrationURL != "" {
		migrateURL = cfg.DatabaseMigrationURL
		warnPlaintext(cfg.Logger, migrateURL)
	}
	for attempt := 0; attempt < 30; attempt++ {
		if err = postgres.Migrate(ctx, migrateURL, nil, dep.Migrations()...); err == nil {
			break
		}
		if postgres.IsInsufficientPrivilege(err) {
			return nil, fmt.Errorf("%w: the database needs migrations this role may not apply; run `onceflow migrate` with DATABASE_MIGRATION_URL, or give the components DATABASE_MIGRATION_URL (docs/security.md#database-roles)", err)
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
	return postgres.ConnectTraced(ctx, cfg.DatabaseURL, maxConns, cfg.TracerProvider, cmp.Or(cfg.applicationName, "onceflow"))
}

// DefaultDatabaseMaxConns is a component's pool size unless
// DATABASE_MAX_CONNS says otherwise: enough for ingest's committers, its
// reads and its key lookups (a quarter of the pool) on any machine, where
// pgx's default (the larger of 4 and the CPUs) left two connections for
// every read on two cores. Budget it against the server's max_connections:
// every process of every component holds up to this many.
const DefaultDatabaseMaxConns = 10

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

// EnsureTopics creates every aggregate type's topics if missing and checks
// them (cleanup policies, equal partition counts for commands and state).
func (cfg Config) EnsureTopics(ctx context.Context) error {
	dep, err := cfg.Deployment()
	if err != nil {
		return err
	}
	cl, err := cfg.Kafka.NewClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	for _, a := range dep.Aggregates() {
		if err := kafka.Provision(ctx, adm, a.Topics); err != nil {
			return err
		}
	}
	return nil
}

// checkAccess refuses to start rc's Kafka components whose principal the
// cluster does not allow what their role needs (kafka.CheckAccess):
// the ACLs of docs/security.md#kafka-acls. Ingest and the worker need
// none; Describe, which every other operation implies, is not asked.
func checkAccess(ctx context.Context, rc RunConfig, dep *Deployment) error {
	c := rc.Components
	if !c.Relay && !c.Processor && !c.Projector {
		return nil
	}
	cl, err := rc.Kafka.NewClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	need := func(r kafka.Resource, name string, op kadm.ACLOperation) kafka.Need {
		return kafka.Need{Resource: r, Name: name, Op: op}
	}
	var errs []error
	check := func(role string, needs []kafka.Need) {
		errs = append(errs, kafka.CheckAccess(ctx, cl, role, rc.Kafka.Principal(), needs))
	}
	if c.Relay {
		var needs []kafka.Need
		for _, a := range dep.Aggregates() {
			needs = append(needs, need(kafka.Topic, a.Topics.Commands(), kadm.OpWrite))
		}
		rcfg := relayConfig(rc.Config, rc.Relay, dep)
		for s := range rcfg.Shards {
			needs = append(needs, need(kafka.TransactionalID, rcfg.TransactionalID(s), kadm.OpWrite))
		}
		check("relay", needs)
	}
	if c.Processor {
		var needs []kafka.Need
		for _, a := range dep.Aggregates() {
			t := a.Topics
			needs = append(needs, need(kafka.Group, a.group, kadm.OpRead),
				need(kafka.Topic, t.Commands(), kadm.OpRead), need(kafka.Topic, t.State(), kadm.OpRead), need(kafka.Topic, t.Dedup(), kadm.OpRead))
			written := []string{t.Events(), t.State(), t.Dedup(), t.DLQ(), t.Commands()}
			// The commands topics its decisions may send to
			// (processorSerdes' targets).
			for _, other := range dep.Aggregates() {
				if other != a && len(other.commandTypes) > 0 {
					written = append(written, other.Topics.Commands())
				}
			}
			for _, w := range written {
				needs = append(needs, need(kafka.Topic, w, kadm.OpWrite))
			}
			pcfg := processorConfig(rc.Config, rc.Processor, a)
			if pcfg.InstanceID != "" {
				needs = append(needs, need(kafka.TransactionalID, pcfg.TransactionalID(), kadm.OpWrite))
			}
		}
		check("processor", needs)
	}
	if c.Projector {
		var needs []kafka.Need
		for _, d := range dep.Domains {
			needs = append(needs, need(kafka.Topic, d.EventsTopic(), kadm.OpRead), need(kafka.Group, d.ProjectorConsumer(), kadm.OpRead))
		}
		check("projector", needs)
	}
	return errors.Join(errs...)
}

// newIngest builds the ingest server for every domain's routes: each
// route's command goes to the commands topic of the aggregate type that
// handles it.
func newIngest(cfg Config, icfg ingest.Config, pool *pgxpool.Pool, dep *Deployment, s serdes, reg prometheus.Registerer) (*ingest.Server, error) {
	icfg.Shards = cfg.outboxShards()
	if icfg.IdempotencyRetention == 0 {
		icfg.IdempotencyRetention = cfg.IdempotencyRetention
	}
	if icfg.RateLimit == 0 {
		icfg.RateLimit = cfg.TenantRateLimit
	}
	var routes []ingest.Route
	var queries []ingest.Query
	for _, d := range dep.Domains {
		for _, r := range d.Routes {
			if r.Command == nil {
				return nil, fmt.Errorf("domain %s: route %s has no Command", d.Name, r.Pattern)
			}
			a := dep.Handler(r.Command.MessageType())
			if a == nil {
				return nil, fmt.Errorf("domain %s: route %s accepts %s, which no aggregate type's decider handles", d.Name, r.Pattern, r.Command.MessageType())
			}
			r.Topic, r.Encoder = a.Topics.Commands(), s[a.Topics.Commands()]
			routes = append(routes, r)
		}
		queries = append(queries, d.Queries...)
	}
	return ingest.New(icfg, routes, queries, pool, cfg.Logger, reg)
}

// newRelay builds the relay; it ships the whole outbox, every domain's
// commands, and makes and closes its own (transactional, one per shard)
// producers.
func newRelay(cfg Config, rcfg relay.Config, pool *pgxpool.Pool, dep *Deployment, reg prometheus.Registerer) (*relay.Relay, error) {
	return relay.New(relayConfig(cfg, rcfg, dep), pool, cfg.Kafka, cfg.Logger, reg)
}

// relayConfig is rcfg with the deployment's defaults.
func relayConfig(cfg Config, rcfg relay.Config, dep *Deployment) relay.Config {
	rcfg.Shards = cfg.outboxShards()
	if rcfg.IdempotencyRetention == 0 {
		rcfg.IdempotencyRetention = cfg.IdempotencyRetention
	}
	if rcfg.InstanceID == "" {
		rcfg.InstanceID = cfg.InstanceID
	}
	if rcfg.TransactionalIDPrefix == "" {
		// The first domain's prefix names the outbox's producers: a
		// deployment keeps its first domain.
		rcfg.TransactionalIDPrefix = "onceflow-relay-" + dep.Domains[0].prefix
	}
	return rcfg
}

// newProcessor builds a's processor.
func newProcessor(cfg Config, pcfg processor.Config, dep *Deployment, a *DeployedAggregate, s serdes, reg prometheus.Registerer) (runner, error) {
	return a.newProcessor(processorConfig(cfg, pcfg, a), cfg.Kafka, s.processorSerdes(dep, a), cfg.Logger, reg)
}

// processorConfig is a's processor's pcfg.
func processorConfig(cfg Config, pcfg processor.Config, a *DeployedAggregate) processor.Config {
	pcfg.Topics = a.Topics
	pcfg.Group = a.group
	if pcfg.InstanceID == "" {
		pcfg.InstanceID = cfg.InstanceID
	}
	return pcfg
}

// ReadModels are d's read models in the order its projector applies
// them: its own, then command_status and audit_log.
func (d *DeployedDomain) ReadModels() []pipeline.Projection[pgx.Tx] {
	return append(append([]pipeline.Projection[pgx.Tx](nil), d.Projections...),
		projector.CommandStatus{CommandTypeOf: d.CommandTypeOf}, projector.AuditLog{})
}

// newProjector builds d's projector: d's projections, then the webhooks
// projection, which enqueues the fan-outs or deliveries of each batch on
// wcfg's queue in the projector's transaction, inline only below hcfg's
// MaxPending (docs/webhooks.md). It is not part of
// d.projections(): a rebuild must not deliver again.
func newProjector(cfg Config, pcfg projector.Config, wcfg jobs.Config, hcfg webhooks.Config, pool *pgxpool.Pool, d *DeployedDomain, s serdes, reg prometheus.Registerer) (*projector.Projector, error) {
	pcfg.Topic = d.EventsTopic()
	pcfg.Consumer = d.ProjectorConsumer()
	hooks, err := jobs.NewProjection("webhooks", wcfg, webhooks.Router{MaxPending: hcfg.MaxPending, MaxQueued: hcfg.MaxQueued}, reg)
	if err != nil {
		return nil, err
	}
	own, err := jobProjections(d, wcfg, reg)
	if err != nil {
		return nil, err
	}
	return projector.New(pcfg, cfg.Kafka, pool, s[d.EventsTopic()], append(append(d.ReadModels(), hooks), own...), cfg.Logger, reg)
}

// newNATSink builds d's NATS sink: d's events topic to the stream
// {prefix}_events, on the subjects {prefix}.events.{tenant}.{event-type},
// in the group NATSinkGroup.
func newNATSink(cfg Config, ncfg natsink.Config, d *DeployedDomain, reg prometheus.Registerer) (*natsink.Sink, error) {
	ncfg.Topic = d.EventsTopic()
	ncfg.Group = d.NATSinkGroup()
	return natsink.New(ncfg, cfg.Kafka, cfg.Logger, reg)
}

// newWorker builds the worker: River's client over pool running the job
// kinds onceflow has (webhook deliveries) and the deployment's domains'
// own (Domain.Jobs). Its River client id is River's default (host name
// and start time): River elects its leader by it, so two workers must
// never share one.
func newWorker(cfg Config, wcfg jobs.Config, hcfg webhooks.Config, pool *pgxpool.Pool, dep *Deployment, reg prometheus.Registerer) (*jobs.Worker, error) {
	hooks, err := webhooks.Register(hcfg, cfg.Logger, reg)
	if err != nil {
		return nil, err
	}
	// A domain's job calls out as a webhook delivery does: its URL may come
	// from event data, so it gets the same guard, allow-list and no proxy.
	// Each attempt's context bounds a call (AttemptTimeout).
	client := webhooks.Guard{Allow: hcfg.Allow}.Client(0)
	register := func(w *jobs.Worker, ws *river.Workers) error {
		if err := hooks(w, ws); err != nil {
			return err
		}
		return dep.registerJobs(w, ws, client)
	}
	return jobs.New(wcfg, pool, register, cfg.Logger, reg)
}
