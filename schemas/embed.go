// Package schemas holds the Avro schemas of the ledger's topics, embedded:
// commands.avsc, events.avsc and state.avsc are the value schemas of
// {prefix}.commands, {prefix}.events and {prefix}.state (subjects
// "{topic}-value", TopicNameStrategy). Each is a union of the record types
// the topic carries; the record name is the command-type / event-type
// header.
//
// Evolve them compatibly (docs/schemas.md#evolving-schemas): add fields
// with defaults, add union branches at the end, never rename or remove a
// record. Readers decode with the writer's schema (by id) and fill what it
// lacks from these defaults. A registry checks each new version when a
// component registers it at start (BACKWARD unless the subject says
// otherwise) and the component refuses to start if it is incompatible.
package schemas

import "embed"

// FS holds the .avsc files.
//
//go:embed *.avsc
var FS embed.FS

// Topic suffixes, joined to the topic prefix as "{prefix}.{suffix}".
const (
	Commands = "commands"
	Events   = "events"
	State    = "state"
)

// File returns the schema file of a topic suffix.
func File(suffix string) string { return suffix + ".avsc" }
