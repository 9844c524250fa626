// Package status serves the status page on a process's admin address
// (docs/architecture.md#observability): the pipeline's flow with the
// rates and per-stage latencies the components export, consumer lag per
// group and partition with a plot of the last 15 minutes, the outbox's
// depth and age, the DLQ by reason, parked partitions with their reason,
// and two actions, unparking a partition and redriving DLQ records.
//
// # Routes
//
//	GET  /status           the page (HTML, JavaScript and CSS embedded in the binary)
//	GET  /status.json      everything the page shows; the page polls it
//	POST /status/unpark    {"consumer","topic","partition"}          behind the operator token
//	POST /status/redrive   {"topic","records":["P:O",...]} or {"topic","reason"}   behind the operator token
//
// # Where the figures come from
//
// The figures come from the process's Prometheus registry, the one
// /metrics serves, gathered when /status.json is built: a total on the
// page is the sum of the series of its metric on /metrics at that moment,
// by construction. Rates and quantiles need a past reading too: a sampler
// gathers the registry every Interval (10 s) and keeps what the page
// tracks of each reading for History (15 min) in a ring, one column of
// float64 per series; a rate is the counter's increase since the reading
// a Window (1 min) ago, a quantile is read from the increase of the
// histogram's buckets over the same window, interpolated as Prometheus's
// histogram_quantile does. Lag is Kafka Lag Exporter's series that the
// process exports (ONCEFLOW_LAG_EXPORT; none when it is off), keyed by
// group, topic and partition.
//
// Three things are not in the registry and are read when the page asks:
// parked and retrying partitions (projector_parked, projector_retrying; in
// a process with a database), at most once per DatabaseInterval (2 s)
// however many ask, and what the DLQ topics hold, read on from where the
// last reading stopped (kafka.ReadPartitionFrom) at most once per
// DLQInterval, so a page left open costs a fetch of the new records. A
// reading runs once for all who ask meanwhile: whoever reaches the admin
// address cannot multiply what the page costs the database.
//
// The stages the page shows are the table in flow.go: a new metric of a
// stage is a line there.
//
// # What it shows to whom
//
// /status and /status.json answer anyone who reaches the admin address,
// like /metrics (docs/security.md): so they show counts, topics, groups,
// partitions, offsets and reasons, never a tenant, key, command id or an
// error's text (a parked partition's detail, a DLQ record's key, the
// error a retried batch failed with): those are in `onceflow lag` and
// `onceflow dlq list`, for operators with the database's and the broker's
// credentials, and in the log.
//
// The actions are added with admin.Server.Act: they answer only requests
// bearing ONCEFLOW_ADMIN_TOKEN (compared in constant time) and are
// disabled when it is unset, which the page says. The page asks for the
// token in its confirmation dialog and sends it in a header, never keeps
// it beyond the request, and never shows it.
package status
