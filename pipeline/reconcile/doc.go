// Package reconcile finds what the pipeline left stuck or ambiguous and
// corrects it through commands (docs/operations.md#reconcile).
//
// # What it finds
//
// Each kind of finding is one query (or one read of the DLQ topics):
//
//   - pending: a command whose command_status is still pending after
//     Config.MaxPendingAge (15m). Still in the outbox: the relay is behind
//     or down; gone from it: a processor or the projector is;
//   - outbox-dead: a row the relay moved to outbox_dead (the broker refused
//     it for good); its command is failed;
//   - dlq: a DLQ record whose command has no accepted or rejected outcome
//     (it was not redriven successfully);
//   - inbound: a provider event stored and enqueued whose command did not
//     apply (failed, rejected, or pending past MaxPendingAge);
//   - job: a River job (a webhook delivery, an outbound call) discarded
//     after its attempts ran out: only retryable failures (no answer, a
//     timeout, a 5xx) exhaust them, so its call went out and the answer
//     was lost — it may have been applied. Its key is the job's key, the
//     Idempotency-Key of every call it made.
//
// A finding already corrected (reconcile_corrections has its kind and
// subject) is not found again.
//
// # Who decides
//
// For each finding the reconciler asks the Authority of its kind, keyed by
// the finding's Key (the command's Idempotency-Key, or the provider event
// for inbound): the service where the truth is, a payment provider's
// status API say. Its Verdict is to leave the finding for an operator
// (Leave, reported), to send the same command again under its command id (Resend:
// the processor skips an id it has handled, so a command that was in fact
// decided is not decided twice), or to send a correcting command (Command).
// A kind without an Authority is reported only: the reconciler never
// guesses.
//
// # How it corrects
//
// One transaction per correction: the reconcile_corrections row (primary
// key (kind, subject): a second reconciler running at once corrects
// nothing twice), the command into the outbox (with its pending
// command_status row when it is a new command), an audit_log row saying
// what was corrected, why and by which command, and for a resent
// outbox_dead row its removal from outbox_dead. A job's resend is River's
// retry of the job in that transaction (its webhook delivery back to
// pending): the call goes out again under the same Idempotency-Key, which
// the receiver applies once. Nothing edits a read
// model: the command's outcome arrives as every outcome does, through the
// processor and the projector.
//
// Run runs Reconcile every Config.Interval until its context ends
// (ONCEFLOW_RECONCILE_INTERVAL in the relay component).
package reconcile
