// Package pipeline is onceflow's domain vocabulary: the envelope every command
// and event travels in, the headers that carry its identity across Kafka, the
// deterministic ids, the control errors handlers return, and the two
// interfaces a user implements to get the whole pipeline: a Decider (pure
// decide/evolve over one aggregate) and a Projection (applies one event to a
// read model inside the runtime's transaction).
//
// The package imports only the standard library. Adapters live in
// subpackages named after what they wrap (kafka, postgres, avro) and role
// packages (ingest, relay, processor, projector) build the runtime from them.
//
// Identity at each boundary (docs/architecture.md#identity-at-each-boundary):
//
//   - a command id is a UUIDv7 minted when ingest first accepts an
//     Idempotency-Key, or a stable id a direct Kafka producer sends in the
//     command-id header;
//   - an event id is the UUIDv5 of (command id, index of the event within the
//     command's decision), so deciding the same command again after an
//     aborted or indeterminate transaction yields the same ids;
//   - an aggregate id is "tenant/local-id" and is the Kafka record key
//     everywhere, so one aggregate's commands and events stay in order.
package pipeline
