// Command ingest is onceflow's HTTP ingest: it accepts commands with Idempotency-Key into the Postgres outbox (docs/ingest.md).
//
// Configuration is by environment variable or flag; `ingest -h` lists the
// settings it reads (Kafka, the schema registry, Postgres, the topics,
// HTTP_ADDR, ADMIN_ADDR, the outbox's, its own limits and providers;
// README.md#running-the-components-separately). It serves /metrics,
// /healthz and /readyz on ADMIN_ADDR and shuts down gracefully on SIGINT
// or SIGTERM.
package main

import (
	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/cli/component"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
)

func main() { component.Main("ingest", onceflow.Components{Ingest: true}, ledgerapp.Domain()) }
