// Package schemas holds the wire schemas of what onceflow itself puts on
// a domain's topics, embedded (README.md lists them all, with the formats
// that are not Avro, and says where a domain's own schemas live and how
// every schema's compatibility is checked): the snapshot that wraps an
// aggregate's state on {prefix}.state, and the outcome events every
// domain's events topic carries, CommandRejected and CommandFailed.
//
// It imports nothing of onceflow, so that the vocabulary (package
// pipeline) may use it.
package schemas

import (
	_ "embed"
	"strconv"
	"strings"
)

var (
	//go:embed snapshot.avsc
	snapshot string
	//go:embed outcomes.avsc
	outcomes string
)

// statePlaceholder is the record of snapshot.avsc's state union that an
// aggregate's state record replaces.
const statePlaceholder = `{"type": "record", "name": "State", "doc": "the aggregate's state record takes this place", "fields": []}`

// Snapshot returns the schema of the records of a state topic given the
// schema of the aggregate's state (one record): snapshot.avsc with the
// state record as the only branch of its "state" union.
func Snapshot(state string) string {
	return strings.Replace(strings.TrimSuffix(snapshot, "\n"), statePlaceholder, strings.TrimSpace(state), 1)
}

// OutcomeRecords returns the records of outcomes.avsc (CommandRejected,
// CommandFailed) in namespace, as branches to add to a domain's events
// union: the text between the file's brackets.
func OutcomeRecords(namespace string) string {
	records := strings.TrimSuffix(strings.TrimPrefix(outcomes, "["), "\n]\n")
	return strings.ReplaceAll(records, `"namespace": "onceflow"`, `"namespace": `+strconv.Quote(namespace))
}
