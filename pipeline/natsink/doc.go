// Package natsink forwards the events topic to a NATS JetStream stream,
// each event once as far as JetStream can tell: a second sink for events,
// beside the Kafka topic, for consumers that speak NATS.
//
// # The runtime
//
// A Sink is a member of a consumer group on {prefix}.events, reading
// read_committed (an aborted transaction's events are never forwarded).
// Its progress is the group's offsets in Kafka; its memory of what it sent
// is JetStream's: every message carries the event id as Nats-Msg-Id, and
// the stream drops a message whose id it has stored within its duplicate
// window (the acknowledgement says Duplicate). For each poll batch:
//
//  1. publish the records in the order they were fetched (each
//     partition's in offset order), asynchronously, with at most
//     Config.MaxInFlight waiting for JetStream's acknowledgement (PubAck);
//  2. take each acknowledgement: a new message
//     (onceflow_natsink_events_published_total) or a duplicate
//     (onceflow_natsink_duplicates_total); either way JetStream holds the
//     event;
//  3. commit, per partition, the offset after the last record that was
//     acknowledged with every record before it. Nothing is committed past
//     a record JetStream has not acknowledged.
//
// A crash after JetStream's acknowledgements and before the commit leaves
// the offsets behind: the next owner of the partition (this process
// restarted, or another member after the session timeout) reads the
// records again and publishes them with the same ids, and JetStream drops
// them. That holds within the stream's duplicate window only. A re-publish
// after it (the sink down longer than the window between acknowledgement
// and commit) is stored again as a new message with the same Nats-Msg-Id:
// the limit of the guarantee, which Config.DuplicateWindow sizes, and the
// reason a NATS consumer still applies each event once by its id
// (docs/consumers.md#nats-jetstream). The events topic itself may hold an
// event twice (a command decided again after the processor's dedup
// window); within the window the stream keeps the first.
//
// # Messages
//
// An event goes to {Subject}.{tenant}.{event-type} (Subject, SubjectToken:
// the two tokens escaped so a tenant cannot add a token or a wildcard),
// its payload the record's value as it is: the Confluent wire format (byte
// 0, the schema id, the Avro datum), decoded by the writer's schema as on
// Kafka. Its headers are the event's (event-id, event-type, command-id,
// aggregate-version, tenant, command-type, traceparent), Nats-Msg-Id, and
// what Kafka holds outside its headers: aggregate-id (the key), event-time
// (the record's timestamp), kafka-partition and kafka-offset. A record
// without a valid event-id (the processor writes none; any producer
// could) is forwarded with its topic position as message id, as stable as
// an event id, and counted (onceflow_natsink_records_without_event_id_total).
//
// # Order
//
// The stream takes a connection's messages in the order they are sent, so a
// batch published without a failure is in the stream in partition order: each
// aggregate's events in version order. A publish that fails stops the round
// (nothing more is published); once the messages in flight settled, the sink
// waits (50ms doubling to MaxBackoff) and publishes the records not
// acknowledged again, in order. A record that failed while one behind it in
// flight was stored then lands after it: that aggregate's events are out of
// order in the stream. The sink sees it from the acknowledgements' sequences
// and counts it (onceflow_natsink_out_of_order_total, logged with the
// aggregate). nats.go's own retry is off (it would overtake), and so is its
// reconnect buffer (a publish while disconnected fails at once rather than
// being sent after the reconnect, ahead of the retry of what the disconnect
// lost). MaxInFlight 1 keeps the order through failures too, at the price of
// one round trip per event
// (docs/benchmarks.md#nats-sink-events-forwarded-to-jetstream).
//
// # Failures
//
// JetStream unreachable (the connection down, no server answering for the
// stream, no acknowledgement within AckTimeout) or refusing a message (over
// a size limit, storage full): the batch is published again, with backoff,
// for as long as it lasts; nothing is committed meanwhile, so the group's
// lag grows and `onceflow lag` shows it, and each failed publish is counted
// by class (onceflow_natsink_publish_errors_total; onceflow_natsink_connected
// is 0 while the connection is down). Nothing is skipped. Rebalances are
// blocked while a batch is in flight. A commit that fails (Kafka away, the
// member no longer in the group) is logged and counted
// (onceflow_natsink_commits_total{result="failed"}): a later commit covers
// it, or the partition's next owner publishes the records again and
// JetStream drops them.
//
// # The stream
//
// At start the sink creates the stream if it does not exist (Config.Stream;
// subjects {Subject}.>, file storage, Config.Replicas, no limits, the
// duplicate window). A stream that exists is used as its operator made
// it, or refused — Run returns the error — when its duplicate window is
// shorter than Config.DuplicateWindow or its subjects do not take
// {Subject}.>. The sink never changes a stream. While JetStream cannot be
// reached at start, it waits.
//
// # Shutdown
//
// When Run's context ends the sink publishes nothing more, waits for the
// acknowledgements in flight (each settles within AckTimeout), commits
// what was acknowledged, and leaves the group.
//
// # Crash points
//
// Config.Hold is a test hook called once JetStream acknowledged every
// record of a batch, before the commit (HoldAcked); the end-to-end tests
// use it (HoldInDir, armed by a file) to kill the real process exactly
// there. It is nil in production.
package natsink
