// Package chaos proves onceflow's promise — nothing lost, nothing applied
// twice — the way Jepsen's bank test and Kafka's exactly-once system tests
// do, on one machine with real processes.
//
// TestChaos runs the real binaries as separate processes: the embedded
// broker (`onceflow dev --broker-only` with a data directory), two ingest,
// two relay, two processor and two projector processes, against a
// PostgreSQL cluster of its own. A seeded workload of many tenants and
// accounts opens, deposits, withdraws, transfers (across partitions) and
// closes; HTTP clients time out and retry with the same key, and sometimes
// resend with a new key on purpose; some deposits are produced straight to
// Kafka, some of those twice with the same command-id. Meanwhile a seeded
// schedule injects faults: SIGKILL of any component, a hard broker restart
// (a crash between two of its requests: kfake, unlike a real broker, has no
// transaction log to finish a commit it was writing; see docs/decisions.md),
// an immediate Postgres restart, a processor paused past its session
// timeout (a zombie), an extra relay on the same shards.
//
// After the faults stop and the pipeline drains, the checker verifies:
//
//   - every command answered 2xx (or produced to Kafka) has exactly one
//     outcome in command_status;
//   - every balance equals the one computed from the accepted commands,
//     and total money equals accepted deposits minus withdrawals;
//   - no event id was applied twice, each aggregate's versions run 1..n,
//     and a read_committed reader of the events topic sees exactly the
//     events the projections recorded.
//
// It ends with a summary table: commands sent, faults by kind, duplicates
// absorbed at each boundary, losses and double effects (both must be 0),
// time to drain. A failure prints the seed, the first violated property and
// the records involved; the same seed reproduces the schedule.
//
//	make chaos DURATION=10m SEED=42
//	make chaos DURATION=2m SEED=7 FAULTS=broker,zombie   # only these kinds
//	go test ./test/chaos -run TestChaos -args -chaos.duration=2m -chaos.seed=7
package chaos
