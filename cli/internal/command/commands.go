package command

// The commands of Main, each with the settings it reads (settings.go);
// the components and dev are in components.go.
func init() {
	register(&command{name: "demo", summary: "drive a scripted workload against a running ingest and check the balances",
		settings: use([]*setting{devAPIKey}), run: runDemo})
	register(&command{name: "migrate", summary: "apply the Postgres migrations",
		settings: use([]*setting{databaseURL, databaseMigrationURL}), run: runMigrate})
	register(&command{name: "migrate version", summary: "print where the database stands on each set of migrations (onceflow's, each domain's) and the newest this binary has",
		settings: use([]*setting{databaseURL}), run: runMigrateVersion})
	register(&command{name: "topics create", summary: "create the topics (cleanup policies, retention, partitions) and check them",
		settings: use(kafkaSettings, topicsSettings), run: runTopicsCreate})
	register(&command{name: "postgres up", summary: "start (or reuse) the private Postgres cluster and print its URL",
		settings: use([]*setting{dataDir, databaseURL}), run: runPostgresUp})
	register(&command{name: "postgres down", summary: "stop the private Postgres cluster",
		settings: use([]*setting{dataDir}), run: runPostgresDown})
	register(&command{name: "dlq list", summary: "list the poison commands in the commands DLQ with their reasons",
		settings: use(kafkaSettings, []*setting{topicPrefix}), run: runDLQList})
	register(&command{name: "dlq redrive", summary: "republish chosen DLQ records to the commands topic with their original command ids", args: "(PARTITION:OFFSET... | -reason R | -all)",
		more: "Republishes the chosen records to the commands topic as they came (key, value, headers,\n" +
			"command id, timestamp). A command handled meanwhile is recognized by its id and skipped.",
		settings: use(kafkaSettings, []*setting{topicPrefix}), run: runDLQRedrive})
	register(&command{name: "events tail", summary: "print the events decoded, as a team downstream reads them, and follow new ones", more: eventsTailUsage,
		settings: use(kafkaSettings, registrySettings, []*setting{topicPrefix}), run: runEventsTail})
	register(&command{name: "produce", summary: "produce commands to the commands topic from JSON, Avro-encoded with their headers", args: "['PAYLOAD-JSON']", more: produceUsage,
		settings: use(kafkaSettings, registrySettings, []*setting{topicPrefix}), run: runProduce})
	register(&command{name: "idempotency-check", summary: "a tenant's Idempotency-Keys: replays and conflicts per key, most active first: idempotency-check --tenant T --hours H",
		settings: use([]*setting{databaseURL}), run: runIdempotencyCheck})
	// API keys are managed by id. No command takes a key as an argument: one
	// typed on a command line stays in the shell's history and in every
	// process listing (docs/security.md).
	register(&command{name: "tenants create", summary: "create a tenant's API key and print it once: tenants create [-name LABEL] TENANT", args: "TENANT",
		settings: use([]*setting{databaseURL}), run: tenantsKeysCreate("tenants create")})
	register(&command{name: "tenants keys create", summary: "create another API key for a tenant and print it once: tenants keys create [-name LABEL] TENANT", args: "TENANT",
		settings: use([]*setting{databaseURL}), run: tenantsKeysCreate("tenants keys create")})
	register(&command{name: "tenants keys list", summary: "list API keys by id (never the keys): tenants keys list [-tenant TENANT]",
		settings: use([]*setting{databaseURL}), run: runTenantsKeysList})
	register(&command{name: "tenants keys revoke", summary: "revoke an API key by id, at once: tenants keys revoke ID", args: "ID",
		settings: use([]*setting{databaseURL}), run: runTenantsKeysRevoke})
	register(&command{name: "lag", summary: "consumer lag per group, topic and partition against the last stable offset, and parked partitions",
		settings: use(kafkaSettings, []*setting{databaseURL, topicPrefix}, loggingSettings,
			[]*setting{natsURL, natsCredsFile, natsCAFile, natsAllowSingleReplica}), run: runLag})
	register(&command{name: "outbox status", summary: "print the outbox per shard (backlog, oldest age, lease owner), the relays and the dead rows",
		settings: use([]*setting{databaseURL}), run: runOutboxStatus})
	register(&command{name: "projections rebuild", summary: "rebuild a read model from the events topic into shadow tables and swap it in: projections rebuild NAME", args: "NAME",
		settings: use(kafkaSettings, registrySettings, []*setting{databaseURL, databaseMigrationURL, topicPrefix}, loggingSettings), run: runProjectionsRebuild})
	register(&command{name: "projections unpark", summary: "let a projector try its parked partitions again: projections unpark [PARTITION...]", args: "[PARTITION...]",
		settings: use([]*setting{databaseURL, topicPrefix}), run: runProjectionsUnpark})
	register(&command{name: "projections skip", summary: "skip, on purpose and recorded, the record a projector's partition is parked on: projections skip -note WHY PARTITION OFFSET", args: "PARTITION OFFSET",
		settings: use([]*setting{databaseURL, topicPrefix}), run: runProjectionsSkip})
	register(&command{name: "projections reset", summary: "choose, recorded, where a projector's partitions parked for their stored offset (topic-changed, offset-out-of-range) read from: projections reset -from start|OFFSET -note WHY all|PARTITION...", args: "all | PARTITION...",
		settings: use(kafkaSettings, []*setting{databaseURL, topicPrefix}), run: runProjectionsReset})
	register(&command{name: "commands skip-batch", summary: "skip, on purpose and recorded in the DLQ, a commands batch too large to decompress that a processor is blocked at: commands skip-batch -note WHY PARTITION OFFSET", args: "PARTITION OFFSET",
		more: "Asks the processor at -admin-addr (ADMIN_ADDR), with ONCEFLOW_ADMIN_TOKEN, to move the partition past the batch:\n" +
			"its DLQ record (reason batch-too-large) keeps the batch's offsets, who and why. `onceflow lag` shows batch-too-large@OFFSET.",
		settings: use([]*setting{topicPrefix, adminAddr, adminToken}), run: runCommandsSkipBatch})
	register(&command{name: "projections list", summary: "the projections, their tables, rebuilds and parked partitions",
		settings: use([]*setting{databaseURL, topicPrefix}), run: runProjectionsList})
	register(&command{name: "reconcile", summary: "find stuck or ambiguous work (commands pending too long, outbox_dead, DLQ, unapplied inbound events, jobs out of attempts), ask their authority, correct through commands, audit, report",
		settings: use(kafkaSettings, registrySettings, []*setting{databaseURL, databaseMigrationURL, topicPrefix, outboxShards}), run: runReconcile})
	register(&command{name: "trace", summary: "print one command's whole path from an Idempotency-Key, provider/event-id, command id or event id: key, outbox, where it was shipped, status, events and which consumer groups have read past them, inbox rows, corrections", args: "IDEMPOTENCY-KEY | PROVIDER/EVENT-ID | COMMAND-ID | EVENT-ID",
		settings: use(kafkaSettings, []*setting{databaseURL, databaseMigrationURL, topicPrefix}), run: runTrace})
	register(&command{name: "verify", summary: "audit a window for exactly-once: every command accepted was decided, every event applied once by each projector, every effect key run once; exits non-zero when anything was lost or doubled",
		more: "Joins the accepted keys, the outbox, the commands topics (read_committed), command_status, the events topics by event id,\n" +
			"the projectors' inbox rows and the jobs' keys for the window, and names each id lost, pending or doubled with its stage.",
		settings: use(kafkaSettings, []*setting{databaseURL, topicPrefix, natsURL}), run: runVerify})
	register(&command{name: "webhooks list", summary: "print a tenant's webhook subscriptions (status, event types, circuit breaker)",
		settings: use([]*setting{databaseURL}), run: runWebhooksList})
	register(&command{name: "webhooks deliveries", summary: "print a tenant's webhook delivery log (status, attempts, last answer or error)",
		settings: use([]*setting{databaseURL}), run: runWebhooksDeliveries})
	register(&command{name: "webhooks redeliver", summary: "send a tenant's webhook deliveries again (one event, or every dead one of a subscription)",
		settings: use([]*setting{databaseURL}), run: runWebhooksRedeliver})
	register(&command{name: "jobs list", summary: "print River's jobs (state, attempts, last error), newest first",
		settings: use([]*setting{databaseURL}), run: runJobsList})
	register(&command{name: "jobs retry", summary: "run dead jobs (discarded: out of attempts; cancelled: a permanent error) again, with their keys: one more attempt each",
		args: "JOB-ID...", settings: use([]*setting{databaseURL}), run: runJobsRetry})
}
