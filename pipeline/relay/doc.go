// Package relay ships the outbox to Kafka and keeps Postgres tidy.
//
// Shipping: rows are read in id order, produced with an idempotent producer
// (key = aggregate id, the stored headers, timestamp = when ingest accepted
// the command), and deleted only after the broker acknowledged every one of
// them. A crash between the acknowledgement and the delete publishes the
// same rows again with the same command-id; the processor absorbs them.
// When the broker is unavailable the relay backs off and retries; rows stay
// in the outbox until they are acknowledged, so nothing is lost.
//
// Ordering: one relay ships at a time. It holds a session-level advisory
// lock on a dedicated connection while it works; another relay process
// waits for the lock and takes over when the holder's connection ends.
//
// Wake-up: Wake (called by ingest in the same process after each commit)
// or a short poll; never NOTIFY inside the ingest transaction, which would
// serialize commits.
//
// The janitor, in the same process, creates daily partitions ahead and
// drops those older than their retention.
package relay
