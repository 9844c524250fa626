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

// BatchProjection is a Projection that applies a whole batch at once: a few
// set-based statements per batch instead of some per event, which is what
// lets a projector catch up on a backlog quickly. The runtime calls
// ApplyBatch instead of Apply when a projection implements it; Apply stays
// the meaning of one event (ApplyBatch of a single event must agree with it).
type BatchProjection[Tx any] interface {
	Projection[Tx]
	// ApplyBatch applies events, in log order, inside tx. It returns one
	// outcome per event, as Apply would have returned it for that event
	// applied after the ones before it: nil (applied, or nothing to do),
	// ErrDuplicate, a *VersionGapError, or a Permanent error (the event can
	// never be applied; the runtime parks its partition). A non-nil err
	// fails the whole batch, which the runtime rolls back and retries —
	// unless it is a Postgres data error (SQLSTATE class 22, 23 or 54):
	// the runtime then finds the event that raises it by applying parts of
	// the batch under savepoints, and parks that event's partition.
	//
	// A versioned read model keeps the guard of Apply: an aggregate's
	// events in the batch are applied only on top of the version they
	// follow (stored version = first event's version - 1), checked in the
	// statement that writes them.
	ApplyBatch(ctx context.Context, tx Tx, events []Event) (outcomes []error, err error)
}

// ApplyOne is Apply of a batch projection: ApplyBatch of the one event,
// its outcome.
func ApplyOne[Tx any](ctx context.Context, tx Tx, p BatchProjection[Tx], ev Event) error {
	outcomes, err := p.ApplyBatch(ctx, tx, []Event{ev})
	if err != nil {
		return err
	}
	return outcomes[0]
}
