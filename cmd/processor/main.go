// Command processor turns commands into events with Kafka transactions (exactly-once decisions).
//
// Configuration is by environment variable or flag; `processor -h` lists
// the settings it reads (Kafka, the schema registry, the topics,
// ONCEFLOW_INSTANCE_ID, ADMIN_ADDR, its own limits;
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
	component.Main("processor", onceflow.Components{Processor: true}, ledgerapp.Domain())
}
