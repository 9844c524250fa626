// Package component makes a binary of one component of a team's domains
// (cmd/ingest and the others): cli.Main's `ingest`, `relay`, `processor`,
// `projector`, `worker` or `natsink` as a binary of its own, with the same
// settings. It links what the component runs and not the embedded default
// (`dev`, its broker), which cli.Main's binary has (TestLeanBinaries).
package component

import (
	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/cli/internal/command"
)

// Main is the main of a binary, named name, that runs components of
// domains. The binary's name prefixes its errors.
func Main(name string, components onceflow.Components, domains ...*onceflow.Domain) {
	command.ComponentMain(name, components, domains...)
}
