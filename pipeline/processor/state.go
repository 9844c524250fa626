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
// (pipeline.SnapshotSchema): its state and its version. Processed is what
// snapshots of earlier versions remembered for dedup (the command ids the
// aggregate handled within the window); the dedup memory now lives in the
// partition's idStore and its changelog ({prefix}.dedup), so new
// snapshots only carry such ids forward, dropping each once it leaves the
// window, and a snapshot's size no longer depends on its aggregate's
// traffic.
type Snapshot[S any] struct {
	Version   int64              `avro:"version"`
	Processed []ProcessedCommand `avro:"processed"`
	State     S                  `avro:"state"`
}

// ProcessedCommand is one remembered command id with the time it was
// remembered at.
type ProcessedCommand struct {
	CommandID pipeline.ID `avro:"command_id"`
	AtMs      int64       `avro:"at_ms"`
}

// forget drops the carried-forward ids remembered before cutoff (unix ms).
func (s *Snapshot[S]) forget(cutoff int64) {
	if len(s.Processed) > 0 {
		s.Processed = slices.DeleteFunc(s.Processed, func(p ProcessedCommand) bool { return p.AtMs < cutoff })
	}
}

// restore loads partition part's aggregates from the state topic and its
// dedup memory from the dedup changelog, reading both read_committed up to
// their high watermark at the start (with raw fetches: a consumer cannot tell
// "caught up" from "slow" when the log ends in transaction markers), and
// installs them. The offsets just fetched may cover transactions committed
// above a transaction still open on these partitions (a zombie's: a processor
// that went silent mid-batch while its partitions went on to others), so a
// restore that stopped at the last stable offset would miss their snapshots
// and ids, and decide their commands' successors from an older state
// (docs/decisions/0020-restore-waits-for-open-transactions.md); restore waits
// until the open transaction ends instead. Every snapshot is decoded once to
// check it: state that cannot be read must stop the processor here, not
// surface later as a fresh aggregate that handles commands twice. Changelog
// records older than the window are skipped without being read.
func (p *Processor[S]) restore(ctx context.Context, cl *kgo.Client, part int32) error {
	start := time.Now()
	cutoff := p.now().UnixMilli() - p.cfg.DedupWindow.Milliseconds()
	tab := newTable()
	ids := newIDStore(p.cfg.DedupWindow)
	var records, legacy int
	var scratch Snapshot[S]
	var ds []digest
	err := kafka.ReadPartitionStable(ctx, cl, p.cfg.Topics.State(), part, p.heldBack(p.cfg.Topics.State(), part), func(r *kgo.Record) error {
		records++
		if r.Value == nil { // tombstone
			tab.delete(string(r.Key))
			return nil
		}
		if err := p.codec.check(ctx, r.Value, &scratch); err != nil {
			return fmt.Errorf("snapshot of %s at offset %d: %w", r.Key, r.Offset, err)
		}
		tab.put(entry(string(r.Key), r.Value))
		// A snapshot written before the dedup changelog existed carries
		// its aggregate's ids. A later snapshot of the same aggregate
		// carries those still in the window, so remembering an id twice
		// here is harmless.
		for _, pc := range scratch.Processed {
			if pc.AtMs >= cutoff {
				ids.restored([]digest{dedupDigest(string(r.Key), pc.CommandID)}, pc.AtMs)
				legacy++
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	var changelog int
	err = kafka.ReadPartitionStable(ctx, cl, p.cfg.Topics.Dedup(), part, p.heldBack(p.cfg.Topics.Dedup(), part), func(r *kgo.Record) error {
		at := r.Timestamp.UnixMilli()
		if at < cutoff {
			return nil
		}
		var err error
		if ds, err = appendDedupRecord(ds[:0], r.Value); err != nil {
			return fmt.Errorf("dedup record at offset %d: %w", r.Offset, err)
		}
		ids.restored(ds, at)
		changelog++
		return nil
	})
	if err != nil {
		return err
	}
	ids.restoreDone()
	p.mu.Lock()
	p.parts[part] = tab
	p.ids[part] = ids
	p.updateGaugesLocked()
	p.mu.Unlock()
	p.metrics.restore.Observe(time.Since(start).Seconds())
	p.logger.Info("partition restored", "partition", part, "aggregates", tab.len(), "records", records,
		"remembered_ids", ids.len(), "dedup_records", changelog, "ids_from_snapshots", legacy, "duration", time.Since(start))
	return nil
}

// heldBack returns what a restore's read of topic/part does while a
// transaction still open holds the partition back: the first wait counts
// in onceflow_processor_restore_waits_total and is logged, and a long wait
// is logged again every 10s (the broker aborts a transaction past its
// timeout, Apache Kafka at its next sweep, so a wait that goes on names a
// producer that keeps its transaction open).
func (p *Processor[S]) heldBack(topic string, part int32) func(lastStable, end int64, waited time.Duration) {
	var logged time.Duration
	first := true
	return func(lastStable, end int64, waited time.Duration) {
		if first {
			p.metrics.restoreWaits.Inc()
		}
		if first || waited-logged >= 10*time.Second {
			p.logger.Warn("restore waits for a transaction still open on the partition to end",
				"topic", topic, "partition", part, "last_stable_offset", lastStable, "end", end, "waited", waited.Round(time.Millisecond))
			logged = waited
		}
		first = false
	}
}

// fencePredecessor initializes the session's transactional id at once,
// not at its first produce: the coordinator then fences the process that
// held the id before (this instance crashed and restarted, or the
// processor's previous session) and aborts the transaction it left open.
// Until then that transaction holds the last stable offset of its
// partitions, and every restore of them (this instance's and the other
// members') waits for it (restore) — the transaction timeout and the
// broker's next sweep, seconds, after a kill -9. A failure is logged
// only: the first produce initializes the id anyway.
func (p *Processor[S]) fencePredecessor(ctx context.Context, cl *kgo.Client) {
	if _, _, err := cl.ProducerID(ctx); err != nil && ctx.Err() == nil {
		p.logger.Warn("initialize the transactional id", "transactional_id", p.cfg.TransactionalID(), "err", err)
	}
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
