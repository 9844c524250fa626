package processor

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
)

// Snapshot is the value written to {prefix}.state for one aggregate
// (schemas/state.avsc): its state, its version, and the command ids it
// handled within the dedup window.
type Snapshot[S any] struct {
	Version   int64              `avro:"version"`
	Processed []ProcessedCommand `avro:"processed"`
	State     S                  `avro:"state"`
}

// ProcessedCommand is one remembered command id with its command time.
type ProcessedCommand struct {
	CommandID pipeline.ID `avro:"command_id"`
	AtMs      int64       `avro:"at_ms"`
}

// seen reports whether the aggregate has handled command id.
func (s *Snapshot[S]) seen(id pipeline.ID) bool {
	for i := range s.Processed {
		if s.Processed[i].CommandID == id {
			return true
		}
	}
	return false
}

// remember records id and forgets ids older than window before at. Time
// is the commands' own, so deciding again forgets the same ids. An id is
// remembered at its command's time or at the newest remembered one,
// whichever is later: a command older than the aggregate's newest (a DLQ
// record redriven days later, with its original time) is then remembered
// for a full window from now on, not forgotten by the next command.
func (s *Snapshot[S]) remember(id pipeline.ID, at time.Time, window time.Duration) {
	ms := at.UnixMilli()
	if n := len(s.Processed); n > 0 {
		ms = max(ms, s.Processed[n-1].AtMs)
	}
	cutoff := ms - window.Milliseconds()
	s.Processed = slices.DeleteFunc(s.Processed, func(p ProcessedCommand) bool { return p.AtMs < cutoff })
	s.Processed = append(s.Processed, ProcessedCommand{CommandID: id, AtMs: ms})
}

// lastAt is the command time of the newest remembered command, the
// snapshot record's timestamp.
func (s *Snapshot[S]) lastAt() time.Time {
	if n := len(s.Processed); n > 0 {
		return time.UnixMilli(s.Processed[n-1].AtMs)
	}
	return time.UnixMilli(0)
}

// restore loads the aggregates of partition part from the state topic,
// reading read_committed up to the last stable offset (with raw fetches: a
// consumer cannot tell "caught up" from "slow" when the log ends in
// transaction markers), and installs them.
// Every snapshot is decoded once to check it: state that cannot be read
// must stop the processor here, not surface later as a fresh aggregate
// that handles commands twice.
func (p *Processor[S]) restore(ctx context.Context, cl *kgo.Client, part int32) error {
	start := time.Now()
	topic := p.cfg.Topics.State()
	tab := newTable()
	var records int
	var scratch Snapshot[S]
	err := kafka.ReadPartition(ctx, cl, topic, part, true, func(r *kgo.Record) error {
		records++
		if r.Value == nil { // tombstone
			tab.delete(string(r.Key))
			return nil
		}
		if err := p.codec.check(ctx, r.Value, &scratch); err != nil {
			return fmt.Errorf("snapshot of %s at offset %d: %w", r.Key, r.Offset, err)
		}
		tab.put(entry(string(r.Key), r.Value))
		return nil
	})
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.parts[part] = tab
	p.metrics.aggregates.Set(float64(p.countLocked()))
	p.mu.Unlock()
	p.metrics.restore.Observe(time.Since(start).Seconds())
	p.logger.Info("partition restored", "partition", part, "aggregates", tab.len(), "records", records, "duration", time.Since(start))
	return nil
}

// restoreAll restores the given partitions, a few at a time: each is one
// sequential read of its state partition.
func (p *Processor[S]) restoreAll(ctx context.Context, cl *kgo.Client, parts []int32) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(restoreConcurrency)
	for _, part := range parts {
		g.Go(func() error {
			if err := p.restore(gctx, cl, part); err != nil {
				return fmt.Errorf("restore partition %d: %w", part, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// restoreConcurrency bounds the partitions restored at once.
const restoreConcurrency = 4
