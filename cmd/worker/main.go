// Command worker runs onceflow's jobs on River (docs/jobs.md): the
// deliveries of outbound webhooks (docs/webhooks.md), each exactly once
// as far as its receiver can tell.
//
// Configuration is by environment variable or flag; `worker -h` lists the
// settings it reads: Postgres, ADMIN_ADDR, LOG_LEVEL, LOG_FORMAT,
// ONCEFLOW_WORKER_* (queue, concurrency, lease, attempts, backoff) and
// ONCEFLOW_WEBHOOK_* (timeout, allowed networks, circuit breaker, share per
// tenant). It needs no Kafka. It serves /metrics, /healthz and /readyz on
// ADMIN_ADDR and shuts down gracefully on SIGINT or SIGTERM: it takes no
// new job and lets running attempts finish.
package main

import (
	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/cli/component"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
)

func main() {
	component.Main("worker", onceflow.Components{Worker: true}, ledgerapp.Domain())
}
