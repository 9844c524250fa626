package ledger

import (
	_ "embed"
	"fmt"

	"github.com/onceflow/onceflow/pipeline"
)

// The ledger's Avro schemas: the value schemas of its commands topic (a
// union with a record per command type) and its events topic (a record per
// event type, CommandRejected and CommandFailed among them), and the
// Account state that its snapshots wrap. The record name is the
// command-type / event-type header.
//
// Evolve them compatibly (docs/schemas.md#evolving-schemas): add fields
// with defaults, add union branches at the end, never rename or remove a
// record. Readers decode with the writer's schema (by id) and fill what it
// lacks from these defaults. A registry checks each new version when a
// component registers it at start (BACKWARD unless the subject says
// otherwise) and the component refuses to start if it is incompatible.
var (
	//go:embed commands.avsc
	CommandsSchema string
	//go:embed events.avsc
	EventsSchema string
	//go:embed account.avsc
	AccountSchema string
)

// Schema kinds, the topic suffixes of the ledger's schemas.
const (
	Commands = "commands"
	Events   = "events"
	State    = "state"
)

// SchemaOf returns the value schema of the ledger's topic of kind
// (Commands, Events, or State: the snapshot wrapping Account), as the
// registry holds it.
func SchemaOf(kind string) (string, error) {
	switch kind {
	case Commands:
		return CommandsSchema, nil
	case Events:
		return EventsSchema, nil
	case State:
		return pipeline.SnapshotSchema(AccountSchema), nil
	}
	return "", fmt.Errorf("ledger has no %q schema", kind)
}
