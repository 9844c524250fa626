// Command natsink forwards the events topic to a NATS JetStream stream,
// each event once as far as JetStream can tell
// (docs/consumers.md#nats-jetstream).
//
// Configuration is by environment variable or flag; `natsink -h` lists the
// settings it reads: Kafka, the topics, ADMIN_ADDR, LOG_LEVEL, LOG_FORMAT
// and ONCEFLOW_NATS_* (the server's URL, required, its credentials, the
// duplicate window, the events in flight). It needs no Postgres and no
// schema registry: it forwards the events' bytes as they are. It serves
// /metrics, /healthz and /readyz on ADMIN_ADDR and shuts down gracefully on
// SIGINT or SIGTERM: it publishes nothing more, waits for JetStream's
// acknowledgements in flight and commits what they cover.
package main

import (
	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/cli/component"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
)

func main() {
	component.Main("natsink", onceflow.Components{NATSink: true}, ledgerapp.Domain())
}
