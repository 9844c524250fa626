// Package processor turns commands into events with Kafka transactions, so
// that every command has its effect on its aggregate exactly once.
//
// # The runtime
//
// A user describes an aggregate type with pure functions (DESIGN §2): a
// pipeline.Aggregate with one decide function registered per command type
// (pipeline.Handle) and one evolve. The Processor does the rest: it is one
// member of a consumer group on {prefix}.commands, reading read_committed
// through a franz-go GroupTransactSession with one transactional id per
// instance ({group}-{instance id}). For each poll batch it opens one
// transaction and, for every command in order:
//
//   - checks the headers and decodes the value; a poison record (missing or
//     bad command-id or tenant, a key that is no aggregate id or names
//     another tenant's aggregate, undecodable bytes, an unknown schema id,
//     a type no decider is registered for, a decider that panics or fails
//     with an error that is no rejection) is produced to
//     {prefix}.commands.dlq with the dlq-* reason headers, in the same
//     transaction, and the partition moves on;
//   - skips a command id its aggregate has already handled within the
//     dedup window (counted in onceflow_command_dedup_total): relay
//     re-publishes, producer retries, a redriven DLQ record that was handled
//     meanwhile;
//   - runs the decider on the aggregate's state: its events (ids derived
//     from the command id and their index, versions counting on from the
//     aggregate's) or, for a *pipeline.Rejection, one CommandRejected event
//     at the current version; and the commands it sends to other aggregates
//     (a transfer's credit, a refused credit's refund), keyed by their
//     aggregate id.
//
// Then it writes a snapshot of every aggregate the batch changed to
// {prefix}.state, at the command's partition number, and ends the
// transaction, which commits the input offsets with everything produced:
// events, commands to other aggregates, DLQ records, snapshots. Money
// moved by a transfer is therefore either debited and in flight as a
// committed credit command, or not moved at all.
//
// A decision the broker refuses for good (an event or snapshot over its
// message size limit) aborts the transaction; the batch is decided again
// at once with the command whose refused record was the largest sent to
// the DLQ (reason output-refused) rather than decided, so one oversized
// decision never stalls its partition.
//
// # State
//
// State lives in memory per assigned partition, as the snapshot values the
// committed transactions wrote (table.go): exactly what a restore reads
// back, about 100 bytes an account. A batch decodes an aggregate when it
// first touches it and stages its changes in an overlay; the overlay
// becomes the state only when the transaction commits. A state type that
// implements AvroState is encoded and decoded without reflection.
//
// On assignment, once the group's offsets are fetched (with RequireStable,
// which waits for the previous owner's transaction to end), the
// partition's state is restored from {prefix}.state, read_committed up to
// its last stable offset, before any of its commands is handled; the
// snapshots there cover exactly the commands below the committed offset,
// because both were written by the same transactions. On revocation or loss
// the partition's state is dropped. Rebalances are blocked while a batch is
// in flight.
//
// # Failures
//
// A transaction that aborts (a rebalance began, a produce failed, the
// registry could not be reached) drops its overlay; the session rewinds to
// the committed offsets and decides the batch again from the same state,
// into the same events with the same ids.
//
// A transaction whose end fails with an error has an unknown outcome: the
// broker may have committed it and lost the answer. Such a session (and a
// session whose producer was fenced: this instance was a zombie, paused
// past its session and transaction timeouts while another took its
// partitions) cannot go on. The processor drops all its state, closes the
// session and starts a new one: its producer re-initializes the
// transactional id, which fences whatever the old one left open; it
// rejoins the group, fetches the committed offsets and restores the
// committed state. Whatever the broker decided, the new session starts
// from it: nothing is decided twice, nothing is lost. New sessions back off
// (250ms doubling to 5s); sessions failing for two minutes without a
// commit end Run with the error, for the process's supervisor to act on.
//
// A process killed mid-transaction leaves the transaction open until its
// restart fences it (same instance id) or the transaction timeout aborts it;
// the partitions' next owner waits for that in its offset fetch.
//
// # Limits
//
// The dedup memory is per aggregate: an aggregate that handles many
// commands within the window carries all their ids in every snapshot
// (22 bytes each) and checks them one by one. That suits aggregates with
// up to a few thousand commands per window, not one hot aggregate taking
// millions.
package processor
