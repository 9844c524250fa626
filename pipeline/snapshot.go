package pipeline

import "github.com/onceflow/onceflow/schemas"

// SnapshotSchema returns the schema of the records of a state topic, a
// Snapshot of one aggregate, given the schema of the aggregate's state (one
// record, which becomes the only branch of the "state" union):
// schemas/snapshot.avsc. The processor writes and reads its snapshots with
// it (processor.Snapshot).
func SnapshotSchema(state string) string { return schemas.Snapshot(state) }
