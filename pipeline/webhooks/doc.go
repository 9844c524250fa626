// Package webhooks delivers a tenant's events to the endpoints it
// subscribed, exactly once per event and subscription as far as the
// receiver can tell, on onceflow's jobs (pipeline/jobs). docs/webhooks.md
// is the user's page; this is the protocol.
//
// # From event to delivery
//
// The projector applies each event once; the webhooks projection
// (Router, a jobs.Router) runs in that transaction: for each event that an
// enabled subscription of its tenant wants, it writes one webhook_events
// row (the body every delivery sends; seq numbers it), and for each tenant
// of the batch it enqueues one webhook_fanout job naming the range of seq
// its rows got, keyed jobs.Key(the first such event's id, "webhooks") —
// whatever the number of subscriptions: what the projector's transaction
// writes per event is bounded, so one tenant's hundred subscriptions
// cannot hold back every tenant's read models. All commit with the events,
// or none does. Only a row the transaction made gets into a range: the row
// outlives River's finished jobs (cleaned after a day), so the same event
// applied again, within the retention, is not fanned out again.
//
// The fan-out (a worker's job, fanout.go) locks the range's events not
// expanded yet, as many as make MaxFanout deliveries at most (at least
// one), and in one statement writes a delivery row (webhook_deliveries,
// status pending) for each of them and each enabled subscription that
// wants it and marks them expanded; it enqueues a webhook_delivery job
// keyed jobs.Key(event id, subscription id) for each row it made (one
// InsertManyTx), and a fan-out job for the rest of the range if it
// stopped short, and completes, all in one transaction fenced by its
// attempt (jobs.Complete): a fan-out run again after a crash finds the
// events expanded or makes the same rows, which already exist, and no job
// twice. A concurrent batch of the same tenant may hold seq inside the
// range: once it commits, whichever fan-out locks its events first makes
// their deliveries, and the other finds them expanded.
//
// A tenant with one enabled subscription and fewer deliveries in flight
// than BacklogThreshold and MaxPending (Router.MaxPending) is not fanned
// out: the projection writes its events' rows expanded, a delivery row
// and a delivery job each, in the projector's transaction — one row and
// one job an event, the bound the fan-out keeps, and no fan-out hop (one
// job an event instead of two, and the fan-out's latency). Its backlog is
// counted there, at most BacklogThreshold entries of the in-flight index
// a tenant and batch; a batch can pass the cap by its events.
//
// A tenant's deliveries in flight (pending or failed) are capped
// (MaxPending): at the cap, its fan-outs wait (snoozed, spending no
// attempt) until deliveries finish — counted, logged, never dropped — and
// the tenant sees it: the waiting fan-out writes its webhook_capped row
// (capped.go; at most every few seconds a tenant and worker), which the
// API answers, and the tenant's next fan-out that runs deletes it. One
// fan-out waits a tenant (webhook_fanout_waiting, capped.go): a fan-out
// that finds another waiting leaves its events unexpanded to it and
// completes, and the waiting one, once below the cap, deletes its row in
// its first transaction and fans out every event of the tenant not
// expanded yet; a fan-out that finds the row took it before that
// transaction committed, so its events, stored before it ran, are read
// after. The projector counts a capped tenant's queued events on that row
// and stores those past Router.MaxQueued refused (no body); their
// deliveries are made dead (queue-full) with no job. A fan-out makes
// deliveries for the subscriptions enabled when the event was stored
// (disabled_at), so one disabled while the tenant waited keeps its rows. Its
// deliveries past BacklogThreshold go to the worker's backlog queue
// (jobs.Config.BacklogWorkers slots), ordered by backlog (Priority).
//
// Finished deliveries and expanded events older than Retention are
// deleted by the retention job, every hour.
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
// tenant's delivery beyond that is snoozed briefly, so one tenant's slow
// endpoint cannot take every worker from the others. A tenant with a
// backlog of its own (BacklogThreshold deliveries in flight) makes its new
// deliveries in the backlog queue: River fetches a queue's jobs in order,
// so a backlog in the queue every tenant shares would be ahead of every
// other tenant's next delivery, and churning its snoozes through every
// fetch. In the backlog queue only its own slots take them, the smaller
// backlogs first.
package webhooks
