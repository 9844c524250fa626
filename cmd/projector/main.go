// Command projector applies events to the Postgres read models through the inbox, exactly once.
//
// Configuration is by environment variable or flag; `projector -h` lists
// the settings it reads (Kafka, the schema registry, Postgres, the topics,
// ADMIN_ADDR, its own, and the queue and attempts of the jobs it enqueues;
// README.md#running-the-components-separately). It serves /metrics,
// /healthz and /readyz on ADMIN_ADDR and shuts down gracefully on SIGINT
// or SIGTERM.
package main

import (
	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/cli/component"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
)

func main() {
	component.Main("projector", onceflow.Components{Projector: true}, ledgerapp.Domain())
}
