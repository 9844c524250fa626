// Package jobs runs onceflow's effects beyond its own database — outbound
// calls, webhook deliveries — as jobs on River (github.com/riverqueue/river),
// the Postgres queue, with the guarantees River leaves to its user closed
// here. docs/jobs.md is the user's page; this is the protocol.
//
// # Enqueue: an event produces its jobs once
//
// Jobs are enqueued by a projection (Projection) inside the projector's
// own transaction, with River's InsertManyTx on the projector's pgx.Tx: the
// inbox, the read models, the offsets and the jobs an event produces
// commit together or not at all, so an event the projector applies once
// produces its jobs once. Each job is unique by a key derived from the
// event id (Key: a UUIDv5 of the event id and what the job is for, such as
// a webhook subscription), River's unique_key over every state, so an
// event the inbox no longer remembers (older than its retention, a
// rebuild) finds its jobs already there and adds none.
//
// # States
//
// A job is River's: available → running (a worker fetched it; attempt n) →
// completed, or retryable (after a wait) → running (attempt n+1) …, or
// discarded (its attempts ran out) or cancelled (a permanent error:
// pipeline.Permanent). River's rescuer moves a job running for longer than
// the lease (Config.Lease) back to retryable, so a worker that died or
// hangs does not hold it: the job then runs again, possibly while the
// first attempt is still alive (a process paused past its lease).
//
// # Fencing
//
// Every attempt is named by its token, (job id, attempt). River finishes a
// job with an UPDATE that checks only that it is running; a late attempt's
// UPDATE would finish the attempt that replaced it. The fence middleware
// records the token of the attempt in the job's output
// (metadata.output.onceflow_attempt) before River writes the outcome, and
// a trigger (sql/00039_jobs.sql) in that same UPDATE refuses a token
// other than the row's current attempt: the late attempt's completion
// changes nothing. A worker's own writes (a delivery's log) go through
// Complete, which locks the job's row, checks the token and completes the
// job in the worker's transaction: a late attempt's writes are rolled back
// (ErrFenced).
//
// The effect outside the database cannot be fenced: the late attempt may
// call out after the new one did. That is why every outbound call carries
// the job's key as its Idempotency-Key (Call): the receiver sees the key
// twice and applies it once.
//
// # Retries
//
// A failed attempt is retried after a random wait up to BaseDelay ×
// 2^(attempt-1), at most MaxDelay (full jitter), or after what the
// receiver asked for (pipeline.RetryAfter, from a 429's or 503's
// Retry-After), until MaxAttempts: then the job is discarded with every
// attempt's error kept in River's errors column (`onceflow jobs`).
package jobs
