package command

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/ingest"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/natsink"
	"github.com/onceflow/onceflow/pipeline/processor"
	"github.com/onceflow/onceflow/pipeline/projector"
	"github.com/onceflow/onceflow/pipeline/relay"
	"github.com/onceflow/onceflow/pipeline/webhooks"
)

// Every setting of onceflow, by section (docs/architecture.md#configuration).
// The lists at the end say which command uses which.

var (
	kafkaSection     = &section{title: "Kafka", check: decompressBound}
	registrySection  = &section{title: "Schema registry"}
	postgresSection  = &section{title: "Postgres"}
	topicsSection    = &section{title: "Topics"}
	processSection   = &section{title: "This process"}
	loggingSection   = &section{title: "Logging", check: buildLogger}
	tracingSection   = &section{title: "Tracing (OpenTelemetry)"}
	outboxSection    = &section{title: "Outbox (ingest and relay)"}
	ingestSection    = &section{title: "Ingest", check: ingestHooks}
	relaySection     = &section{title: "Relay"}
	processorSection = &section{title: "Processor"}
	projectorSection = &section{title: "Projector", check: projectorHooks}
	workerSection    = &section{title: "Worker (jobs)", check: checkAttempt}
	webhooksSection  = &section{title: "Webhook deliveries", check: checkWebhookTimeout}
	natsinkSection   = &section{title: "NATS sink", check: natsinkHooks}
	devSection       = &section{title: "Embedded default (dev)"}
)

// Kafka.
var (
	kafkaBrokers = &setting{flag: "kafka-brokers", env: "KAFKA_BROKERS", def: "127.0.0.1:9092", kind: "string", section: kafkaSection,
		help: "Kafka seed brokers, comma separated",
		set: func(c *config, v string) error {
			if c.Kafka.Brokers = kafka.ParseBrokers(v); len(c.Kafka.Brokers) == 0 {
				return errors.New("want host:port, comma separated")
			}
			return nil
		}}
	kafkaSASLMechanism = &setting{flag: "kafka-sasl-mechanism", env: "KAFKA_SASL_MECHANISM", kind: "string", section: kafkaSection,
		help: "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
		set:  func(c *config, v string) error { c.Kafka.SASLMechanism = v; return nil }}
	kafkaSASLUser = &setting{flag: "kafka-sasl-user", env: "KAFKA_SASL_USER", kind: "string", section: kafkaSection,
		help: "SASL user",
		set:  func(c *config, v string) error { c.Kafka.SASLUser = v; return nil }}
	kafkaSASLPassword = &setting{flag: "kafka-sasl-password", env: "KAFKA_SASL_PASSWORD", secret: true, section: kafkaSection,
		help: "SASL `password`",
		set:  func(c *config, v string) error { c.Kafka.SASLPassword = v; return nil }}
	kafkaTLS = &setting{flag: "kafka-tls", env: "KAFKA_TLS", def: "false", kind: "bool", section: kafkaSection,
		help: "connect to Kafka over TLS",
		set:  func(c *config, v string) (err error) { c.Kafka.TLS, err = boolean(v); return err }}
	kafkaTLSCAFile = &setting{flag: "kafka-tls-ca-file", env: "KAFKA_TLS_CA_FILE", kind: "string", section: kafkaSection,
		help: "extra CA bundle for Kafka TLS",
		set:  func(c *config, v string) error { c.Kafka.TLSCAFile = v; return nil }}
	kafkaAllowPlaintextSASL = &setting{flag: "kafka-allow-plaintext-sasl", env: "KAFKA_ALLOW_PLAINTEXT_SASL", def: "false", kind: "bool", section: kafkaSection,
		help: "let SASL run without TLS, on a network you trust",
		set:  func(c *config, v string) (err error) { c.Kafka.AllowPlaintextSASL, err = boolean(v); return err }}
	kafkaMaxDecompressBatchBytes = &setting{flag: "kafka-max-decompress-batch-bytes", env: "KAFKA_MAX_DECOMPRESS_BATCH_BYTES", def: "0", kind: "int", section: kafkaSection,
		help: "largest size a fetched record batch may decompress to; a larger one stops its partition until an operator skips it (docs/security.md); 0: sixteen of the largest commands the processor takes, at least 16 MiB",
		set: func(c *config, v string) (err error) {
			if c.Kafka.MaxDecompressBatchBytes, err = atLeast(v, 0); err != nil {
				return errors.New("want a size in bytes, or 0 for the default")
			}
			return nil
		}}
	kafkaMaxDecompressPollBytes = &setting{flag: "kafka-max-decompress-poll-bytes", env: "KAFKA_MAX_DECOMPRESS_POLL_BYTES", def: "0", kind: "int", section: kafkaSection,
		help: "most a consumer decompresses between two polls, all batches together; a batch past it waits for the next poll (docs/security.md); 0: twice the bound of one batch",
		set: func(c *config, v string) (err error) {
			if c.Kafka.MaxDecompressPollBytes, err = atLeast(v, 0); err != nil {
				return errors.New("want a size in bytes, or 0 for the default")
			}
			return nil
		}}
)

// decompressBound sets the decompression bound unless given: sixteen of
// the largest commands the processor takes (ONCEFLOW_PROCESSOR_MAX_COMMAND_BYTES,
// when the command reads it), at least 16 MiB.
func decompressBound(c *config) error {
	if c.Kafka.MaxDecompressBatchBytes == 0 {
		c.Kafka.MaxDecompressBatchBytes = kafka.MaxDecompressBatchBytesFor(c.Processor.MaxCommandBytes)
	}
	return nil
}

// The schema registry.
var (
	registryURL = &setting{flag: "schema-registry-url", env: "SCHEMA_REGISTRY_URL", secret: true, section: registrySection,
		help: "Confluent-compatible schema registry `URL`, with user:password@ for basic auth if you like; empty uses the embedded registry",
		set:  func(c *config, v string) error { c.SchemaRegistry.URL = v; return nil }}
	registryUser = &setting{flag: "schema-registry-user", env: "SCHEMA_REGISTRY_USER", kind: "string", section: registrySection,
		help: "schema registry basic auth user; wins over the URL's",
		set:  func(c *config, v string) error { c.SchemaRegistry.User = v; return nil }}
	registryPassword = &setting{flag: "schema-registry-password", env: "SCHEMA_REGISTRY_PASSWORD", secret: true, section: registrySection,
		help: "schema registry basic auth `password`",
		set:  func(c *config, v string) error { c.SchemaRegistry.Password = v; return nil }}
	registryCAFile = &setting{flag: "schema-registry-ca-file", env: "SCHEMA_REGISTRY_CA_FILE", kind: "string", section: registrySection,
		help: "extra CA bundle (PEM) for an https schema registry",
		set:  func(c *config, v string) error { c.SchemaRegistry.CAFile = v; return nil }}
)

// Postgres.
var (
	databaseURL = &setting{flag: "database-url", env: "DATABASE_URL", secret: true, section: postgresSection,
		help: "Postgres `URL`; use sslmode=verify-full with sslrootcert across a network (docs/security.md)",
		set:  func(c *config, v string) error { c.DatabaseURL = v; return nil }}
	databaseMigrationURL = &setting{flag: "database-migration-url", env: "DATABASE_MIGRATION_URL", secret: true, section: postgresSection,
		help: "Postgres `URL` of the role that owns the tables and migrates them; DATABASE_URL is then the runtime role (docs/security.md#database-roles)",
		set:  func(c *config, v string) error { c.DatabaseMigrationURL = v; return nil }}
	databaseMaxConns = &setting{flag: "database-max-conns", env: "DATABASE_MAX_CONNS", def: strconv.Itoa(onceflow.DefaultDatabaseMaxConns), kind: "int", section: postgresSection,
		help: "Postgres connections each component's pool may open; every process holds up to this many",
		set: func(c *config, v string) error {
			n, err := atLeast(v, 1)
			if n > math.MaxInt32 {
				return errors.New("want 1 to 2147483647")
			}
			c.DatabaseMaxConns = int32(n)
			return err
		}}
)

// Topics.
var (
	topicPrefix = &setting{flag: "topic-prefix", env: "ONCEFLOW_TOPIC_PREFIX", kind: "string", section: topicsSection,
		help: "the topic prefix of a deployment of one domain; empty: the domain's name",
		set:  func(c *config, v string) error { c.Topics.Prefix = v; return nil }}
	partitions = &setting{flag: "partitions", env: "ONCEFLOW_PARTITIONS", def: strconv.Itoa(kafka.DefaultPartitions), kind: "int", section: topicsSection,
		help: "partitions of topics created at start",
		set: func(c *config, v string) error {
			n, err := atLeast(v, 1)
			c.Topics.Partitions = int32(min(n, math.MaxInt32))
			return err
		}}
	// The dedup window is the processor's, and its dedup topic's retention
	// (a day more, for clocks that disagree), which every component that
	// creates the topics sets.
	dedupWindow = &setting{flag: "dedup-window", env: "ONCEFLOW_DEDUP_WINDOW", def: processor.DefaultDedupWindow.String(), kind: "duration", section: topicsSection,
		help: "how long the processor remembers a command id after handling it; at least the commands topic's retention; its dedup topic keeps a day more",
		set: func(c *config, v string) (err error) {
			c.Processor.DedupWindow, err = positive(v, "168h")
			c.Topics.DedupRetention = c.Processor.DedupWindow + kafka.DedupRetentionSlack
			return err
		}}
)

// This process: where it listens, who may act on it, how it is known.
var (
	adminAddr = &setting{flag: "admin-addr", env: "ADMIN_ADDR", kind: "string", section: processSection,
		help: "metrics, health and status page address, answering without credentials; empty is 127.0.0.1:9090 (loopback only): name an interface Prometheus and probes reach, like :9090 or a private address",
		set:  func(c *config, v string) error { c.AdminAddr = v; return nil }}
	adminToken = &setting{flag: "admin-token", env: "ONCEFLOW_ADMIN_TOKEN", secret: true, section: processSection,
		help: "bearer `token` the admin routes that act require; unset, they are disabled",
		set:  func(c *config, v string) error { c.AdminToken = v; return nil }}
	instanceID = &setting{flag: "instance-id", env: "ONCEFLOW_INSTANCE_ID", def: hostname(), kind: "string", section: processSection,
		help: "stable unique id of this instance; the processor's transactional id ends in it",
		set:  func(c *config, v string) error { c.InstanceID = v; return nil }}
	lagExport = &setting{flag: "lag-export", env: "ONCEFLOW_LAG_EXPORT", kind: "string", section: processSection,
		help: "which consumers' lag to export on /metrics: own (this process's; the components' default), cluster (every group and Postgres consumer, once per cluster; onceflow dev's default) or off",
		set: func(c *config, v string) error {
			switch v {
			case "", onceflow.LagExportOwn, onceflow.LagExportCluster, onceflow.LagExportOff:
				c.LagExport = v
				return nil
			}
			return errors.New("want own, cluster or off")
		}}
)

// Logging.
var (
	logLevel = &setting{flag: "log-level", env: "LOG_LEVEL", def: "info", kind: "string", section: loggingSection,
		help: "debug, info, warn or error",
		set:  func(c *config, v string) error { c.logLevel = v; return nil }}
	// The collector is the standard variables'; the SDK reads the other
	// OTEL_* variables itself (docs/observability.md).
	otlpEndpoint = &setting{flag: "otlp-endpoint", env: "OTEL_EXPORTER_OTLP_ENDPOINT", kind: "url", section: tracingSection,
		help: "base URL of the OTLP/HTTP collector the process exports its spans to, at its /v1/traces (http://127.0.0.1:4318); unset, and OTEL_EXPORTER_OTLP_TRACES_ENDPOINT too, no spans are made",
		set:  func(c *config, v string) (err error) { c.otlpEndpoint, err = httpURL(v); return err }}
	otlpTracesEndpoint = &setting{flag: "otlp-traces-endpoint", env: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", kind: "url", section: tracingSection,
		help: "URL the spans are posted to, as it is (http://127.0.0.1:4318/v1/traces); wins over OTEL_EXPORTER_OTLP_ENDPOINT",
		set:  func(c *config, v string) (err error) { c.otlpTracesEndpoint, err = httpURL(v); return err }}
	logFormat = &setting{flag: "log-format", env: "LOG_FORMAT", def: "text", kind: "string", section: loggingSection,
		help: "text or json",
		set:  func(c *config, v string) error { c.logFormat = v; return nil }}
)

// The outbox, which ingest writes and the relay ships: both must agree.
var (
	outboxShards = &setting{flag: "outbox-shards", env: "ONCEFLOW_OUTBOX_SHARDS", def: strconv.Itoa(pipeline.DefaultOutboxShards), kind: "int", section: outboxSection,
		help: "outbox shards, 1 to " + strconv.Itoa(pipeline.MaxOutboxShards) + "; every ingest and relay must use the same count",
		set: func(c *config, v string) (err error) {
			if c.OutboxShards, err = atLeast(v, 1); err != nil {
				return err
			}
			return pipeline.CheckOutboxShards(c.OutboxShards)
		}}
	idempotencyRetention = &setting{flag: "idempotency-retention", env: "ONCEFLOW_IDEMPOTENCY_RETENTION", def: pipeline.DefaultIdempotencyRetention.String(), kind: "duration", section: outboxSection,
		help: "how long ingest remembers an Idempotency-Key; the relay's janitor drops older partitions; give every ingest and relay the same",
		set: func(c *config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < time.Minute {
				return errors.New("want a duration of at least 1m, like 24h")
			}
			c.IdempotencyRetention = d
			return nil
		}}
)

// Ingest.
var (
	httpAddr = &setting{flag: "http-addr", env: "HTTP_ADDR", def: ":8080", kind: "string", section: ingestSection,
		help: "ingest HTTP address; onceflow dev listens on 127.0.0.1:8080 unless it is given",
		set:  func(c *config, v string) error { c.HTTPAddr = v; return nil }}
	tenantRateLimit = &setting{flag: "tenant-rate-limit", env: "ONCEFLOW_TENANT_RATE_LIMIT", def: strconv.Itoa(ingest.DefaultRateLimit), kind: "float", section: ingestSection,
		help: "requests per second each tenant may send to one ingest process, bursts up to twice that; above it 429 (0 or less: no limit)",
		set: func(c *config, v string) error {
			rate, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return errors.New("want requests per second, like 1000")
			}
			if rate <= 0 {
				rate = -1 // no limit
			}
			c.TenantRateLimit = rate
			return nil
		}}
	trustedProxies = &setting{flag: "trusted-proxies", env: "ONCEFLOW_TRUSTED_PROXIES", kind: "string", section: ingestSection,
		help: "addresses (CIDR, comma separated) of the load balancers in front of ingest, never a network clients come from: from them X-Forwarded-For names the client whose failed authentications are limited",
		set:  func(c *config, v string) (err error) { c.Ingest.TrustedProxies, err = networks(v); return err }}
	ingestWriteTimeout = &setting{flag: "ingest-write-timeout", env: "ONCEFLOW_INGEST_WRITE_TIMEOUT", def: ingest.DefaultWriteTimeout.String(), kind: "duration", section: ingestSection,
		help: "how long an ingest request may take from its headers to the end of its answer, a ?wait= besides: a client that does not read its answer holds its connection this long; longer than the 10s a request waits for the database",
		set: func(c *config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return errors.New("want a positive duration like 30s")
			}
			c.Ingest.WriteTimeout = d
			return nil
		}}
	inboundConfig = &setting{flag: "inbound-config", env: "ONCEFLOW_INBOUND_CONFIG", section: ingestSection,
		help: "JSON `file` of the webhook providers ingest accepts at POST /v1/inbound/{provider} (docs/inbound.md); secrets may stay in the environment (secrets_env)",
		set: func(c *config, v string) error {
			if v == "" {
				return nil
			}
			b, err := os.ReadFile(v) // #nosec G703 G304 -- the operator names the file (ONCEFLOW_INBOUND_CONFIG)
			if err != nil {
				return err
			}
			c.Ingest.Providers, err = ingest.ParseProviders(b, c.getenv)
			return err
		}}
	inboundRetention = &setting{flag: "inbound-retention", env: "ONCEFLOW_INBOUND_RETENTION", def: ingest.DefaultInboundRetention.String(), kind: "duration", section: ingestSection,
		help: "how long ingest remembers a provider's event ids; longer than any provider retries",
		set: func(c *config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < time.Hour {
				return errors.New("want a duration of an hour or more, like 720h")
			}
			c.Ingest.InboundRetention = d
			return nil
		}}
)

// The relay.
var (
	relayLease = &setting{flag: "relay-lease", env: "ONCEFLOW_RELAY_LEASE", def: relay.DefaultLeaseDuration.String(), kind: "duration", section: relaySection,
		help: "relay shard lease period: a silent relay's shards move to the others after it",
		set:  func(c *config, v string) (err error) { c.Relay.LeaseDuration, err = positive(v, "10s"); return err }}
	relayBatchSize = &setting{flag: "relay-batch-size", env: "ONCEFLOW_RELAY_BATCH_SIZE", def: strconv.Itoa(relay.DefaultBatchSize), kind: "int", section: relaySection,
		help: "outbox rows per relay Kafka transaction",
		set:  func(c *config, v string) (err error) { c.Relay.BatchSize, err = atLeast(v, 1); return err }}
	reconcileInterval = &setting{flag: "reconcile-interval", env: "ONCEFLOW_RECONCILE_INTERVAL", kind: "duration", section: relaySection,
		help: "how often the relay runs onceflow reconcile with the domains' authorities, logging what it finds (docs/operations.md#reconcile); empty or 0: never",
		set: func(c *config, v string) error {
			if v == "" {
				return nil
			}
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return errors.New("want a duration like 5m, or 0 for never")
			}
			c.Reconcile.Interval = d
			return nil
		}}
)

// The processor.
var (
	processorSessionTimeout = &setting{flag: "processor-session-timeout", env: "ONCEFLOW_PROCESSOR_SESSION_TIMEOUT", def: processor.DefaultSessionTimeout.String(), kind: "duration", section: processorSection,
		help: "processor group session timeout; its transaction timeout is 8/10 of it",
		set: func(c *config, v string) (err error) {
			c.Processor.SessionTimeout, err = positive(v, "10s")
			return err
		}}
	processorMaxClockSkew = &setting{flag: "processor-max-clock-skew", env: "ONCEFLOW_PROCESSOR_MAX_CLOCK_SKEW", kind: "duration", section: processorSection,
		help: "how far ahead of the processor's clock a command's record time may be; a later one goes to the DLQ (future-timestamp); empty: " + processor.DefaultMaxClockSkew.String(),
		set: func(c *config, v string) (err error) {
			if v != "" {
				c.Processor.MaxClockSkew, err = positive(v, "15m")
			}
			return err
		}}
	processorMaxCommandAge = &setting{flag: "processor-max-command-age", env: "ONCEFLOW_PROCESSOR_MAX_COMMAND_AGE", kind: "duration", section: processorSection,
		help: "how far behind the processor's clock a producer's command record time may be; an earlier one (or one before 1970) goes to the DLQ (past-timestamp), not one the relay or a decision sent (accepted-by); empty: the commands topic's retention and a day",
		set: func(c *config, v string) error {
			if v == "" {
				return nil
			}
			d, err := time.ParseDuration(v)
			if err != nil || d < processor.MinMaxCommandAge {
				return fmt.Errorf("want a duration of at least %s like 192h", processor.MinMaxCommandAge)
			}
			c.Processor.MaxCommandAge = d
			return nil
		}}
	processorMaxCommandBytes = &setting{flag: "processor-max-command-bytes", env: "ONCEFLOW_PROCESSOR_MAX_COMMAND_BYTES", def: "0", kind: "int", section: processorSection,
		help: "largest command record value the processor decides; a larger one goes to the DLQ (too-large); 0: " + strconv.Itoa(processor.DefaultMaxCommandBytes),
		set: func(c *config, v string) (err error) {
			if c.Processor.MaxCommandBytes, err = atLeast(v, 0); err != nil {
				return errors.New("want a size in bytes, or 0 for 1 MiB")
			}
			return nil
		}}
)

// The projector.
var (
	projectorSessionTimeout = &setting{flag: "projector-session-timeout", env: "ONCEFLOW_PROJECTOR_SESSION_TIMEOUT", def: projector.DefaultSessionTimeout.String(), kind: "duration", section: projectorSection,
		help: "projector group session timeout: how long a dead projector keeps its partitions",
		set: func(c *config, v string) (err error) {
			c.Projector.SessionTimeout, err = positive(v, "10s")
			return err
		}}
	projectorParallelism = &setting{flag: "projector-parallelism", env: "ONCEFLOW_PROJECTOR_PARALLELISM", def: strconv.Itoa(projector.DefaultParallelism), kind: "int", section: projectorSection,
		help: "transactions a projector runs at once over disjoint partitions of a batch",
		set:  func(c *config, v string) (err error) { c.Projector.Parallelism, err = atLeast(v, 1); return err }}
	projectorSynchronousCommit = &setting{flag: "projector-synchronous-commit", env: "ONCEFLOW_PROJECTOR_SYNCHRONOUS_COMMIT", def: "false", kind: "bool", section: projectorSection,
		help: "each projector batch's commit waits for its WAL flush; by default batches commit asynchronously and a database crash's lost ones are read again",
		set:  func(c *config, v string) (err error) { c.Projector.SynchronousCommit, err = boolean(v); return err }}
)

// The worker's jobs; the queue and the attempts are the projector's too,
// which enqueues them.
var (
	workerQueue = &setting{flag: "worker-queue", env: "ONCEFLOW_WORKER_QUEUE", def: jobs.DefaultQueue, kind: "string", section: workerSection,
		help: "River queue of onceflow's jobs; give the projectors and workers the same",
		set: func(c *config, v string) error {
			if v == "" {
				return errors.New("want a queue name")
			}
			c.Worker.Queue = v
			return nil
		}}
	workerMaxWorkers = &setting{flag: "worker-max-workers", env: "ONCEFLOW_WORKER_MAX_WORKERS", def: strconv.Itoa(jobs.DefaultMaxWorkers), kind: "int", section: workerSection,
		help: "jobs a worker process runs at once",
		set:  func(c *config, v string) (err error) { c.Worker.MaxWorkers, err = atLeast(v, 1); return err }}
	workerBacklogWorkers = &setting{flag: "worker-backlog-workers", env: "ONCEFLOW_WORKER_BACKLOG_WORKERS", def: strconv.Itoa(jobs.DefaultBacklogWorkers), kind: "int", section: workerSection,
		help: "jobs of tenants with a backlog of their own a worker process runs at once, besides ONCEFLOW_WORKER_MAX_WORKERS",
		set:  func(c *config, v string) (err error) { c.Worker.BacklogWorkers, err = atLeast(v, 1); return err }}
	workerLease = &setting{flag: "worker-lease", env: "ONCEFLOW_WORKER_LEASE", def: jobs.DefaultLease.String(), kind: "duration", section: workerSection,
		help: "how long a job attempt may run before River's rescuer gives the job to another worker",
		set:  func(c *config, v string) (err error) { c.Worker.Lease, err = positive(v, "30s"); return err }}
	workerAttemptTimeout = &setting{flag: "worker-attempt-timeout", env: "ONCEFLOW_WORKER_ATTEMPT_TIMEOUT", kind: "duration", section: workerSection,
		help: "bound of one job attempt, below the lease; empty: half the lease",
		set: func(c *config, v string) (err error) {
			if v != "" {
				c.Worker.AttemptTimeout, err = positive(v, "30s")
			}
			return err
		}}
	workerMaxAttempts = &setting{flag: "worker-max-attempts", env: "ONCEFLOW_WORKER_MAX_ATTEMPTS", def: strconv.Itoa(jobs.DefaultMaxAttempts), kind: "int", section: workerSection,
		help: "attempts of a job before it is discarded with its errors kept",
		set: func(c *config, v string) (err error) {
			if c.Worker.MaxAttempts, err = atLeast(v, 1); err == nil && c.Worker.MaxAttempts > 1000 {
				err = errors.New("want 1 to 1000")
			}
			return err
		}}
	workerBaseDelay = &setting{flag: "worker-base-delay", env: "ONCEFLOW_WORKER_BASE_DELAY", def: jobs.DefaultBaseDelay.String(), kind: "duration", section: workerSection,
		help: "first retry's largest wait; doubles per attempt, full jitter",
		set:  func(c *config, v string) (err error) { c.Worker.BaseDelay, err = positive(v, "1s"); return err }}
	workerMaxDelay = &setting{flag: "worker-max-delay", env: "ONCEFLOW_WORKER_MAX_DELAY", def: jobs.DefaultMaxDelay.String(), kind: "duration", section: workerSection,
		help: "largest wait before a retry, unless the receiver's Retry-After asks for more",
		set:  func(c *config, v string) (err error) { c.Worker.MaxDelay, err = positive(v, "10m"); return err }}
)

// The webhook deliveries, jobs the worker runs.
var (
	webhookTimeout = &setting{flag: "webhook-timeout", env: "ONCEFLOW_WEBHOOK_TIMEOUT", def: webhooks.DefaultTimeout.String(), kind: "duration", section: webhooksSection,
		help: "bound of one webhook request, connect to last byte",
		set:  func(c *config, v string) (err error) { c.Webhooks.Timeout, err = positive(v, "10s"); return err }}
	webhookAllowNetworks = &setting{flag: "webhook-allow-networks", env: "ONCEFLOW_WEBHOOK_ALLOW_NETWORKS", kind: "string", section: webhooksSection,
		help: "networks (CIDR, comma separated) webhooks and domains' jobs may reach although the address guard refuses them: loopback, private, link-local, NAT64 and the other special-purpose ranges",
		set:  func(c *config, v string) (err error) { c.Webhooks.Allow, err = networks(v); return err }}
	webhookBreakerFailures = &setting{flag: "webhook-breaker-failures", env: "ONCEFLOW_WEBHOOK_BREAKER_FAILURES", def: strconv.Itoa(webhooks.DefaultBreakerFailures), kind: "int", section: webhooksSection,
		help: "failures in a row that open an endpoint's circuit breaker",
		set:  func(c *config, v string) (err error) { c.Webhooks.BreakerFailures, err = atLeast(v, 1); return err }}
	webhookBreakerCooldown = &setting{flag: "webhook-breaker-cooldown", env: "ONCEFLOW_WEBHOOK_BREAKER_COOLDOWN", def: webhooks.DefaultBreakerCooldown.String(), kind: "duration", section: webhooksSection,
		help: "how long an open breaker holds an endpoint's deliveries",
		set: func(c *config, v string) (err error) {
			c.Webhooks.BreakerCooldown, err = positive(v, "30s")
			return err
		}}
	webhookMaxPerTenant = &setting{flag: "webhook-max-per-tenant", env: "ONCEFLOW_WEBHOOK_MAX_PER_TENANT", def: strconv.Itoa(webhooks.DefaultMaxPerTenant), kind: "int", section: webhooksSection,
		help: "deliveries of one tenant a worker process runs at once",
		set:  func(c *config, v string) (err error) { c.Webhooks.MaxPerTenant, err = atLeast(v, 1); return err }}
	webhookMaxPending = &setting{flag: "webhook-max-pending", env: "ONCEFLOW_WEBHOOK_MAX_PENDING", def: strconv.Itoa(webhooks.DefaultMaxPending), kind: "int", section: webhooksSection,
		help: "a tenant's webhook deliveries in flight at most; at the cap its new events wait to be fanned out",
		set:  func(c *config, v string) (err error) { c.Webhooks.MaxPending, err = atLeast(v, 1); return err }}
	webhookRetention = &setting{flag: "webhook-retention", env: "ONCEFLOW_WEBHOOK_RETENTION", def: webhooks.DefaultRetention.String(), kind: "duration", section: webhooksSection,
		help: "how long finished webhook deliveries and fanned-out events are kept; at least 24h",
		set: func(c *config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 24*time.Hour {
				return errors.New("want a duration of at least 24h like 2160h")
			}
			c.Webhooks.Retention = d
			return nil
		}}
)

// The NATS sink (docs/consumers.md#nats-jetstream): the events to a
// JetStream stream.
var (
	natsURL = &setting{flag: "nats-url", env: "ONCEFLOW_NATS_URL", secret: true, section: natsinkSection,
		help: "NATS server `URL`s, comma separated (nats://, tls://; user:password@ if the server asks); set, onceflow dev runs the NATS sink too",
		set:  func(c *config, v string) error { c.NATSink.URL = v; return nil }}
	natsCredsFile = &setting{flag: "nats-creds-file", env: "ONCEFLOW_NATS_CREDS_FILE", kind: "string", section: natsinkSection,
		help: "NATS credentials file (a user JWT and its NKey seed) for a server with decentralized authentication",
		set:  func(c *config, v string) error { c.NATSink.CredsFile = v; return nil }}
	natsCAFile = &setting{flag: "nats-ca-file", env: "ONCEFLOW_NATS_CA_FILE", kind: "string", section: natsinkSection,
		help: "CA bundle (PEM) to verify a tls:// NATS server with, instead of the system's roots",
		set:  func(c *config, v string) error { c.NATSink.CAFile = v; return nil }}
	natsDuplicateWindow = &setting{flag: "nats-duplicate-window", env: "ONCEFLOW_NATS_DUPLICATE_WINDOW", def: natsink.DefaultDuplicateWindow.String(), kind: "duration", section: natsinkSection,
		help: "how long JetStream drops an event published again (its Nats-Msg-Id): the limit of exactly once; the stream the sink creates gets it, an existing stream with less is refused",
		set:  func(c *config, v string) (err error) { c.NATSink.DuplicateWindow, err = positive(v, "10m"); return err }}
	natsReplicas = &setting{flag: "nats-stream-replicas", env: "ONCEFLOW_NATS_STREAM_REPLICAS", def: "0", kind: "int", section: natsinkSection,
		help: "replicas of a stream the sink creates; 0: 3, and 1 in onceflow dev (which then allows it)",
		set:  func(c *config, v string) (err error) { c.NATSink.Replicas, err = atLeast(v, 0); return err }}
	natsAllowSingleReplica = &setting{flag: "nats-allow-single-replica", env: "ONCEFLOW_NATS_ALLOW_SINGLE_REPLICA", def: "false", kind: "bool", section: natsinkSection,
		help: "let the sink use a stream of one replica: only where the server syncs every write (sync_interval: always), since JetStream acknowledges before it syncs and the sink commits on the acknowledgement",
		set:  func(c *config, v string) (err error) { c.NATSink.AllowSingleReplica, err = boolean(v); return err }}
	natsMaxInFlight = &setting{flag: "nats-max-in-flight", env: "ONCEFLOW_NATS_MAX_IN_FLIGHT", def: strconv.Itoa(natsink.DefaultMaxInFlight), kind: "int", section: natsinkSection,
		help: "events published and not yet acknowledged by JetStream; 1 keeps every aggregate's order in the stream even when a publish fails, at a round trip per event",
		set:  func(c *config, v string) (err error) { c.NATSink.MaxInFlight, err = atLeast(v, 1); return err }}
	natsSessionTimeout = &setting{flag: "nats-session-timeout", env: "ONCEFLOW_NATS_SESSION_TIMEOUT", def: natsink.DefaultSessionTimeout.String(), kind: "duration", section: natsinkSection,
		help: "the sink's group session timeout: how long a dead sink keeps its partitions; keep it well inside the duplicate window",
		set:  func(c *config, v string) (err error) { c.NATSink.SessionTimeout, err = positive(v, "10s"); return err }}
)

// The embedded default, `onceflow dev`, and the private Postgres cluster.
var (
	dataDir = &setting{flag: "data-dir", env: "ONCEFLOW_DATA_DIR", def: ".data", kind: "string", section: devSection,
		help: "the embedded broker's data (DIR/kafka), its registry's (DIR/registry.json) and the private Postgres cluster (DIR/postgres)",
		set:  func(c *config, v string) error { c.DataDir = v; return nil }}
	brokerAddr = &setting{flag: "broker-addr", env: "ONCEFLOW_DEV_BROKER_ADDR", def: "127.0.0.1:9092", kind: "string", section: devSection,
		help: "the embedded broker's address, when KAFKA_BROKERS does not name a Kafka cluster to run on instead",
		set:  func(c *config, v string) error { c.BrokerAddr = v; return nil }}
	registryAddr = &setting{flag: "registry-addr", def: "127.0.0.1:8081", kind: "string", section: devSection,
		help: "the embedded schema registry's address; it accepts new schemas from anyone who reaches it",
		set:  func(c *config, v string) error { c.RegistryAddr = v; return nil }}
	brokerOnly = &setting{flag: "broker-only", def: "false", kind: "bool", section: devSection,
		help: "run only the embedded broker and registry, for components started on their own",
		set:  func(c *config, v string) (err error) { c.BrokerOnly, err = boolean(v); return err }}
	groupMinSessionTimeout = &setting{flag: "group-min-session-timeout", env: "ONCEFLOW_DEV_GROUP_MIN_SESSION_TIMEOUT", def: "6s", kind: "duration", section: devSection,
		help: "the broker's smallest group session timeout; lower it to test rebalances quickly",
		set:  func(c *config, v string) (err error) { c.GroupMinSessionTimeout, err = positive(v, "6s"); return err }}
	// The demo tenant's key is read from the environment only: a key on a
	// command line sits in the shell's history and every process listing.
	devAPIKey = &setting{env: "ONCEFLOW_DEV_API_KEY", secret: true, section: devSection,
		help: "the demo tenant's API key; unset, dev makes one and prints it",
		set:  func(c *config, v string) error { c.APIKey = v; return nil }}
)

// Which command uses which settings.
var (
	kafkaSettings    = []*setting{kafkaBrokers, kafkaSASLMechanism, kafkaSASLUser, kafkaSASLPassword, kafkaTLS, kafkaTLSCAFile, kafkaAllowPlaintextSASL, kafkaMaxDecompressBatchBytes, kafkaMaxDecompressPollBytes}
	registrySettings = []*setting{registryURL, registryUser, registryPassword, registryCAFile}
	loggingSettings  = []*setting{logLevel, logFormat}
	tracingSettings  = []*setting{otlpEndpoint, otlpTracesEndpoint}
	// poolSettings are a component's database: it migrates, then holds a pool.
	poolSettings   = []*setting{databaseURL, databaseMigrationURL, databaseMaxConns}
	topicsSettings = []*setting{topicPrefix, partitions, dedupWindow}
	outboxSettings = []*setting{outboxShards, idempotencyRetention}
	ingestSettings = []*setting{httpAddr, tenantRateLimit, trustedProxies, ingestWriteTimeout, inboundConfig, inboundRetention}
	relaySettings  = []*setting{instanceID, relayLease, relayBatchSize, reconcileInterval}
	// The processor's instance id names its transactional producer.
	processorSettings = []*setting{instanceID, processorSessionTimeout, processorMaxClockSkew, processorMaxCommandAge, processorMaxCommandBytes}
	// The projector enqueues the webhooks' jobs on the worker's queue with
	// their attempts, and makes a tenant's deliveries itself only below
	// the cap of its deliveries in flight.
	projectorSettings = []*setting{projectorSessionTimeout, projectorParallelism, projectorSynchronousCommit, workerQueue, workerMaxAttempts, webhookMaxPending}
	workerSettings    = []*setting{workerQueue, workerMaxWorkers, workerBacklogWorkers, workerLease, workerAttemptTimeout, workerMaxAttempts, workerBaseDelay, workerMaxDelay,
		webhookTimeout, webhookAllowNetworks, webhookBreakerFailures, webhookBreakerCooldown, webhookMaxPerTenant, webhookMaxPending, webhookRetention}
	natsinkSettings = []*setting{natsURL, natsCredsFile, natsCAFile, natsDuplicateWindow, natsReplicas, natsAllowSingleReplica, natsMaxInFlight, natsSessionTimeout}
	devSettings     = []*setting{dataDir, brokerAddr, registryAddr, brokerOnly, groupMinSessionTimeout, devAPIKey}
)

// componentSettings are the settings of a process that runs components:
// each one's own, and what they share (Kafka, the registry and the topics
// for those on Kafka; the database for those on Postgres).
func componentSettings(c onceflow.Components) []*setting {
	lists := [][]*setting{{adminAddr, adminToken}, loggingSettings, tracingSettings}
	decodes := c.Ingest || c.Relay || c.Processor || c.Projector
	if decodes || c.NATSink {
		lists = append(lists, kafkaSettings, topicsSettings, []*setting{lagExport})
	}
	if decodes {
		lists = append(lists, registrySettings)
	}
	// The processor needs no database, but a cluster-wide lag export
	// reads the projectors' offsets there.
	if c.Ingest || c.Relay || c.Projector || c.Worker || c.Processor {
		lists = append(lists, poolSettings)
	}
	if c.Ingest {
		lists = append(lists, ingestSettings, outboxSettings)
	}
	if c.Relay {
		lists = append(lists, relaySettings, outboxSettings)
	}
	if c.Processor {
		lists = append(lists, processorSettings)
	}
	if c.Projector {
		lists = append(lists, projectorSettings)
	}
	if c.Worker {
		lists = append(lists, workerSettings)
	}
	if c.NATSink {
		lists = append(lists, natsinkSettings)
	}
	return use(lists...)
}

// use is lists in one, each setting once, in the order of the sections
// they are declared in. A setting whose section sectionOrder lacks is a
// mistake of this file, not a setting to leave out: it panics, when the
// commands are registered (the tracing section once was missing, and
// OTEL_EXPORTER_OTLP_ENDPOINT was read by no command).
func use(lists ...[]*setting) []*setting {
	var out []*setting
	seen := map[*setting]bool{}
	for _, sec := range sectionOrder {
		for _, l := range lists {
			for _, s := range l {
				if s.section == sec && !seen[s] {
					seen[s] = true
					out = append(out, s)
				}
			}
		}
	}
	for _, l := range lists {
		for _, s := range l {
			if !seen[s] {
				panic(fmt.Sprintf("cli: setting %s is in a section sectionOrder lacks (%v)", s.name(), s.section))
			}
		}
	}
	return out
}

// sectionOrder is the order of the sections in -h; every section is in it.
var sectionOrder = []*section{kafkaSection, registrySection, postgresSection, topicsSection, processSection, loggingSection, tracingSection,
	outboxSection, ingestSection, relaySection, processorSection, projectorSection, workerSection, webhooksSection, natsinkSection, devSection}
