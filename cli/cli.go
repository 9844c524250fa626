// Package cli is onceflow's command line: cli.Main makes a binary of a
// team's domains (every component, `dev`, and the operator commands
// docs/architecture.md#operator-cli lists). Every setting is an
// environment variable with a flag of the same meaning, the flag winning
// (docs/architecture.md#configuration); each command reads, and lists in
// its -h, the settings it uses. A binary of one component, which links no
// embedded broker, is cli/component's.
//
// It sits above the domain API: cmd/* imports it, it imports package
// onceflow, which imports the library (pipeline/...), in that direction
// only (TestImportRules). The commands themselves are in cli/internal/command.
package cli

import (
	"context"
	"io"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/cli/internal/command"
	"github.com/onceflow/onceflow/dev"
)

func init() { command.RunDev = dev.Run }

// Main is the main of a binary that runs domains: the operator CLI
// (docs/architecture.md#operator-cli), each component (`ingest`, `relay`,
// `processor`, `projector`, `worker`, `natsink`) and the embedded default,
// `dev`: a Kafka-compatible broker, a schema registry, Postgres and every
// component in one process. The binary's name prefixes its errors.
func Main(domains ...*onceflow.Domain) { command.Main(domains...) }

// Run runs the command args names (Main's arguments) for domains, with the
// environment getenv reads, printing to stdout. A word that only begins
// commands ("webhooks") lists them.
func Run(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	return command.Run(ctx, domains, args, getenv, stdout)
}
