// Package projector applies events to Postgres read models with
// exactly-once effects, and rebuilds a read model from the events topic
// while the old one keeps serving.
//
// # The runtime
//
// A Projector is a member of a consumer group on {prefix}.events, reading
// read_committed. A user registers projections (pipeline.Projection: Go
// code that applies events inside the given transaction; a
// pipeline.BatchProjection applies a whole batch with a few set-based
// statements); the runtime owns batching, the inbox, offsets and parking.
//
// Positions live in Postgres (consumer_offsets), not in Kafka: on
// assignment they are loaded from there (a partition without a row starts
// at the beginning of the log), overriding whatever the group committed in
// Kafka. A poll batch is split by partition into up to Config.Parallelism
// groups (a partition's records stay together and in order), each applied
// in a Postgres transaction of its own, concurrently:
//
//  1. lock the offset row of every partition in the batch (created at 0 if
//     missing), in partition order. Records below the stored offset were
//     applied by someone else (a zombie member that had not noticed it lost
//     the partition, or its successor) and are skipped
//     (onceflow_projector_fenced_records_total). Every writer of a
//     partition takes this lock first, so writers of one partition are
//     serialized. A stored offset below the one this projector last stored
//     or loaded means the database lost commits: nothing is applied, and
//     the partition is read again from the stored offset (Asynchronous
//     commit, below);
//  2. the inbox: look the batch's event ids up (onceflow_inbox_seen) and
//     insert the new ones; only those reach the projections, each once even
//     if the batch holds it twice. Ids already there are duplicates
//     (onceflow_projector_duplicates_total);
//  3. each projection applies the new events. A versioned read model
//     guards its writes with version = event version - 1 and classifies an
//     event as applied, a duplicate (at or below the stored version,
//     counted) or a gap (above the stored version + 1);
//  4. store the next offset of every partition (never lower than stored),
//     and the parked partitions, and notify the batch's commands' outcomes
//     to ingest (postgres.OutcomesChannel), in one round trip; commit.
//     Only then are the same offsets committed to Kafka, for monitoring
//     only (standard lag tools see the group).
//
// # Asynchronous commit
//
// The transaction commits with synchronous_commit off (set in step 1's
// round trip): visible at once, durable within the WAL writer's delay. A
// database crash can lose the last batches whole, offsets included; the
// events are still in Kafka, and the consumer is already past them. So
// the projector remembers each partition's offset as it last stored or
// loaded it, and compares: in step 1 of every batch, and every second
// while idle (a partition that gets no new event would otherwise never be
// looked at). Behind, it seeks the partition back to the stored offset
// (onceflow_projector_rewinds_total). With Config.SynchronousCommit each
// commit waits for its flush instead, and the notification follows the
// commit on its own (a notifying transaction holds a lock that serializes
// notifying commits until its commit is flushed). docs/projector.md says
// what a crash then means for a reader.
//
// # Failures
//
// A crash (or a connection the server terminates) anywhere before the
// commit leaves nothing behind: the batch is read again from the stored
// offsets, by this process after a retry or by the next owner. A crash
// after the commit loses only the Kafka copy of the offsets, which the next
// commit repairs. Postgres unavailable: the batch is retried with backoff
// (onceflow_projector_batch_errors_total); a registry that cannot be
// reached likewise. Every error a projection returns is classified
// (classify): a data error, pipeline.Permanent or a gap is permanent and
// parks its event (below); one of a class known to pass (the connection,
// a serialization failure, a missing table) is transient, retried for as
// long as it lasts; any other is of no known kind, retried
// Config.MaxUnknownFailures times in a row and then taken as its event's,
// found and parked as a data error is (reason projection-error), never
// retried for ever. The runtime's own errors are transient. Retrying is
// never silent: counted by class, the batch's partitions shown as retrying
// (onceflow_projector_retrying_partitions, and a projector_retrying row
// per partition, written best-effort outside the failed transaction and
// deleted by the next transaction that commits one of its batches), logged
// at the first failure and then every 30 seconds, alerted after ten
// minutes.
//
// # Parking
//
// A partition stops (parks) on a record that cannot be applied: a version gap
// (an earlier event of the aggregate is missing; never skipped), an event
// that cannot be decoded, one a projection refuses for good
// (pipeline.Permanent), or one a projection's SQL raises a data error on
// (SQLSTATE class 22, 23 or 54: the same event fails the same way on every
// try; docs/decisions/0029-projection-errors-classified.md). A data error
// aborts a batch projection's statement without naming the event, so the
// transaction is first run again with each projection under a savepoint, and
// the failing projection's events are applied in halves, each under a
// savepoint of its own, down to the event that raises it (the fast path takes
// no savepoint). Then the transaction is rolled back and run again with the
// events before that record, its offset as the partition's stored offset, and
// a projector_parked row (reason, detail) — so `onceflow lag` shows it, and
// onceflow_projector_version_gaps_total and
// onceflow_projector_parked_partitions (by reason) count it. Fetching from
// the partition is paused; the others go on. It stays parked until an
// operator acts: `onceflow projections unpark` (the projector notices within
// ParkCheckInterval and tries the record again) or a restart. Either way the
// record is tried again and parks again if the cause is still there. Or the
// operator skips the record on purpose (Skip, `onceflow projections skip`):
// under the offset lock, the stored offset moves past it, the park ends and
// projector_skips records who, why and what; the projector reads on from
// there as after an unpark. The row disappears once the partition moves past
// the record.
//
// # A topic that changed
//
// A stored offset counts one log: consumer_offsets records beside it the
// cluster id and topic id it was stored against (identity.go). At every
// assignment the projector describes the topic and judges each stored
// offset: another identity parks the partition (topic-changed), an
// offset outside the partition's log parks it (offset-out-of-range), an
// offset that recorded no identity and lies within the log adopts the
// topic's. The consumer has no reset policy, so a fetch out of range is
// an error, answered by judging the offset again (recheck); a topic
// recreated under the consumer (unknown topic id) makes Run join again
// with a new client, which judges every offset. Such parks are answered
// by Reset (`onceflow projections reset`), audited in projector_resets;
// Unpark leaves them and Skip refuses them.
//
// # Inbox retention and uniqueness
//
// The inbox is partitioned by received_at, one partition per UTC day
// (inbox_pYYYYMMDD), dropped after 30 days by the relay's janitor (the
// projector also creates the coming days' partitions at start). Postgres
// cannot enforce a unique (consumer, event_id) across range partitions, so
// the projector does: the lookup spans every partition an id could be in,
// and it runs after the offset lock of step 1, which serializes every
// transaction that could insert the id (an event id belongs to one
// aggregate, hence to one Kafka partition). The lookup starts a day before
// the event's command was minted when the command id is a UUIDv7 (ingest
// mints them; an event cannot be stored before its command existed), so a
// steady-state lookup reads one or two partitions instead of thirty; other
// ids are looked up in every partition.
//
// # Rebuild
//
// A Rebuild builds one projection (Rebuildable: it names its tables) into
// shadow tables, in a schema of their own (onceflow_rebuild_NAME, created
// with CREATE TABLE ... LIKE ... INCLUDING ALL), from the start of the
// events topic, under a consumer name of its own (its offsets, inbox rows
// and parked partitions are its own). Its connections put the shadow
// schema first in the search path, so the projection's SQL, which names
// tables without a schema, writes the shadow tables. It never reads past
// the live projector's stored offsets. It is resumable (state in
// projection_rebuilds) and exclusive (a session advisory lock).
//
// Once the shadow is within a batch of the live offsets, the swap is one
// transaction: lock the live projector's offset rows (every projector
// transaction starts by locking them, so the live projector waits and
// nothing moves), apply the records between the shadow's offsets and the
// live ones, check they are equal, lock the live tables against writers,
// copy what only they hold (SwapHook: command_status's pending rows),
// optionally checksum both, drop each live table and move its shadow into
// the live schema under the same name. Readers see the old table until the
// commit and the new one after it, both at the same offsets: never a
// half-built or empty read model, never a step back. Every lock wait in
// the swap is bounded (LockTimeout) so readers never queue long behind it;
// a swap that times out is tried again.
//
// # Crash points
//
// Config.Hold is a test hook called before a batch's transaction, inside
// it (everything written, not committed) and right after its commit; the
// end-to-end tests use it (HoldInDir, armed by files) to kill the real
// binary, or terminate its Postgres backend, exactly there. It is nil in
// production.
package projector
