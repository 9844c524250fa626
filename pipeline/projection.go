package pipeline

import "context"

// Projection applies events to one read model. The runtime owns everything
// around it: batching, the inbox (an event id is handed to Apply at most
// once per consumer), offsets, and the transaction Tx that Apply writes in
// (pgx.Tx for the Postgres projector).
//
// A versioned read model guards its update with version = ev.Version - 1
// and, when that matches no row, returns CheckVersion's verdict: ErrDuplicate
// (counted, skipped) or a *VersionGapError (the partition is parked).
type Projection[Tx any] interface {
	// Name identifies the read model in offsets, metrics and rebuilds.
	Name() string
	// Apply applies one event inside tx.
	Apply(ctx context.Context, tx Tx, ev Event) error
}
