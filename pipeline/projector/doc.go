// Package projector applies events to Postgres read models with
// exactly-once effects.
//
// A Projector is a member of a consumer group on {prefix}.events, reading
// read_committed. Its positions live in Postgres (consumer_offsets), not in
// Kafka: on assignment they are loaded from there (a partition without a
// row starts at the beginning of the log), overriding whatever the group
// has committed in Kafka.
//
// Each poll batch is one Postgres transaction:
//
//  1. insert every event id of the batch into the inbox at once
//     (ON CONFLICT DO NOTHING RETURNING): the ids that come back are new;
//  2. for the new events, in offset order, call each projection's Apply; a
//     versioned projection guards its update with version = event version
//     - 1 and reports a duplicate (counted, skipped) or a gap;
//  3. upsert the next offset of every partition in the batch;
//  4. commit. Only then are the same offsets committed to Kafka, for
//     monitoring, so standard lag tools see the group.
//
// A crash anywhere before the commit leaves nothing behind and the batch is
// read again from the stored offsets; after the commit, the inbox and the
// version guards absorb any re-delivery.
//
// A version gap (an event above the stored version + 1) means an earlier
// event is missing. The projector never skips it: the batch is rolled back,
// the partition is parked (paused, onceflow_projector_version_gaps_total and
// onceflow_projector_parked_partitions) and the rest of the batch is
// applied without it. A parked partition stays parked until the process
// restarts, after an operator has looked at it. An event that cannot be
// decoded parks its partition the same way.
package projector
