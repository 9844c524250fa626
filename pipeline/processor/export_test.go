package processor

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
)

// AtLeastOnce turns cfg into the benchmark's at-least-once baseline.
func AtLeastOnce(cfg *Config) { cfg.atLeastOnce = true }

// SetClock gives the processor configured by cfg the clock now.
func SetClock(cfg *Config, now func() time.Time) { cfg.now = now }

// Restore restores the given partitions into p without joining a group,
// as a session does on assignment.
func (p *Processor[S]) Restore(ctx context.Context, cl *kgo.Client, parts []int32) error {
	return p.restoreAll(ctx, cl, parts)
}

// Drop forgets every partition.
func (p *Processor[S]) Drop() { p.dropAll() }

// FastSnapshots reports whether the processor uses the AvroState fast path.
func (p *Processor[S]) FastSnapshots() bool { return p.codec.fast() }

// EncodeSnapshot and DecodeSnapshot expose the snapshot codec.
func (p *Processor[S]) EncodeSnapshot(ctx context.Context, snap Snapshot[S]) ([]byte, error) {
	return p.codec.appendEncode(ctx, nil, &snap)
}

func (p *Processor[S]) DecodeSnapshot(ctx context.Context, b []byte) (Snapshot[S], error) {
	return p.codec.decode(ctx, b)
}

// DecodeSnapshotPayload decodes the Avro payload of a snapshot with the
// fast path alone (for the fuzz target).
func DecodeSnapshotPayload[S any](b []byte) (Snapshot[S], error) {
	var snap Snapshot[S]
	err := decodeSnapshot(b, &snap)
	return snap, err
}

// Config returns the processor's configuration with defaults applied.
func (p *Processor[S]) Config() Config { return p.cfg }

// MaxDigestsPerRecord is how many remembered ids a dedup changelog record
// holds at most.
const MaxDigestsPerRecord = maxDigestsPerRecord

// DedupRecord is the dedup changelog record value remembering ids of
// aggregate.
func DedupRecord(aggregate string, ids []pipeline.ID) []byte {
	ds := make([]digest, len(ids))
	for i, id := range ids {
		ds[i] = dedupDigest(aggregate, id)
	}
	return dedupRecordValue(ds)
}

// Parse checks and decodes a command record as a batch at time now does:
// the command, and the DLQ reason and detail if it is poison.
func (p *Processor[S]) Parse(ctx context.Context, r *kgo.Record, now time.Time) (cmd pipeline.Command, reason, detail string, err error) {
	b := newBatch(p, ctx, nil, nil)
	b.now = now.UnixMilli()
	cmd, perr, err := b.parse(r)
	if perr != nil {
		reason, detail = perr.reason, truncate(perr.err.Error(), maxDetailBytes)
	}
	return cmd, reason, detail, err
}
