// Command projector applies events to the Postgres read models through the inbox, exactly once.
//
// Configuration is by environment variable or flag (`projector -h`):
// KAFKA_BROKERS, DATABASE_URL, SCHEMA_REGISTRY_URL, ONCEFLOW_TOPIC_PREFIX,
// HTTP_ADDR, ADMIN_ADDR, LOG_LEVEL, LOG_FORMAT, the KAFKA_SASL_* /
// KAFKA_TLS* settings, SCHEMA_REGISTRY_USER, _PASSWORD and _CA_FILE, and
// ONCEFLOW_ADMIN_TOKEN (docs/security.md). It serves /metrics, /healthz and
// /readyz on ADMIN_ADDR and shuts down gracefully on SIGINT or SIGTERM.
package main

import (
	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/cli"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
)

func main() {
	cli.ComponentMain("projector", onceflow.Components{Projector: true}, ledgerapp.Domain())
}
