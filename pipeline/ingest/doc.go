// Package ingest is onceflow's HTTP boundary (DESIGN §7): it authenticates a
// tenant by API key, validates a command, and accepts it exactly once per
// (tenant, Idempotency-Key).
//
// Accepting a command is one Postgres transaction:
//
//  1. take a transaction-level advisory lock on hash(tenant, key), so a
//     concurrent request with the same key waits here for the first;
//  2. look the key up in the live partitions of idempotency_keys:
//     - found with the same request hash: answer the stored response again,
//     byte for byte, with Idempotent-Replayed: true;
//     - found with another hash: 409 idempotency-key-reused, nothing written;
//  3. otherwise mint a UUIDv7 command id and insert, together, the outbox row
//     (the encoded command for the relay to ship), the pending command_status
//     row, and the key record with the response about to be sent;
//  4. commit, then answer 202 with Location: /v1/commands/{id}.
//
// If the commit fails nothing was accepted and the client retries with the
// same key. If the response is lost after the commit, the retry finds the
// key and gets the same response: the command is never created twice.
//
// A key expires after the retention (24h by default): the janitor drops
// whole daily partitions, and lookups only consider rows inside the
// retention, so a key older than that is a new request.
package ingest
