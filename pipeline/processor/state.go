package processor

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/onceflow/onceflow/pipeline"
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

// aggregate is one aggregate in memory.
type aggregate[S any] struct {
	state     S
	version   int64
	processed []ProcessedCommand // in the order handled
	partition int32
	dirty     bool // changed in the current batch
}

func (a *aggregate[S]) seen(id pipeline.ID) bool {
	for i := range a.processed {
		if a.processed[i].CommandID == id {
			return true
		}
	}
	return false
}

// remember records id and forgets ids older than window before at. Time
// is the commands' own, so replays decide the same way.
func (a *aggregate[S]) remember(id pipeline.ID, at time.Time, window time.Duration) {
	ms := at.UnixMilli()
	cutoff := ms - window.Milliseconds()
	a.processed = slices.DeleteFunc(a.processed, func(p ProcessedCommand) bool { return p.AtMs < cutoff })
	a.processed = append(a.processed, ProcessedCommand{CommandID: id, AtMs: ms})
}

func (a *aggregate[S]) clone() *aggregate[S] {
	c := *a
	c.processed = slices.Clone(a.processed)
	return &c
}

// restore loads partition part's aggregates from the state topic, reading
// read_committed up to the last stable offset, and installs them. It uses
// raw fetch requests so it knows exactly when it has read everything below
// the last stable offset (transaction markers and compacted gaps included).
func (p *Processor[S]) restore(ctx context.Context, cl *kgo.Client, part int32) error {
	start := time.Now()
	topic := p.cfg.Topics.State()
	aggs := make(map[string]*aggregate[S])
	err := readPartition(ctx, cl, topic, part, func(r *kgo.Record) error {
		key := string(r.Key)
		if r.Value == nil { // tombstone
			delete(aggs, key)
			return nil
		}
		v, err := p.serdes.State.Decode(ctx, r.Value)
		if err != nil {
			return fmt.Errorf("decode snapshot of %s at offset %d: %w", key, r.Offset, err)
		}
		snap, ok := v.(Snapshot[S])
		if !ok {
			return fmt.Errorf("snapshot of %s at offset %d is a %T", key, r.Offset, v)
		}
		aggs[key] = &aggregate[S]{state: snap.State, version: snap.Version, processed: snap.Processed, partition: part}
		return nil
	})
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.parts[part] = aggs
	p.metrics.aggregates.Set(float64(p.countLocked()))
	p.mu.Unlock()
	p.metrics.restore.Observe(time.Since(start).Seconds())
	p.logger.Info("partition restored", "partition", part, "aggregates", len(aggs), "duration", time.Since(start))
	return nil
}

// readPartition calls fn for every committed record of topic/part from the
// start of the log up to its last stable offset at the time of the call.
func readPartition(ctx context.Context, cl *kgo.Client, topic string, part int32, fn func(*kgo.Record) error) error {
	details, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		return fmt.Errorf("metadata of %s: %w", topic, err)
	}
	td, ok := details[topic]
	if !ok || td.Err != nil {
		return fmt.Errorf("metadata of %s: %v", topic, td.Err)
	}
	pd, ok := td.Partitions[part]
	if !ok {
		return fmt.Errorf("%s has no partition %d", topic, part)
	}
	next := int64(0)
	end := int64(-1) // the last stable offset when we started
	for {
		req := kmsg.NewPtrFetchRequest()
		req.ReplicaID = -1
		req.MaxWaitMillis = 0
		req.MinBytes = 0
		req.MaxBytes = 64 << 20
		req.IsolationLevel = 1 // read_committed
		req.SessionEpoch = -1
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic = topic
		rt.TopicID = td.ID
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition = part
		rp.FetchOffset = next
		rp.CurrentLeaderEpoch = -1
		rp.LogStartOffset = -1
		rp.PartitionMaxBytes = 16 << 20
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)

		kresp, err := cl.Broker(int(pd.Leader)).RetriableRequest(ctx, req)
		if err != nil {
			return fmt.Errorf("fetch %s/%d at %d: %w", topic, part, next, err)
		}
		resp := kresp.(*kmsg.FetchResponse)
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			return fmt.Errorf("fetch %s/%d: %w", topic, part, err)
		}
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
			return fmt.Errorf("fetch %s/%d: unexpected response shape", topic, part)
		}
		presp := &resp.Topics[0].Partitions[0]
		if err := kerr.ErrorForCode(presp.ErrorCode); err != nil {
			if err == kerr.OffsetOutOfRange && next < presp.LogStartOffset {
				next = presp.LogStartOffset
				continue
			}
			return fmt.Errorf("fetch %s/%d at %d: %w", topic, part, next, err)
		}
		if end < 0 {
			end = presp.LastStableOffset
		}
		fp, after := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{
			Offset:         next,
			IsolationLevel: kgo.ReadCommitted(),
			Topic:          topic,
			Partition:      part,
		}, presp, kgo.DefaultDecompressor(), nil)
		if fp.Err != nil {
			return fmt.Errorf("read %s/%d at %d: %w", topic, part, next, fp.Err)
		}
		for _, r := range fp.Records {
			if r.Offset >= end {
				return nil
			}
			if err := fn(r); err != nil {
				return err
			}
		}
		if after <= next || after >= end {
			return nil // nothing more is readable below the end
		}
		next = after
	}
}
