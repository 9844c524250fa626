// Package relay ships the outbox to Kafka and keeps Postgres tidy.
//
// The relay is the bridge between ingest's Postgres transaction and the
// commands topic. It may publish a row twice (the processor absorbs a
// repeated command-id); it never loses a row and never reorders one
// aggregate's commands.
//
// # Shards and leases
//
// Ingest writes each row with a shard, hash(aggregate id) mod a fixed count
// (pipeline.OutboxShard, ONCEFLOW_OUTBOX_SHARDS, default 16), so all of an
// aggregate's rows are in one shard. A shard is shipped by one relay at a
// time, the holder of its lease, a row of outbox_leases:
//
//	free ──acquire (token+1)──▶ held ──renew (same token)──▶ held
//	  ▲                          │ │
//	  └──────release─────────────┘ └──no renewal for a lease period──▶ expired ──acquire (token+1)──▶ held by another
//
// The fencing token grows by one at every acquisition. Every write a relay
// makes for a shard names its token in the same statement: renewing,
// deleting shipped rows (the lease row is share-locked, then the rows
// deleted, in one statement), moving a row to outbox_dead. A relay that
// lost its lease therefore changes nothing of a shard another relay owns.
// Lease times come from the database clock only; locally a relay keeps a
// conservative deadline (the time it sent the query that reported the
// lease's expiry, plus what was left of it) and never waits for Kafka past
// it.
//
// Relays register in outbox_relays and heartbeat with every lease round
// (a third of the lease period). Each takes its fair share: the live relays,
// sorted by name, hold shards/live each and the first shards%live one more,
// so the shares add up to the shard count. A relay above its share gives
// shards back after the batch in flight; one below takes free or expired
// shards. A relay wakes up right when another's lease is due to expire, so
// a dead relay's shards are taken over within a lease period of its last
// renewal. A shard that has been free or expired for a whole lease period
// is taken by anyone, whatever the shares. A relay restarting with the same
// instance id (ONCEFLOW_INSTANCE_ID) takes over its previous incarnation's
// leases at once. A relay stopping gracefully finishes its batches and
// releases its leases, so others take over at their next round.
//
// # Shipping a batch
//
// A shard ships in (xid, id) order: xid is the transaction that wrote the
// row (outbox.xid, pg_current_xact_id() by default), id its place in that
// transaction. Per held shard, a worker loops:
//
//  1. read the shard's first rows in that order (LIMIT BatchSize) in the
//     same read-only statement that checks the lease's token and returns
//     how long it has left;
//  2. produce them in one Kafka transaction on the shard's transactional
//     producer (key = aggregate id, the stored headers plus relay-lease
//     and accepted-by: relay, timestamp = when ingest accepted the row,
//     which the processor does not refuse for its age), and commit it, all before
//     the local lease deadline (minus a margin); before the commit, wait
//     until the producer's metadata holds every partition the records went
//     to, or franz-go may turn a fresh producer's first commit into an
//     abort and report success (docs/decisions/0026-relay-commit-waits-for-partitions.md);
//  3. delete the rows by id, if the token still holds, and read the next
//     batch in the same statement (so a busy shard costs one query per
//     batch). The delete commits without waiting for the WAL flush: a
//     delete lost in a database crash only re-publishes rows.
//
// The next batch is read from where the last one ended when its last row
// was settled: its xid was below the oldest transaction still running
// when it was read, so no row can appear before it any more. Otherwise, or
// when rows of younger transactions wait behind the settled ones
// (onceflow_outbox_next then says so), the worker reads from the head, as
// it does first. Reading on skips the index entries of every row already
// shipped, which reading from the head walks until vacuum removes them;
// reading from the head never waits for a transaction to end, so a long
// transaction anywhere in the cluster costs head reads, not latency.
//
// An idle worker waits for the dispatcher, which on Wake or every
// PollInterval reads the head of every idle shard in one query and hands
// each worker its rows. The reads walk the (shard, xid, id) index through
// onceflow_outbox_heads (all idle shards) and onceflow_outbox_next (one
// shard), whatever the planner thinks of the queue table's statistics, so
// dead tuples between autovacuum runs do not slow them. A wake-up that
// finds a worker busy is kept for it: the rows it announces may have been
// committed after that worker's last read-ahead, so the worker reads its
// head once more before it waits (without this they waited for the next
// poll); a wake-up names the shards it is about, and a busy worker of
// another shard is left alone.
//
// Rows are deleted only after the broker acknowledged the commit. A crash
// (or a lost lease) between the commit and the delete leaves the rows; the
// shard's next holder publishes them again with the same command-id.
// Batches of a shard go out one after the other, so each aggregate's rows
// reach its partition in (xid, id) order, which is ingest order: a command
// accepted (committed) before the next one's request arrived has the lower
// xid, or the same xid and a lower id. A row committed after rows of
// younger transactions were shipped goes out when it becomes visible (two
// concurrent requests on one aggregate have no order to keep).
//
// # Fencing in Kafka
//
// The transactional id is the shard's ("{TransactionalIDPrefix}-{shard}"),
// not the process's. A relay that acquires a shard first initializes the
// shard's producer, which bumps the producer epoch: a previous holder's
// open transaction is aborted and its later produce or commit is refused.
// So a relay stopped in the middle of a batch (SIGSTOP, a long GC, a
// network partition) and continuing after its lease moved cannot make
// anything visible to read_committed readers, and anything it committed
// before it was stopped precedes, in every partition, what the new holder
// publishes. The transaction timeout is the lease period, so the broker
// also aborts a transaction whose producer went silent. Records carry
// relay-lease: "{shard}:{token}"; within a partition a shard's tokens
// never go back.
//
// # Failures
//
//   - Kafka unavailable: the batch fails, the producer is discarded (the
//     next one fences it), the worker backs off (up to MaxBackoff) and
//     retries while the keeper keeps the lease; rows stay until acknowledged,
//     and the backlog drains when the broker is back.
//   - Postgres unavailable: nothing can be read or deleted; leases expire if
//     the outage outlasts them and are re-acquired (with new tokens) after.
//   - A row the broker will never accept (over its message size limit, an
//     invalid record or timestamp): when a batch fails with such an error,
//     its rows are shipped one per transaction to find the culprit, which is
//     moved to outbox_dead with the broker's error code and text (counted in
//     onceflow_outbox_dead_rows_total{reason}); the shard keeps flowing and
//     `onceflow outbox status` lists the row. Errors an operator can fix
//     (authorization, a missing topic) are retried instead.
//   - A row whose headers are not a JSON object of strings (ingest never
//     writes one; a hand-written row may): it cannot be shipped as written,
//     so it goes to outbox_dead with reason INVALID_HEADERS before its
//     batch is produced, and the rows before it are shipped first.
//   - Either way, the statement that moves a row to outbox_dead also marks
//     its command failed in command_status (reason and detail as in
//     outbox_dead), unless the command already has an outcome, so no
//     command stays pending forever; a re-queued row's outcome replaces
//     the failure later.
//   - Wrong shard count: a relay configured with another count than the
//     outbox's lease rows refuses to start (ErrShardCount).
//
// # Wake-up
//
// Every PollInterval the dispatcher reads every idle shard's head (above).
// On Wake — called by ingest in the same process after each commit (for
// the shards this relay holds: WakeHeld), and on each notification ingest
// sends after a commit for the shards no relay of its process holds
// (postgres.OutboxChannel) —
// it reads the heads of the shards the wake-up names (the ones the commit
// wrote to; none named: every shard), and leaves word only with the busy
// workers of those shards: the others have no rows of that commit to
// read. Never NOTIFY inside the ingest transaction: it serializes commits.
//
// # Vacuum
//
// The outbox is a queue, so between autovacuum runs its (shard, xid, id)
// index fills with dead entries that every head read steps over. The
// relay holding shard 0 vacuums it (without truncating it) when dead
// tuples outnumber both 2000 and the live ones while fewer than 50,000
// rows wait; without the table's ownership it leaves it to autovacuum.
//
// # Janitor
//
// In the same process, the janitor creates daily partitions a week ahead
// and drops those past their retention, for idempotency_keys
// (IdempotencyRetention, 24h) and inbox (InboxRetention, 30 days); a table
// that is not partitioned is skipped.
package relay
