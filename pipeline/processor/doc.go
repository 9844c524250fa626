// Package processor turns commands into events with Kafka transactions, so
// that every command has its effect on its aggregate exactly once.
//
// # The runtime
//
// A user describes an aggregate type with pure functions
// (docs/architecture.md#identity-at-each-boundary): a pipeline.Aggregate with
// one decide function registered per command type (pipeline.Handle) and one
// evolve. The Processor does the rest: it is one member of a consumer group on
// {prefix}.commands, reading read_committed through a franz-go
// GroupTransactSession with one transactional id per instance
// ({group}-{instance id}). For each poll batch it opens one transaction and,
// for every command in order:
//
//   - checks the key, the headers and the size, decodes the value and
//     checks its fields as ingest checks an HTTP request (every string
//     UTF-8, without NUL, bounded; the command's own rules,
//     pipeline.Validator); a poison record (missing or bad command-id or
//     tenant, a key that is no valid aggregate id or names another
//     tenant's aggregate, a field that breaks a rule, a value over
//     MaxCommandBytes, a time further ahead than MaxClockSkew, undecodable
//     bytes, an unknown schema id, a type no decider is registered for, a
//     decider that panics or fails with an error that is no rejection) is
//     produced to {prefix}.commands.dlq with the dlq-* reason headers, in
//     the same transaction, and the partition moves on. When the record
//     names a valid command of a valid aggregate, a CommandFailed event
//     records the failure on the aggregate too, so the command's status is
//     failed, never pending forever;
//   - skips a command its aggregate has already handled within the dedup
//     window (counted in onceflow_command_dedup_total): relay re-publishes,
//     producer retries, a redriven DLQ record that was handled meanwhile.
//     A command is its id within its aggregate: the same id on another
//     aggregate, or in another tenant, is another command;
//   - runs the decider on the aggregate's state: its events (ids derived
//     from the command id and their index, versions counting on from the
//     aggregate's) or, for a *pipeline.Rejection, one CommandRejected event
//     at the current version; and the commands it sends to other aggregates
//     (a transfer's credit, a refused credit's refund), keyed by their
//     aggregate id.
//
// Then it writes a snapshot of every aggregate the batch changed to
// {prefix}.state and the ids of the commands it handled to {prefix}.dedup,
// both at the command's partition number, and ends the transaction, which
// commits the input offsets with everything produced: events, commands to
// other aggregates, DLQ records, snapshots, remembered ids. Money
// moved by a transfer is therefore either debited and in flight as a
// committed credit command, or not moved at all.
//
// A decision the broker refuses for good (an event or snapshot over its
// message size limit) aborts the transaction; the batch is decided again
// at once with the command whose refused record was the largest sent to
// the DLQ (reason output-refused) rather than decided, so one oversized
// decision never stalls its partition. The producer's batches fit the
// smallest max.message.bytes of the topics written, so a record refused
// for its size is refused alone (by the client, before sending) and the
// command blamed is the one at fault, never a neighbour in its batch.
//
// # State
//
// State lives in memory per assigned partition, as the snapshot values the
// committed transactions wrote (table.go): exactly what a restore reads
// back, about 80 bytes an account. A batch decodes an aggregate when it
// first touches it and stages its changes in an overlay; the overlay
// becomes the state only when the transaction commits. A state type that
// implements AvroState is encoded and decoded without reflection.
//
// On assignment, once the group's offsets are fetched (with RequireStable,
// which waits for the previous owner's transaction to end), the
// partition's state is restored from {prefix}.state and its dedup memory
// from {prefix}.dedup, each read_committed up to its high watermark at the
// start, before any of its commands is handled; the snapshots and ids there
// cover exactly the commands below the committed offset, because all were
// written by the same transactions. A transaction still open on those
// partitions (a zombie's: a processor that went silent mid-batch after its
// partitions moved on) holds their last stable offset back while later
// owners commit above it; the restore waits until it ends (the broker
// aborts it at its timeout) rather than stop short of commits the offsets
// cover. On revocation or loss the partition's state is dropped.
// Rebalances are blocked while a batch is in flight.
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
// # Dedup memory
//
// Each partition remembers the commands its aggregates handled within the
// dedup window (an idStore, dedup.go: a 16-byte digest of aggregate id and
// command id per command, 22 to 25 bytes of memory with its index), from
// when the processor handled them, by its own clock. It forgets a whole
// chunk of ids once its newest left the window, so an id is remembered for
// the window and at most a sixteenth of it longer, never shorter, at any
// rate and for the oldest id of the window too. Snapshots carry no ids, so
// their size depends on the state alone, not on the traffic. The window's
// ids are restored from {prefix}.dedup, whose records (one per partition
// and transaction, the ids that transaction added) are kept for the
// window and a day (checked at start); records older than the window are
// skipped. Snapshots written before the changelog existed still carry
// their aggregate's ids: a restore remembers them, and a new snapshot of
// the aggregate carries forward those still in the window.
package processor
