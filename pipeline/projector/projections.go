package projector

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pipeline"
)

// applyProjection runs one projection over evs, batched when it can be. A
// panic in a batch projection fails the batch (retried, counted, logged:
// the process does not die on it); one in Apply is that event's permanent
// failure, which parks its partition.
func applyProjection(ctx context.Context, tx pgx.Tx, proj pipeline.Projection[pgx.Tx], evs []pipeline.Event) (out []error, err error) {
	if bp, ok := proj.(pipeline.BatchProjection[pgx.Tx]); ok {
		defer func() {
			if v := recover(); v != nil {
				out, err = nil, fmt.Errorf("ApplyBatch panicked: %v", v)
			}
		}()
		out, err := bp.ApplyBatch(ctx, tx, evs)
		if err == nil && len(out) != len(evs) {
			err = fmt.Errorf("ApplyBatch returned %d outcomes for %d events", len(out), len(evs))
		}
		return out, err
	}
	out = make([]error, len(evs))
	stopped := make(map[string]error) // aggregate -> the gap it stopped on
	for i, ev := range evs {
		if gap, ok := stopped[ev.AggregateID]; ok {
			out[i] = gap // nothing after a gap is applied
			continue
		}
		out[i] = applyOne(ctx, tx, proj, ev)
		var gap *pipeline.VersionGapError
		if errors.As(out[i], &gap) {
			stopped[ev.AggregateID] = out[i]
		}
		if out[i] != nil && !errors.Is(out[i], pipeline.ErrDuplicate) && gap == nil && !pipeline.IsPermanent(out[i]) {
			return nil, out[i] // a failure of the statement: the batch is retried
		}
	}
	return out, nil
}

// applyCarefully runs a projection under a savepoint. A data error aborts
// the projection's statement without saying which event caused it, so on
// one it rolls back to the savepoint and applies each half of the events
// the same way, down to the single event that raises it: that event's
// outcome is the data error (its partition parks at it), the events after
// it on its partition are not applied (the transaction runs again without
// them), the other partitions' events are. Halves are applied in order, so
// the culprit is the event whose application, after every event before it,
// fails — the one applying them one at a time would find — for about
// 2·log2(N) statements per bad event instead of N. Only a batch that has
// already failed with a data error runs so: the fast path takes no
// savepoint.
func applyCarefully(ctx context.Context, tx pgx.Tx, proj pipeline.Projection[pgx.Tx], evs []event, pevs []pipeline.Event, blame bool) ([]error, error) {
	s := search{tx: tx, proj: proj, evs: evs, pevs: pevs, out: make([]error, len(evs)), stopped: make(map[int32]bool), blame: blame}
	all := make([]int, len(evs))
	for i := range all {
		all[i] = i
	}
	if err := s.apply(ctx, all); err != nil {
		return nil, err
	}
	return s.out, nil
}

// search is applyCarefully's state.
type search struct {
	tx      pgx.Tx
	proj    pipeline.Projection[pgx.Tx]
	evs     []event
	pevs    []pipeline.Event
	out     []error        // outcomes, by index in evs
	stopped map[int32]bool // partitions that park at an event of this batch
	blame   bool           // errors of no known kind are the event's too
}

// blamed reports whether err, failing a projection over some events, is
// one of theirs: a data error, or with blame an error of no known kind.
func (s *search) blamed(err error) bool {
	_, isData := dataError(err)
	return isData || s.blame && kindOf(err) == unknown
}

// apply applies the events at idx (in log order) under a savepoint,
// halving them on a data error.
func (s *search) apply(ctx context.Context, idx []int) error {
	var todo []int
	for _, i := range idx {
		if !s.stopped[s.evs[i].partition] {
			todo = append(todo, i)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	sub := make([]pipeline.Event, len(todo))
	for j, i := range todo {
		sub[j] = s.pevs[i]
	}
	sp, err := s.tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	out, err := applyProjection(ctx, sp, s.proj, sub)
	if err == nil {
		if err := sp.Commit(ctx); err != nil {
			return fmt.Errorf("release savepoint: %w", err)
		}
		for j, i := range todo {
			s.out[i] = out[j]
			if parksPartition(out[j]) || s.blame && out[j] != nil && kindOf(out[j]) == unknown {
				s.stopped[s.evs[i].partition] = true
			}
		}
		return nil
	}
	if !s.blamed(err) {
		return err // a failure of the statement: the batch is retried
	}
	if err := sp.Rollback(ctx); err != nil {
		return fmt.Errorf("rollback to savepoint: %w", err)
	}
	if len(todo) == 1 {
		s.out[todo[0]] = err
		s.stopped[s.evs[todo[0]].partition] = true
		return nil
	}
	half := len(todo) / 2
	if err := s.apply(ctx, todo[:half]); err != nil {
		return err
	}
	return s.apply(ctx, todo[half:])
}

// parksPartition reports whether an event's outcome parks its partition.
func parksPartition(o error) bool {
	if o == nil || errors.Is(o, pipeline.ErrDuplicate) {
		return false
	}
	var gap *pipeline.VersionGapError
	_, isData := dataError(o)
	return isData || errors.As(o, &gap) || pipeline.IsPermanent(o)
}

// applyOne is Apply with a panic turned into a permanent failure.
func applyOne(ctx context.Context, tx pgx.Tx, proj pipeline.Projection[pgx.Tx], ev pipeline.Event) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = pipeline.Permanent(fmt.Errorf("Apply panicked: %v", v))
		}
	}()
	return proj.Apply(ctx, tx, ev)
}

// queuedProjection is a projection of the library's own (command_status,
// audit_log) whose statement needs no answer before the batch's last round
// trip: it reads nothing, and no projection after it reads what it
// writes. Outside a careful run the applier queues it in that round trip,
// with the offsets, instead of giving it one of its own: at a batch of one
// event each round trip is a sizeable part of the batch's time
// (docs/benchmarks.md#the-bill-cpu-per-command). queue adds evs'
// statement to b and returns their outcomes, filled once b has run (nil
// or ErrDuplicate), or false when evs need round trips of their own
// (audit_log's COPY for a large batch): ApplyBatch then runs.
type queuedProjection interface {
	queue(b *pgx.Batch, evs []pipeline.Event) ([]error, bool)
}

// queuedOutcomes are a queued projection's outcomes.
type queuedOutcomes struct {
	name string
	out  []error
}

// blameOn makes the errors of qs, the statements a queued projection
// added to the batch, that projection's: a data error among them then
// makes the batch run again carefully, as a projection's own would.
func blameOn(qs []*pgx.QueuedQuery, name string) {
	for _, q := range qs {
		fn := q.Fn
		q.Fn = func(br pgx.BatchResults) error {
			var err error
			if fn != nil {
				err = fn(br)
			} else {
				_, err = br.Exec()
			}
			if err != nil {
				return &projectionError{name, err}
			}
			return nil
		}
	}
}

// countQueued counts the duplicates among the queued projections'
// outcomes, once their statements have run.
func (res *result) countQueued(queued []queuedOutcomes) error {
	for _, q := range queued {
		for _, o := range q.out {
			switch {
			case o == nil:
			case errors.Is(o, pipeline.ErrDuplicate):
				res.duplicates++
			default:
				return &projectionError{q.name, o}
			}
		}
	}
	return nil
}
