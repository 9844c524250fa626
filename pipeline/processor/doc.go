// Package processor turns commands into events with Kafka transactions.
//
// A Processor is one member of a consumer group on {prefix}.commands,
// reading read_committed through a franz-go GroupTransactSession. For each
// poll batch it opens one transaction and, for every command in order:
//
//   - checks the headers and decodes the value; a poison record (missing or
//     bad command-id or tenant, an aggregate of another tenant, undecodable
//     bytes, an unknown schema or type, a panicking decider) is produced to
//     {prefix}.commands.dlq with dlq-* reason headers and never blocks the
//     partition;
//   - skips a command id its aggregate has already handled (counted in
//     onceflow_command_dedup_total), which absorbs relay re-publishes,
//     producer retries and commands decided again after an abort;
//   - runs the pure decider on the aggregate's state and produces the
//     events (ids derived from the command id and index), the commands for
//     other aggregates, or a CommandRejected event.
//
// Then it produces a snapshot of every aggregate the batch changed to
// {prefix}.state (same partition number as the command) and ends the
// transaction, which commits the input offsets with everything produced.
//
// State lives in memory per assigned partition. Changes of a batch are
// staged in an overlay and become the state only when the transaction
// commits; on abort the overlay is dropped and the session rewinds to the
// committed offsets, so the batch is decided again from the same state and
// yields the same events with the same ids (this is what makes an
// indeterminate commit safe: a duplicate is absorbed by the projector's
// inbox).
//
// On assignment, after the group's offsets were fetched stably (which
// waits for the previous owner's transaction to finish), the partition's
// state is restored from {prefix}.state read_committed up to its last
// stable offset, before any of its commands is handled. On revocation it is
// dropped. Rebalances are blocked while a batch is in flight, so callbacks
// never race the batch.
package processor
