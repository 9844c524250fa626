package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/processor"
	"github.com/onceflow/onceflow/pipeline/projector"
	"github.com/onceflow/onceflow/pipeline/reconcile"
	"github.com/onceflow/onceflow/pipeline/relay"
	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// Common holds the shared settings once flags are parsed.
type Common struct {
	Brokers     string
	DatabaseURL string
	// DatabaseMigrationURL is the migration role's (DATABASE_MIGRATION_URL).
	DatabaseMigrationURL string
	DatabaseMaxConns     int
	// TrustedProxies are ingest's load balancers (ONCEFLOW_TRUSTED_PROXIES).
	TrustedProxies    string
	SchemaRegistryURL string
	TopicPrefix       string
	Partitions        int
	HTTPAddr          string
	AdminAddr         string
	LogLevel          string
	LogFormat         string
	InstanceID        string
	OutboxShards      int
	SASLMechanism     string
	SASLUser          string
	SASLPassword      string
	TLS               bool
	TLSCAFile         string
	// AllowPlaintextSASL lets SASL run without TLS.
	AllowPlaintextSASL bool
	// The schema registry's basic auth and CA bundle.
	SchemaRegistryUser     string
	SchemaRegistryPassword string
	SchemaRegistryCAFile   string
	// AdminToken enables the admin routes that act (ONCEFLOW_ADMIN_TOKEN).
	AdminToken string
	// Ingest's, the first shared with the relay's janitor (strings until
	// Stack parses them).
	IdempotencyRetention string
	TenantRateLimit      string
	// Inbound webhooks: the providers' file and how long event ids are
	// kept (docs/inbound.md).
	InboundConfig    string
	InboundRetention string
	// ReconcileInterval is ONCEFLOW_RECONCILE_INTERVAL (the relay's
	// periodic reconciliation; empty or 0: off).
	ReconcileInterval string
	// The processor's (strings until Processor parses them).
	DedupWindow             string
	ProcessorSessionTimeout string
	// Empty or 0: processor.Config's defaults.
	ProcessorMaxClockSkew    string
	ProcessorMaxCommandBytes int
	// The projector's.
	ProjectorSessionTimeout string
	ProjectorParallelism    int
	ProjectorSyncCommit     bool
	// The relay's (the lease a string until Relay parses it).
	RelayLease     string
	RelayBatchSize int
	// LagExport is ONCEFLOW_LAG_EXPORT (RunConfig.LagExport).
	LagExport string
	// The worker's (docs/jobs.md; durations strings until Worker parses
	// them). Queue and MaxAttempts are the projector's too.
	WorkerQueue          string
	WorkerMaxWorkers     int
	WorkerLease          string
	WorkerAttemptTimeout string
	WorkerMaxAttempts    int
	WorkerBaseDelay      string
	WorkerMaxDelay       string
	// The webhook deliveries' (docs/webhooks.md).
	WebhookTimeout         string
	WebhookAllowNetworks   string
	WebhookBreakerFailures int
	WebhookBreakerCooldown string
	WebhookMaxPerTenant    int

	envErrs []error            // malformed numeric or boolean variables, reported by Stack
	domains []*onceflow.Domain // what the deployment runs, for Stack
}

// secret is the flag.Value of a setting that must never be printed (a
// password, a URL that may carry one, a token). Its default comes from the
// environment like every other flag's, but the flag package sees it as
// empty, so -h and flag errors cannot show it; usage says "(set)" instead.
type secret struct{ p *string }

func (s secret) String() string     { return "" }
func (s secret) Set(v string) error { *s.p = v; return nil }

// secretVar defines a secret flag defaulting to the variable env, or to
// the contents of the file env_FILE names (a container secret such as
// /run/secrets/kafka_password, which no process listing or `docker
// inspect` shows); a file that cannot be read is reported in errs.
func secretVar(fs *flag.FlagSet, p *string, name, env string, getenv func(string) string, errs *[]error, usage string) {
	*p = getenv(env)
	if f := getenv(env + "_FILE"); *p == "" && f != "" {
		b, err := os.ReadFile(f) // #nosec G304 -- the operator names the file
		if err != nil {
			*errs = append(*errs, fmt.Errorf("%s_FILE: %w", env, err))
		}
		*p = strings.TrimRight(string(b), "\r\n")
	}
	usage += " (" + env + " or " + env + "_FILE)"
	if *p != "" {
		usage += " (set)"
	}
	fs.Var(secret{p}, name, usage)
}

// Register defines the shared flags on fs, defaulting from getenv.
func Register(fs *flag.FlagSet, getenv func(string) string) *Common {
	c := &Common{}
	env := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	// envInt is a whole-number variable; a malformed one is reported by
	// Stack, with its name and value.
	envInt := func(name string, def int) int {
		v := getenv(name)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			c.envErrs = append(c.envErrs, fmt.Errorf("%s=%q: want a whole number", name, v))
		}
		return n
	}
	// envBool is a true/false variable (1, t, true, 0, f, false in any
	// case, as strconv.ParseBool reads them); anything else is reported by
	// Stack rather than read as false.
	envBool := func(name string) bool {
		v := getenv(name)
		if v == "" {
			return false
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			c.envErrs = append(c.envErrs, fmt.Errorf("%s=%q: want true or false", name, v))
		}
		return b
	}
	fs.StringVar(&c.DedupWindow, "dedup-window", env("ONCEFLOW_DEDUP_WINDOW", processor.DefaultDedupWindow.String()), "how long the processor remembers a command id after handling it; at least the commands topic's retention (ONCEFLOW_DEDUP_WINDOW)")
	fs.StringVar(&c.ProcessorSessionTimeout, "processor-session-timeout", env("ONCEFLOW_PROCESSOR_SESSION_TIMEOUT", processor.DefaultSessionTimeout.String()), "processor group session timeout; its transaction timeout is 8/10 of it (ONCEFLOW_PROCESSOR_SESSION_TIMEOUT)")
	fs.StringVar(&c.ProcessorMaxClockSkew, "processor-max-clock-skew", env("ONCEFLOW_PROCESSOR_MAX_CLOCK_SKEW", ""), "how far ahead of the processor's clock a command's record time may be; a later one goes to the DLQ (future-timestamp); empty: "+processor.DefaultMaxClockSkew.String()+" (ONCEFLOW_PROCESSOR_MAX_CLOCK_SKEW)")
	fs.IntVar(&c.ProcessorMaxCommandBytes, "processor-max-command-bytes", envInt("ONCEFLOW_PROCESSOR_MAX_COMMAND_BYTES", 0), "largest command record value the processor decides; a larger one goes to the DLQ (too-large); 0: "+strconv.Itoa(processor.DefaultMaxCommandBytes)+" (ONCEFLOW_PROCESSOR_MAX_COMMAND_BYTES)")
	fs.StringVar(&c.ProjectorSessionTimeout, "projector-session-timeout", env("ONCEFLOW_PROJECTOR_SESSION_TIMEOUT", projector.DefaultSessionTimeout.String()), "projector group session timeout: how long a dead projector keeps its partitions (ONCEFLOW_PROJECTOR_SESSION_TIMEOUT)")
	parallelism := envInt("ONCEFLOW_PROJECTOR_PARALLELISM", projector.DefaultParallelism)
	fs.IntVar(&c.ProjectorParallelism, "projector-parallelism", parallelism, "transactions a projector runs at once over disjoint partitions of a batch (ONCEFLOW_PROJECTOR_PARALLELISM)")
	fs.BoolVar(&c.ProjectorSyncCommit, "projector-synchronous-commit", envBool("ONCEFLOW_PROJECTOR_SYNCHRONOUS_COMMIT"), "each projector batch's commit waits for its WAL flush; by default batches commit asynchronously and a database crash's lost ones are read again (ONCEFLOW_PROJECTOR_SYNCHRONOUS_COMMIT)")
	fs.StringVar(&c.RelayLease, "relay-lease", env("ONCEFLOW_RELAY_LEASE", relay.DefaultLeaseDuration.String()), "relay shard lease period: a silent relay's shards move to the others after it (ONCEFLOW_RELAY_LEASE)")
	batch := envInt("ONCEFLOW_RELAY_BATCH_SIZE", relay.DefaultBatchSize)
	fs.IntVar(&c.RelayBatchSize, "relay-batch-size", batch, "outbox rows per relay Kafka transaction (ONCEFLOW_RELAY_BATCH_SIZE)")
	fs.StringVar(&c.IdempotencyRetention, "idempotency-retention", env("ONCEFLOW_IDEMPOTENCY_RETENTION", pipeline.DefaultIdempotencyRetention.String()), "how long ingest remembers an Idempotency-Key; the relay's janitor drops older partitions; give every ingest and relay the same (ONCEFLOW_IDEMPOTENCY_RETENTION)")
	fs.StringVar(&c.TenantRateLimit, "tenant-rate-limit", env("ONCEFLOW_TENANT_RATE_LIMIT", strconv.Itoa(ingest.DefaultRateLimit)), "requests per second each tenant may send to one ingest process, bursts up to twice that; above it 429 (ONCEFLOW_TENANT_RATE_LIMIT; 0 or less: no limit)")
	fs.StringVar(&c.InboundConfig, "inbound-config", env("ONCEFLOW_INBOUND_CONFIG", ""), "JSON `file` of the webhook providers ingest accepts at POST /v1/inbound/{provider} (docs/inbound.md); secrets may stay in the environment (secrets_env) (ONCEFLOW_INBOUND_CONFIG)")
	fs.StringVar(&c.InboundRetention, "inbound-retention", env("ONCEFLOW_INBOUND_RETENTION", ingest.DefaultInboundRetention.String()), "how long ingest remembers a provider's event ids; longer than any provider retries (ONCEFLOW_INBOUND_RETENTION)")
	fs.StringVar(&c.ReconcileInterval, "reconcile-interval", env("ONCEFLOW_RECONCILE_INTERVAL", ""), "how often the relay runs onceflow reconcile with the domains' authorities, logging what it finds (docs/operations.md#reconcile); empty or 0: never (ONCEFLOW_RECONCILE_INTERVAL)")
	fs.StringVar(&c.LagExport, "lag-export", env("ONCEFLOW_LAG_EXPORT", ""), "which consumers' lag to export on /metrics: own (this process's; the components' default), cluster (every group and Postgres consumer, once per cluster; onceflow dev's default) or off (ONCEFLOW_LAG_EXPORT)")
	fs.StringVar(&c.WorkerQueue, "worker-queue", env("ONCEFLOW_WORKER_QUEUE", jobs.DefaultQueue), "River queue of onceflow's jobs; give the projectors and workers the same (ONCEFLOW_WORKER_QUEUE)")
	workers := envInt("ONCEFLOW_WORKER_MAX_WORKERS", jobs.DefaultMaxWorkers)
	fs.IntVar(&c.WorkerMaxWorkers, "worker-max-workers", workers, "jobs a worker process runs at once (ONCEFLOW_WORKER_MAX_WORKERS)")
	fs.StringVar(&c.WorkerLease, "worker-lease", env("ONCEFLOW_WORKER_LEASE", jobs.DefaultLease.String()), "how long a job attempt may run before River's rescuer gives the job to another worker (ONCEFLOW_WORKER_LEASE)")
	fs.StringVar(&c.WorkerAttemptTimeout, "worker-attempt-timeout", env("ONCEFLOW_WORKER_ATTEMPT_TIMEOUT", ""), "bound of one job attempt, below the lease; empty: half the lease (ONCEFLOW_WORKER_ATTEMPT_TIMEOUT)")
	attempts := envInt("ONCEFLOW_WORKER_MAX_ATTEMPTS", jobs.DefaultMaxAttempts)
	fs.IntVar(&c.WorkerMaxAttempts, "worker-max-attempts", attempts, "attempts of a job before it is discarded with its errors kept (ONCEFLOW_WORKER_MAX_ATTEMPTS)")
	fs.StringVar(&c.WorkerBaseDelay, "worker-base-delay", env("ONCEFLOW_WORKER_BASE_DELAY", jobs.DefaultBaseDelay.String()), "first retry's largest wait; doubles per attempt, full jitter (ONCEFLOW_WORKER_BASE_DELAY)")
	fs.StringVar(&c.WorkerMaxDelay, "worker-max-delay", env("ONCEFLOW_WORKER_MAX_DELAY", jobs.DefaultMaxDelay.String()), "largest wait before a retry, unless the receiver's Retry-After asks for more (ONCEFLOW_WORKER_MAX_DELAY)")
	fs.StringVar(&c.WebhookTimeout, "webhook-timeout", env("ONCEFLOW_WEBHOOK_TIMEOUT", webhooks.DefaultTimeout.String()), "bound of one webhook request, connect to last byte (ONCEFLOW_WEBHOOK_TIMEOUT)")
	fs.StringVar(&c.WebhookAllowNetworks, "webhook-allow-networks", env("ONCEFLOW_WEBHOOK_ALLOW_NETWORKS", ""), "networks (CIDR, comma separated) webhooks may reach although they are loopback, private or link-local (ONCEFLOW_WEBHOOK_ALLOW_NETWORKS)")
	failures := envInt("ONCEFLOW_WEBHOOK_BREAKER_FAILURES", webhooks.DefaultBreakerFailures)
	fs.IntVar(&c.WebhookBreakerFailures, "webhook-breaker-failures", failures, "failures in a row that open an endpoint's circuit breaker (ONCEFLOW_WEBHOOK_BREAKER_FAILURES)")
	fs.StringVar(&c.WebhookBreakerCooldown, "webhook-breaker-cooldown", env("ONCEFLOW_WEBHOOK_BREAKER_COOLDOWN", webhooks.DefaultBreakerCooldown.String()), "how long an open breaker holds an endpoint's deliveries (ONCEFLOW_WEBHOOK_BREAKER_COOLDOWN)")
	perTenant := envInt("ONCEFLOW_WEBHOOK_MAX_PER_TENANT", webhooks.DefaultMaxPerTenant)
	fs.IntVar(&c.WebhookMaxPerTenant, "webhook-max-per-tenant", perTenant, "deliveries of one tenant a worker process runs at once (ONCEFLOW_WEBHOOK_MAX_PER_TENANT)")
	fs.StringVar(&c.Brokers, "kafka-brokers", env("KAFKA_BROKERS", "127.0.0.1:9092"), "Kafka seed brokers, comma separated (KAFKA_BROKERS)")
	secretVar(fs, &c.DatabaseURL, "database-url", "DATABASE_URL", getenv, &c.envErrs, "Postgres `URL`; use sslmode=verify-full with sslrootcert across a network (docs/security.md)")
	secretVar(fs, &c.DatabaseMigrationURL, "database-migration-url", "DATABASE_MIGRATION_URL", getenv, &c.envErrs, "Postgres `URL` of the role that owns the tables and migrates them; DATABASE_URL is then the runtime role (docs/security.md#database-roles)")
	maxConns := envInt("DATABASE_MAX_CONNS", onceflow.DefaultDatabaseMaxConns)
	fs.IntVar(&c.DatabaseMaxConns, "database-max-conns", maxConns, "Postgres connections each component's pool may open; every process holds up to this many (DATABASE_MAX_CONNS)")
	fs.StringVar(&c.TrustedProxies, "trusted-proxies", env("ONCEFLOW_TRUSTED_PROXIES", ""), "networks (CIDR, comma separated) of the load balancers in front of ingest: from them X-Forwarded-For names the client whose failed authentications are limited (ONCEFLOW_TRUSTED_PROXIES)")
	secretVar(fs, &c.SchemaRegistryURL, "schema-registry-url", "SCHEMA_REGISTRY_URL", getenv, &c.envErrs, "Confluent-compatible schema registry `URL`, with user:password@ for basic auth if you like; empty uses the embedded registry")
	fs.StringVar(&c.SchemaRegistryUser, "schema-registry-user", env("SCHEMA_REGISTRY_USER", ""), "schema registry basic auth user; wins over the URL's (SCHEMA_REGISTRY_USER)")
	secretVar(fs, &c.SchemaRegistryPassword, "schema-registry-password", "SCHEMA_REGISTRY_PASSWORD", getenv, &c.envErrs, "schema registry basic auth `password`")
	fs.StringVar(&c.SchemaRegistryCAFile, "schema-registry-ca-file", env("SCHEMA_REGISTRY_CA_FILE", ""), "extra CA bundle (PEM) for an https schema registry (SCHEMA_REGISTRY_CA_FILE)")
	fs.StringVar(&c.TopicPrefix, "topic-prefix", env("ONCEFLOW_TOPIC_PREFIX", ""), "the topic prefix of a deployment of one domain; empty: the domain's name (ONCEFLOW_TOPIC_PREFIX)")
	parts := envInt("ONCEFLOW_PARTITIONS", kafka.DefaultPartitions)
	fs.IntVar(&c.Partitions, "partitions", parts, "partitions of topics created at start (ONCEFLOW_PARTITIONS)")
	fs.StringVar(&c.HTTPAddr, "http-addr", env("HTTP_ADDR", ":8080"), "ingest HTTP address (HTTP_ADDR)")
	fs.StringVar(&c.AdminAddr, "admin-addr", env("ADMIN_ADDR", ""), "metrics and health address; empty is :9090, or 127.0.0.1:9090 in onceflow dev (ADMIN_ADDR)")
	secretVar(fs, &c.AdminToken, "admin-token", "ONCEFLOW_ADMIN_TOKEN", getenv, &c.envErrs, "bearer `token` the admin routes that act require; unset, they are disabled")
	fs.StringVar(&c.LogLevel, "log-level", env("LOG_LEVEL", "info"), "debug, info, warn or error (LOG_LEVEL)")
	fs.StringVar(&c.LogFormat, "log-format", env("LOG_FORMAT", "text"), "text or json (LOG_FORMAT)")
	host, _ := os.Hostname()
	fs.StringVar(&c.InstanceID, "instance-id", env("ONCEFLOW_INSTANCE_ID", host), "stable unique id of this instance; the processor's transactional id ends in it (ONCEFLOW_INSTANCE_ID)")
	shards := envInt("ONCEFLOW_OUTBOX_SHARDS", pipeline.DefaultOutboxShards)
	fs.IntVar(&c.OutboxShards, "outbox-shards", shards, "outbox shards; every ingest and relay must use the same count (ONCEFLOW_OUTBOX_SHARDS)")
	fs.StringVar(&c.SASLMechanism, "kafka-sasl-mechanism", env("KAFKA_SASL_MECHANISM", ""), "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (KAFKA_SASL_MECHANISM)")
	fs.StringVar(&c.SASLUser, "kafka-sasl-user", env("KAFKA_SASL_USER", ""), "SASL user (KAFKA_SASL_USER)")
	secretVar(fs, &c.SASLPassword, "kafka-sasl-password", "KAFKA_SASL_PASSWORD", getenv, &c.envErrs, "SASL `password`")
	fs.BoolVar(&c.TLS, "kafka-tls", envBool("KAFKA_TLS"), "connect to Kafka over TLS (KAFKA_TLS=true)")
	fs.BoolVar(&c.AllowPlaintextSASL, "kafka-allow-plaintext-sasl", envBool("KAFKA_ALLOW_PLAINTEXT_SASL"), "let SASL run without TLS, on a network you trust (KAFKA_ALLOW_PLAINTEXT_SASL=true)")
	fs.StringVar(&c.TLSCAFile, "kafka-tls-ca-file", env("KAFKA_TLS_CA_FILE", ""), "extra CA bundle for Kafka TLS (KAFKA_TLS_CA_FILE)")
	return c
}

// Logger builds the process logger; each component adds its own
// component attribute.
func (c *Common) Logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return nil, fmt.Errorf("LOG_LEVEL %q: want debug, info, warn or error", c.LogLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	switch strings.ToLower(c.LogFormat) {
	case "text", "":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, fmt.Errorf("LOG_FORMAT %q: want text or json", c.LogFormat)
	}
	return slog.New(h), nil
}

// Stack returns the stack configuration.
func (c *Common) Stack(logger *slog.Logger) (onceflow.Config, error) {
	if err := errors.Join(c.envErrs...); err != nil {
		return onceflow.Config{}, err
	}
	if c.Partitions < 1 {
		return onceflow.Config{}, fmt.Errorf("partitions must be positive, got %d", c.Partitions)
	}
	k := kafka.Config{
		Brokers:       kafka.ParseBrokers(c.Brokers),
		SASLMechanism: c.SASLMechanism,
		SASLUser:      c.SASLUser,
		SASLPassword:  c.SASLPassword,
		TLS:           c.TLS,
		TLSCAFile:     c.TLSCAFile,
		Logger:        logger,

		AllowPlaintextSASL: c.AllowPlaintextSASL,
	}
	if len(k.Brokers) == 0 {
		return onceflow.Config{}, fmt.Errorf("KAFKA_BROKERS is empty")
	}
	if c.OutboxShards < 1 {
		return onceflow.Config{}, fmt.Errorf("ONCEFLOW_OUTBOX_SHARDS must be positive, got %d", c.OutboxShards)
	}
	if c.DatabaseMaxConns < 1 || c.DatabaseMaxConns > math.MaxInt32 {
		return onceflow.Config{}, fmt.Errorf("DATABASE_MAX_CONNS must be positive, got %d", c.DatabaseMaxConns)
	}
	retention, err := time.ParseDuration(c.IdempotencyRetention)
	if err != nil || retention < time.Minute {
		return onceflow.Config{}, fmt.Errorf("ONCEFLOW_IDEMPOTENCY_RETENTION %q: want a duration of at least 1m, like 24h", c.IdempotencyRetention)
	}
	rate, err := strconv.ParseFloat(c.TenantRateLimit, 64)
	if err != nil {
		return onceflow.Config{}, fmt.Errorf("ONCEFLOW_TENANT_RATE_LIMIT %q: want requests per second, like 1000", c.TenantRateLimit)
	}
	if rate <= 0 {
		rate = -1 // no limit
	}
	return onceflow.Config{
		Domains:     c.domains,
		Kafka:       k,
		Topics:      kafka.Topics{Prefix: c.TopicPrefix, Partitions: int32(c.Partitions), DedupRetention: c.dedupRetention()},
		DatabaseURL: c.DatabaseURL,

		DatabaseMigrationURL: c.DatabaseMigrationURL,
		DatabaseMaxConns:     int32(c.DatabaseMaxConns),
		SchemaRegistry: avro.ClientConfig{
			URL: c.SchemaRegistryURL, User: c.SchemaRegistryUser, Password: c.SchemaRegistryPassword, CAFile: c.SchemaRegistryCAFile,
		},
		InstanceID:   c.InstanceID,
		Logger:       logger,
		OutboxShards: c.OutboxShards,

		IdempotencyRetention: retention,
		TenantRateLimit:      rate,
	}, nil
}

// dedupRetention is the retention of the processor's dedup changelog: the
// dedup window and a day for clocks that disagree (0, the default, when
// the window does not parse: Processor reports that).
func (c *Common) dedupRetention() time.Duration {
	window, err := time.ParseDuration(c.DedupWindow)
	if err != nil || window <= 0 {
		return 0
	}
	return window + kafka.DedupRetentionSlack
}

// Processor returns the processor settings.
func (c *Common) Processor() (processor.Config, error) {
	window, err := time.ParseDuration(c.DedupWindow)
	if err != nil || window <= 0 {
		return processor.Config{}, fmt.Errorf("ONCEFLOW_DEDUP_WINDOW %q: want a positive duration like 168h", c.DedupWindow)
	}
	session, err := time.ParseDuration(c.ProcessorSessionTimeout)
	if err != nil || session <= 0 {
		return processor.Config{}, fmt.Errorf("ONCEFLOW_PROCESSOR_SESSION_TIMEOUT %q: want a positive duration like 10s", c.ProcessorSessionTimeout)
	}
	var skew time.Duration
	if c.ProcessorMaxClockSkew != "" {
		if skew, err = time.ParseDuration(c.ProcessorMaxClockSkew); err != nil || skew <= 0 {
			return processor.Config{}, fmt.Errorf("ONCEFLOW_PROCESSOR_MAX_CLOCK_SKEW %q: want a positive duration like 15m", c.ProcessorMaxClockSkew)
		}
	}
	if c.ProcessorMaxCommandBytes < 0 {
		return processor.Config{}, fmt.Errorf("ONCEFLOW_PROCESSOR_MAX_COMMAND_BYTES %d: want a size in bytes, or 0 for 1 MiB", c.ProcessorMaxCommandBytes)
	}
	return processor.Config{DedupWindow: window, SessionTimeout: session, MaxClockSkew: skew, MaxCommandBytes: c.ProcessorMaxCommandBytes}, nil
}

// Relay returns the relay's settings.
func (c *Common) Relay() (relay.Config, error) {
	lease, err := time.ParseDuration(c.RelayLease)
	if err != nil || lease <= 0 {
		return relay.Config{}, fmt.Errorf("ONCEFLOW_RELAY_LEASE %q: want a positive duration like 10s", c.RelayLease)
	}
	if c.RelayBatchSize < 1 {
		return relay.Config{}, fmt.Errorf("ONCEFLOW_RELAY_BATCH_SIZE %d: want 1 or more", c.RelayBatchSize)
	}
	return relay.Config{LeaseDuration: lease, BatchSize: c.RelayBatchSize}, nil
}

// runComponent runs components of domains with the common flags (a
// component binary's main, or the component subcommands of Main).
func runComponent(ctx context.Context, name string, components onceflow.Components, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stdout)
	c := Register(fs, getenv)
	c.domains = domains
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	logger, err := c.Logger(stdout)
	if err != nil {
		return err
	}
	cfg, err := c.Stack(logger)
	if err != nil {
		return err
	}
	pcfg, err := c.Processor()
	if err != nil {
		return err
	}
	prcfg, err := c.projector(getenv)
	if err != nil {
		return err
	}
	rcfg, err := c.Relay()
	if err != nil {
		return err
	}
	icfg, err := c.ingest(getenv)
	if err != nil {
		return err
	}
	var rec reconcile.Config
	if c.ReconcileInterval != "" {
		if rec.Interval, err = time.ParseDuration(c.ReconcileInterval); err != nil || rec.Interval < 0 {
			return fmt.Errorf("ONCEFLOW_RECONCILE_INTERVAL %q: want a duration like 5m, or 0 for never", c.ReconcileInterval)
		}
	}
	wcfg, hcfg, err := c.Worker()
	if err != nil {
		return err
	}
	return onceflow.RunComponents(ctx, onceflow.RunConfig{Config: cfg, Components: components, HTTPAddr: c.HTTPAddr, AdminAddr: c.AdminAddr,
		AdminToken: c.AdminToken, Ingest: icfg, Processor: pcfg, Projector: prcfg, Relay: rcfg, LagExport: c.LagExport, Reconcile: rec,
		Worker: wcfg, Webhooks: hcfg})
}

// Worker returns the worker's settings and its webhook deliveries'.
func (c *Common) Worker() (jobs.Config, webhooks.Config, error) {
	var errs []error
	dur := func(name, v string, emptyOK bool) time.Duration {
		if v == "" && emptyOK {
			return 0
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("%s %q: want a positive duration like 30s", name, v))
		}
		return d
	}
	w := jobs.Config{
		Queue:          c.WorkerQueue,
		MaxWorkers:     c.WorkerMaxWorkers,
		Lease:          dur("ONCEFLOW_WORKER_LEASE", c.WorkerLease, false),
		AttemptTimeout: dur("ONCEFLOW_WORKER_ATTEMPT_TIMEOUT", c.WorkerAttemptTimeout, true),
		MaxAttempts:    c.WorkerMaxAttempts,
		BaseDelay:      dur("ONCEFLOW_WORKER_BASE_DELAY", c.WorkerBaseDelay, false),
		MaxDelay:       dur("ONCEFLOW_WORKER_MAX_DELAY", c.WorkerMaxDelay, false),
	}
	if c.WorkerMaxWorkers < 1 {
		errs = append(errs, fmt.Errorf("ONCEFLOW_WORKER_MAX_WORKERS %d: want 1 or more", c.WorkerMaxWorkers))
	}
	if c.WorkerMaxAttempts < 1 || c.WorkerMaxAttempts > 1000 {
		errs = append(errs, fmt.Errorf("ONCEFLOW_WORKER_MAX_ATTEMPTS %d: want 1 to 1000", c.WorkerMaxAttempts))
	}
	h := webhooks.Config{
		Timeout:         dur("ONCEFLOW_WEBHOOK_TIMEOUT", c.WebhookTimeout, false),
		BreakerFailures: c.WebhookBreakerFailures,
		BreakerCooldown: dur("ONCEFLOW_WEBHOOK_BREAKER_COOLDOWN", c.WebhookBreakerCooldown, false),
		MaxPerTenant:    c.WebhookMaxPerTenant,
	}
	for _, s := range strings.Split(c.WebhookAllowNetworks, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("ONCEFLOW_WEBHOOK_ALLOW_NETWORKS %q: want networks like 10.0.0.0/8, comma separated", c.WebhookAllowNetworks))
			break
		}
		h.Allow = append(h.Allow, p.Masked())
	}
	if c.WebhookBreakerFailures < 1 {
		errs = append(errs, fmt.Errorf("ONCEFLOW_WEBHOOK_BREAKER_FAILURES %d: want 1 or more", c.WebhookBreakerFailures))
	}
	if c.WebhookMaxPerTenant < 1 {
		errs = append(errs, fmt.Errorf("ONCEFLOW_WEBHOOK_MAX_PER_TENANT %d: want 1 or more", c.WebhookMaxPerTenant))
	}
	if err := errors.Join(errs...); err != nil {
		return jobs.Config{}, webhooks.Config{}, err
	}
	attempt := w.AttemptTimeout
	if attempt == 0 {
		attempt = w.Lease / 2 // jobs.Config's default
	}
	if attempt >= w.Lease {
		return jobs.Config{}, webhooks.Config{}, fmt.Errorf("ONCEFLOW_WORKER_ATTEMPT_TIMEOUT %s: want less than ONCEFLOW_WORKER_LEASE (%s)", attempt, w.Lease)
	}
	if h.Timeout >= attempt {
		return jobs.Config{}, webhooks.Config{}, fmt.Errorf("ONCEFLOW_WEBHOOK_TIMEOUT %s: want less than the attempt timeout (%s: ONCEFLOW_WORKER_ATTEMPT_TIMEOUT, half of ONCEFLOW_WORKER_LEASE by default)", h.Timeout, attempt)
	}
	return w, h, nil
}

// ingest returns ingest's own settings: the trusted proxies and the
// inbound providers (their file, with secrets from getenv).
func (c *Common) ingest(getenv func(string) string) (ingest.Config, error) {
	var cfg ingest.Config
	if c.InboundConfig != "" {
		b, err := os.ReadFile(c.InboundConfig) // #nosec G703 G304 -- the operator names the file (ONCEFLOW_INBOUND_CONFIG)
		if err != nil {
			return ingest.Config{}, fmt.Errorf("ONCEFLOW_INBOUND_CONFIG: %w", err)
		}
		if cfg.Providers, err = ingest.ParseProviders(b, getenv); err != nil {
			return ingest.Config{}, fmt.Errorf("ONCEFLOW_INBOUND_CONFIG %s: %w", c.InboundConfig, err)
		}
	}
	d, err := time.ParseDuration(c.InboundRetention)
	if err != nil || d < time.Hour {
		return ingest.Config{}, fmt.Errorf("ONCEFLOW_INBOUND_RETENTION %q: want a duration of an hour or more, like 720h", c.InboundRetention)
	}
	cfg.InboundRetention = d
	if prefix := getenv(ingest.InboundHoldEnv); prefix != "" {
		cfg.AfterInbound = ingest.HoldInbound(prefix)
	}
	for _, s := range strings.Split(c.TrustedProxies, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return ingest.Config{}, fmt.Errorf("ONCEFLOW_TRUSTED_PROXIES %q: want networks like 10.0.0.0/8, comma separated", c.TrustedProxies)
		}
		cfg.TrustedProxies = append(cfg.TrustedProxies, p.Masked())
	}
	return cfg, nil
}

// projector returns the projector's settings. It also installs the
// projector's test-only crash-point hook when
// ONCEFLOW_TEST_PROJECTOR_HOLD_DIR names a directory (see projector.Hold);
// unset, as in production, the projector runs without it.
func (c *Common) projector(getenv func(string) string) (projector.Config, error) {
	session, err := time.ParseDuration(c.ProjectorSessionTimeout)
	if err != nil || session <= 0 {
		return projector.Config{}, fmt.Errorf("ONCEFLOW_PROJECTOR_SESSION_TIMEOUT %q: want a positive duration like 10s", c.ProjectorSessionTimeout)
	}
	if c.ProjectorParallelism < 1 {
		return projector.Config{}, fmt.Errorf("ONCEFLOW_PROJECTOR_PARALLELISM %d: want 1 or more", c.ProjectorParallelism)
	}
	pc := projector.Config{SessionTimeout: session, Parallelism: c.ProjectorParallelism, SynchronousCommit: c.ProjectorSyncCommit}
	if dir := getenv(projector.HoldEnv); dir != "" {
		pc.Hold = projector.HoldInDir(dir)
	}
	return pc, nil
}

// mainWith is the main of every onceflow binary: run gets a context that
// ends on SIGINT or SIGTERM, the arguments and the environment. An error
// is printed after name and exits 1; -h exits 0 after the usage.
func mainWith(name string, run func(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}

// ComponentMain is the main of a binary that runs components of domains
// with the common flags only (cmd/ingest and the others): Main's
// `ingest`, `relay`, `processor` or `projector` as a binary of its own.
func ComponentMain(name string, components onceflow.Components, domains ...*onceflow.Domain) {
	mainWith(name, func(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
		return runComponent(ctx, name, components, domains, args, getenv, stdout)
	})
}
