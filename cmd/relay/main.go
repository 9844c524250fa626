// Command relay ships the Postgres outbox to {prefix}.commands and runs the retention janitor.
//
// Configuration is by environment variable or flag; `relay -h` lists the
// settings it reads (Kafka, the schema registry, Postgres, the topics,
// ONCEFLOW_INSTANCE_ID, ADMIN_ADDR, the outbox's, its own
// ONCEFLOW_RELAY_LEASE, ONCEFLOW_RELAY_BATCH_SIZE and
// ONCEFLOW_RECONCILE_INTERVAL; README.md#running-the-components-separately).
// It serves /metrics, /healthz and /readyz on ADMIN_ADDR and shuts down
// gracefully on SIGINT or SIGTERM (finishing its batches in flight and
// handing its shards over).
package main

import (
	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/cli/component"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
)

func main() { component.Main("relay", onceflow.Components{Relay: true}, ledgerapp.Domain()) }
