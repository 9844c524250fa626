// Command relay ships the Postgres outbox to {prefix}.commands and runs the retention janitor.
//
// Configuration is by environment variable or flag (`relay -h`):
// KAFKA_BROKERS, DATABASE_URL, SCHEMA_REGISTRY_URL, ONCEFLOW_TOPIC_PREFIX,
// ONCEFLOW_INSTANCE_ID, ONCEFLOW_OUTBOX_SHARDS, ADMIN_ADDR, LOG_LEVEL,
// LOG_FORMAT, the KAFKA_SASL_* / KAFKA_TLS* settings, SCHEMA_REGISTRY_USER,
// _PASSWORD and _CA_FILE, and ONCEFLOW_ADMIN_TOKEN (docs/security.md), plus
// the relay's own ONCEFLOW_RELAY_LEASE and ONCEFLOW_RELAY_BATCH_SIZE. It
// serves /metrics, /healthz and /readyz on ADMIN_ADDR and shuts down
// gracefully on SIGINT or SIGTERM (finishing its batches in flight and
// handing its shards over).
package main

import (
	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/cli"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
)

func main() { cli.ComponentMain("relay", onceflow.Components{Relay: true}, ledgerapp.Domain()) }
