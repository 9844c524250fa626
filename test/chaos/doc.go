// Package chaos proves onceflow's promise — nothing lost, nothing applied
// twice — the way Jepsen's bank test and Kafka's exactly-once system tests
// do, on one machine with real processes.
//
// TestChaos runs the real binaries as separate processes: the embedded broker
// (`onceflow dev --broker-only` with a data directory), two ingest, two
// relay, two processor, two projector and two worker processes, against a
// PostgreSQL cluster of its own. A seeded workload of many tenants and
// accounts opens, deposits, withdraws, transfers (across partitions) and
// closes; HTTP clients time out and retry with the same key, and sometimes
// resend with a new key on purpose; some deposits are produced straight to
// Kafka, some of those twice with the same command-id, and ids ingest minted
// are produced again as deposits to another account and to another tenant's
// (distinct commands, to be applied). A fixed share of the traffic goes to
// one hot account per tenant, which gets several times the commands of any
// other. Interleaved with it, a stream of hostile records goes straight to
// {prefix}.commands: a key with invalid UTF-8, a NUL or a local id over
// MaxLocalIDLen; string fields with invalid UTF-8, a NUL or over the limit; a
// command-id that is no UUID or over its length; no command-id or no tenant
// header; a value that is not Avro, or of a schema id the registry does not
// have; a tenant header of another tenant; a command-type header unlike the
// value; a timestamp days back or before year 0 (past-timestamp); a timestamp
// half an hour ahead, past the processor's MaxClockSkew; a value over the
// processors' MaxCommandBytes (64 KiB in the run) but under the topic's
// max.message.bytes; and a record over max.message.bytes, which the broker
// must refuse to its producer. Meanwhile a seeded schedule injects faults:
// SIGKILL of any component, a hard broker restart (a crash between two of its
// requests: kfake, unlike a real broker, has no transaction log to finish a
// commit it was writing; see docs/decisions/0052-embedded-broker-crashes.md),
// an immediate Postgres restart, a processor paused past its session timeout
// (a zombie), an extra relay on the same shards, a worker paused past its job
// lease while it delivers. Each tenant subscribes a webhook receiver
// (pipeline/webhooks/webhookstest) to every event type; the receiver answers
// a delivery's first requests, by a hash of the seed and its key, with 500s,
// 503s and 429s with Retry-After before applying it, and with hangs past the
// worker's timeout and 502s after applying it.
//
// After the faults stop, the run waits for the pipeline to drain: the
// outbox empty and every command the harness knows of with its outcome,
// the workload's and the credit (then any refund) of each accepted
// transfer, which the processor sends through the commands topic and
// nothing else shows in flight. A drain that runs out of time
// (-chaos.drain, 3 minutes) fails the run naming each command still
// waited for, where the commands topic holds it (read_committed,
// read_uncommitted only, or not at all) and each consumer group's lag.
// Then the checker verifies:
//
//   - every command answered 2xx (or produced to Kafka) has exactly one
//     outcome in command_status;
//   - every balance equals the one computed from the accepted commands,
//     and total money equals accepted deposits minus withdrawals;
//   - no event id was applied twice, each aggregate's versions run 1..n
//     (a CommandRejected or CommandFailed at the current version), a
//     read_committed reader of the events topic sees exactly the events
//     the projections recorded, and every event is of a command the
//     workload sent, a transfer's credit or refund, or a hostile record's
//     failure;
//   - no good command failed or went to the DLQ; every hostile record the
//     broker holds is in the DLQ exactly once (read_committed: the DLQ
//     record is written in the transaction that commits the record's
//     offset), with its expected reason, as it was sent; each one naming a
//     valid command of a valid aggregate (a valid key, tenant and
//     command-id, then a bad field, value, type header, size or time) is
//     recorded there by one CommandFailed with that reason and shows
//     failed in command_status; the oversized record is refused with
//     MESSAGE_TOO_LARGE and is nowhere;
//   - every subscribed event delivered, and applied once, by the receiver:
//     each event of the events topic reached it under its delivery's key
//     with webhook-id = the event id, one effect per key however many
//     requests brought it, nothing else reached it, and its delivery row
//     is delivered.
//
// TestChaosInventory is a second workload shape on the same cluster and
// fault schedule, running the inventory binary (examples/inventory): three
// tenants add stock to items and place orders, a share of them for an
// item that never gets stock, with the same retries as the bank's,
// orders placed again with a new key, and orders produced straight to
// Kafka (stable command ids, some twice; a share of them poison, quantity
// 0). Every order is a saga across two
// aggregate types (the order's processor sends ReserveStock to the item's
// topic, the item's sends ConfirmOrder or RejectOrder back). Its
// invariant: each order placed once and decided once, no item's available
// stock ever negative, available + reserved = the stock added, every
// reservation a confirmed order's and every confirmed order reserved,
// each poison record the broker holds in the DLQ once and recorded failed
// once, and the read models equal to the events (test/e2e/inventory.go). `make
// test` runs seed 1 for 30 s (-chaos.inventory.duration; -chaos.duration
// sets both shapes).
//
// With -chaos.kafka (make chaos-kafka) the bank's run is on three nodes
// of Apache Kafka of its own (test/kafkacluster: replication factor 3,
// min.insync.replicas 2, the transaction state too) instead of the
// embedded broker, and the broker's restart gives way to Apache Kafka's
// own faults: kill -9 of the node that coordinates a processor's
// transactional id, at a moment the coordinator shows its transaction
// committing (PrepareCommit) or else open; kill -9 of the leader of a
// commands or events partition; a node paused with SIGSTOP past its
// broker session timeout, then resumed; a rolling restart of the three
// (each stopped with SIGTERM and started again, the controller last). A
// killed node is started again on its storage, and after each of these
// faults the run waits until every partition is in sync again, so that no
// two faults take two replicas of a partition down. The network's faults
// join them there, every process alive: a processor's or the relays'
// connections to their transaction coordinator cut while a transaction is
// open, a node isolated, a node deaf or mute, a slow lossy link, and
// Postgres connections cut right after COMMIT or mid-transaction, each
// healed after a bounded time; iptables rules (and a tc queue for the slow
// link) on loopback match only the run's own cgroups and ports (netem_test.go,
// docs/chaos.md#network-faults). The invariant is the same.
//
// It ends with a summary table: commands sent (and how many went to the
// hot accounts), hostile records by kind, faults by kind, duplicates
// absorbed at each boundary, losses and double effects (both must be 0),
// time to drain. A failure prints the seed, the first violated property and
// the records involved; the same seed reproduces the schedule and what
// the workload sends.
//
//	make chaos DURATION=10m SEED=42
//	make chaos DURATION=2m SEED=7 FAULTS=broker,zombie   # only these kinds
//	make chaos-kafka DURATION=10m SEED=3                  # on three nodes of Apache Kafka
//	go test ./test/chaos -run TestChaos -args -chaos.duration=2m -chaos.seed=7
package chaos
