package pipeline

import "strings"

// SnapshotSchema returns the schema of the records of a state topic, a
// Snapshot of one aggregate, given the schema of the aggregate's state (one
// record, which becomes the only branch of the "state" union). The
// processor writes and reads its snapshots with it (processor.Snapshot).
func SnapshotSchema(state string) string {
	return `{"type": "record", "name": "Snapshot", "namespace": "onceflow",
 "doc": "A processor's snapshot of one aggregate, written to {prefix}.state in the transaction that changed it.",
 "fields": [
   {"name": "version", "type": "long", "doc": "aggregate version of the last event evolved into state"},
   {"name": "processed", "doc": "command ids handled within the dedup window, with the command time (Unix ms)",
    "type": {"type": "array", "items": {"type": "record", "name": "Processed", "fields": [
      {"name": "command_id", "type": {"type": "fixed", "name": "UUID", "size": 16}},
      {"name": "at_ms", "type": "long"}]}}},
   {"name": "state", "type": [` + strings.TrimSpace(state) + `]}
 ]}`
}
