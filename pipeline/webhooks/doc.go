// Package webhooks delivers a tenant's events to the endpoints it
// subscribed, exactly once per event and subscription as far as the
// receiver can tell, on onceflow's jobs (pipeline/jobs). docs/webhooks.md
// is the user's page; this is the protocol.
//
// # From event to delivery
//
// The projector applies each event once; the webhooks projection
// (Router, a jobs.Router) runs in that transaction: it reads the
// tenant's enabled subscriptions whose event types match, and for each
// writes a delivery row (webhook_deliveries, status pending) and enqueues a
// webhook_delivery job whose key is jobs.Key(event id, subscription id).
// Both commit with the event, or neither does. Only a row the transaction
// made gets a job: the row outlives River's finished jobs (cleaned after
// a day), so the same event applied again, however much later, is not
// sent again.
//
// # One delivery
//
// A worker (Deliverer) takes the job and, unless the delivery's row says
// it was already delivered (an earlier attempt whose River completion was
// lost: counted in onceflow_worker_idempotency_skipped_total, not sent
// again), POSTs the event to the subscription's URL, signed per Standard
// Webhooks: webhook-id is the event id, webhook-timestamp the attempt's
// Unix time, webhook-signature "v1,<base64 HMAC-SHA256 of id.timestamp.body>"
// with each of the subscription's secrets (two during a rotation), and
// Idempotency-Key the job key. The answer decides:
//
//   - 2xx: delivered. The row (status, answer, time) is written in one
//     statement fenced by the attempt (jobs.Fence: only while the attempt
//     holds the job); River then completes the job in its batch. A crash in
//     between runs the job again, and that attempt finds the row delivered
//     and sends nothing.
//   - 410 Gone: the endpoint is disabled (no more deliveries to it) and
//     the delivery is dead.
//   - 429 and 503 with Retry-After, 408, 425, 5xx, no answer: failed, retried
//     (jobs.Call's classes); the last error is in the row.
//   - another 4xx: dead.
//
// Every failure also counts against the endpoint's circuit breaker
// (failures, open_until in webhook_subscriptions, shared by every
// worker): after BreakerFailures failures in a row it opens for
// BreakerCooldown, and deliveries to it are snoozed (no attempt spent)
// until then; one success closes it.
//
// A worker keeps what it read of a subscription (URL, secrets, status,
// breaker) for CacheTTL (1 s), so the hot path is the request and one
// write; a rotation or another worker's breaker reaches it within that,
// and a delivery is never ended on a cached read (disabled, deleted): it
// reads again first.
//
// # Guarding the network
//
// A URL is any http or https URL, but the worker dials only public
// addresses: the address a name resolves to is checked at dial time
// (Guard), so a name that resolves to any special-purpose range (IANA's
// registries: loopback, private, link-local with cloud metadata, NAT64,
// 6to4, Teredo, ...), multicast or IPv6 outside global unicast is
// refused, whatever it resolved to when the subscription was made, unless
// an allow-listed network contains it. An IPv6 address that carries an
// IPv4 one (NAT64, 6to4, Teredo, IPv4-compatible) is judged on that IPv4
// address too, whatever is allowed: allowing a translator's prefix does
// not open loopback through it. Redirects are not followed.
//
// # Fairness
//
// A worker runs at most MaxPerTenant deliveries of one tenant at once; a
// tenant's delivery beyond that is snoozed briefly, so one tenant's
// backlog or slow endpoint cannot take every worker from the others.
package webhooks
