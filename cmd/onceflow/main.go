// Command onceflow is the operator CLI (docs/architecture.md#operator-cli)
// and the embedded default: `onceflow dev` runs a Kafka-compatible broker,
// a schema registry, Postgres and all five components in one process.
package main

import (
	"github.com/onceflow/onceflow/cli"
	"github.com/onceflow/onceflow/examples/ledger/ledgerapp"
)

func main() { cli.Main(ledgerapp.Domain()) }
