// Package ingest is onceflow's HTTP boundary (docs/ingest.md): it
// authenticates a tenant by API key, validates a command, and accepts it
// exactly once per (tenant, Idempotency-Key).
//
// # A request's way in
//
// Every route first authenticates the bearer key (401 without a valid one)
// and takes a token from the tenant's bucket (429 with Retry-After above
// the rate; buckets are per tenant, so one tenant's flood is refused
// before it reaches the database and takes nothing from another). A
// command (POST) then needs an Idempotency-Key (400 if missing, repeated
// or over 255 characters), a JSON body of at most 1 MiB (413) sent as
// application/json (415), whose fields all validate (422 listing every bad
// field: malformed JSON, unknown or repeated members, zero, negative,
// fractional or overflowing amounts, bad ids). None of these refusals
// writes anything. A valid command is encoded (Avro) and queued for an
// accept transaction.
//
// # The accept protocol
//
// For each (tenant, key) the database holds at most one live key record:
// the request hash (route, path id and the validated fields in a fixed
// order, so spelling does not matter), the command id minted when the key
// was first accepted, and the response sent. A request is, against that
// record:
//
//   - new (no record inside the retention): mint a UUIDv7 command id and
//     insert, in one transaction, the outbox row (the encoded command for
//     the relay), the pending command_status row and the key record with
//     the 202 about to be sent; answer it after the commit;
//   - a replay (record with the same hash): answer the stored response
//     again, byte for byte (status, body, Location), with
//     Idempotent-Replayed: true;
//   - a conflict (record with another hash): 409 idempotency-key-reused;
//     the first command is untouched.
//
// Replays and conflicts are counted on the key record (what `onceflow
// idempotency-check` shows) and in onceflow_api_idempotency_hits_total and
// onceflow_api_idempotency_conflicts_total.
//
// Uniqueness: idempotency_keys is partitioned by day, so Postgres cannot
// enforce a unique (tenant, key). The transaction takes an advisory lock on
// hash(tenant || '/' || key) and only then looks the key up (a new
// statement, so it sees whatever the previous holder committed). Two
// requests with one key, in one process or in two, are serialized by the
// lock: the second waits for the first's commit and replays its response.
//
// # Group commit
//
// One commit per request caps ingest at the disk's commit rate. Requests
// queue for a few committers (Config.Committers), each of which takes what
// is queued (up to Config.MaxBatch) as one transaction, sent in one round
// trip when nothing fails:
//
//	BEGIN
//	lock every idempotency key of the batch, in ascending lock id order
//	SAVEPOINT accept_batch
//	accept the batch (one statement, acceptSQL)
//	COMMIT
//
// The accept statement checks each request's API key again (a key revoked
// since the request was authenticated from the cache writes nothing and
// answers 401), looks the keys up (a new statement after the locks, so it
// sees what the previous holders committed), inserts the new commands
// (outbox, pending status, key record, one INSERT per table for the whole
// batch), counts replays and conflicts, and returns each request's outcome
// in order. Command ids and 202 bodies are minted in Go beforehand and
// dropped for requests that turn out to be replays. Locks in a consistent
// order mean two batches that share keys wait for each other instead of
// deadlocking.
//
// One request never decides another's outcome. Replays and conflicts are
// decided per request. A batch holds one request per key: a second request
// with a key already in the batch waits for the next batch, where it finds
// the first's committed record, so a replay is never sent before the
// transaction that stored its response committed. If the accept statement
// fails (Postgres then skips the rest of the pipeline, COMMIT included),
// the transaction rolls back to the savepoint and accepts the requests one
// by one, each behind its own savepoint: only the request that fails gets
// an error (500), the others commit. A committer never waits for a batch
// to fill (a lone request costs one transaction, as without grouping);
// batches grow only while requests queue behind a commit. It keeps its
// connection from batch to batch while requests keep coming, so its
// transactions never wait for the pool behind reads, and gives it back
// when the queue runs dry.
//
// # Failure handling
//
// If the database is unreachable, slow (Config.RequestTimeout) or the
// queue is full (Config.MaxPending), the request is answered 503 with
// Retry-After and the client retries with the same key. A failed
// transaction wrote nothing; a commit that succeeded but whose answer was
// lost is found by the retry, which gets the stored response: the command
// is never created twice. Broken connections are replaced and the pool
// reconnects, so ingest recovers by itself when the database returns. If
// the relay's janitor has not created today's idempotency_keys partition,
// the committer creates it and retries the batch.
//
// # Retention
//
// A key is remembered for Config.IdempotencyRetention (24h by default,
// ONCEFLOW_IDEMPOTENCY_RETENTION, shared with the relay's janitor). Lookups
// only consider records inside it, so a key older than that is a new
// request even before the janitor drops its daily partition.
//
// # Reads
//
// GET /v1/accounts/{id} and GET /v1/commands/{id} are scoped to the
// caller's tenant: another tenant's id answers 404, exactly like an id that
// does not exist. Reads look the API key up on every request. ?wait= on a
// command long-polls until its status is terminal (accepted, rejected or
// failed). A command id names a command within its tenant and aggregate:
// of a tenant's commands sharing an id (its direct Kafka producers made
// them), the id alone answers the one ingest accepted, else the earliest,
// and ?aggregate_id= picks one. The OpenAPI 3.1 document of all routes is
// served at /openapi.json (package openapi).
// # Inbound webhooks
//
// POST /v1/inbound/{provider} takes a configured provider's webhooks
// (Config.Providers, docs/inbound.md): the signature (Standard Webhooks or
// Stripe's scheme) and the signed timestamp are checked before anything
// is read or written; the event's id, type, aggregate and version are read
// where the configuration points; one transaction stores the event under
// (provider, event id) and, if it wins over its aggregate's last winner
// (precedence, then version: inbound_aggregates under its row lock),
// writes its command as the accept protocol does (outbox row, pending
// command_status row), with a command id derived from (provider, event
// id). A delivery of a stored event only counts itself and answers what
// the first did, so a crash between the commit and the answer makes no
// second command.
package ingest
