package kafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ReadPartition calls fn for every record of topic/part from the start of
// the log up to its end at the time of the call: the last stable offset
// when committed (read_committed: aborted records skipped), else the high
// watermark.
//
// It issues raw fetch requests so it knows exactly when it has read
// everything below the end: a consumer cannot tell "caught up" from "slow"
// when the log ends in transaction markers or a compacted gap, but the
// offsets a fetch response covers say so.
func ReadPartition(ctx context.Context, cl *kgo.Client, topic string, part int32, committed bool, fn func(*kgo.Record) error) error {
	_, err := ReadPartitionFrom(ctx, cl, topic, part, 0, committed, fn)
	return err
}

// ReadPartitionFrom is ReadPartition from offset from on (or from the log
// start, if retention deleted what lies before it): it calls fn for every
// record from there up to the end at the time of the call and returns
// where a later call goes on reading (the end it read to), so a reader
// that keeps up with a topic reads each record once.
func ReadPartitionFrom(ctx context.Context, cl *kgo.Client, topic string, part int32, from int64, committed bool, fn func(*kgo.Record) error) (int64, error) {
	isolation, level := kgo.ReadCommitted(), int8(1)
	if !committed {
		isolation, level = kgo.ReadUncommitted(), 0
	}
	details, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		return from, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	td, ok := details[topic]
	if !ok || td.Err != nil {
		return from, fmt.Errorf("metadata of %s: %v", topic, td.Err)
	}
	pd, ok := td.Partitions[part]
	if !ok {
		return from, fmt.Errorf("%s has no partition %d", topic, part)
	}
	next := max(from, 0)
	end := int64(-1) // fixed by the first response
	for {
		req := kmsg.NewPtrFetchRequest()
		req.ReplicaID = -1
		req.MaxWaitMillis = 0
		req.MinBytes = 0
		req.MaxBytes = 64 << 20
		req.IsolationLevel = level
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
			return next, fmt.Errorf("fetch %s/%d at %d: %w", topic, part, next, err)
		}
		resp := kresp.(*kmsg.FetchResponse)
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			return next, fmt.Errorf("fetch %s/%d: %w", topic, part, err)
		}
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
			return next, fmt.Errorf("fetch %s/%d: unexpected response shape", topic, part)
		}
		presp := &resp.Topics[0].Partitions[0]
		if err := kerr.ErrorForCode(presp.ErrorCode); err != nil {
			if errors.Is(err, kerr.OffsetOutOfRange) && next < presp.LogStartOffset {
				next = presp.LogStartOffset
				continue
			}
			return next, fmt.Errorf("fetch %s/%d at %d: %w", topic, part, next, err)
		}
		if end < 0 {
			end = presp.LastStableOffset
			if !committed {
				end = presp.HighWatermark
			}
		}
		fp, after := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{
			Offset:         next,
			IsolationLevel: isolation,
			Topic:          topic,
			Partition:      part,
		}, presp, kgo.DefaultDecompressor(), nil)
		if fp.Err != nil {
			return next, fmt.Errorf("read %s/%d at %d: %w", topic, part, next, fp.Err)
		}
		for _, r := range fp.Records {
			if r.Offset >= end {
				return max(end, next), nil
			}
			if err := fn(r); err != nil {
				return r.Offset, err
			}
		}
		if after >= end {
			return max(end, next), nil
		}
		if after <= next {
			return next, nil // nothing more is readable below the end now; a later call goes on from here
		}
		next = after
	}
}

// ReadTopic returns every record of every partition of topic up to its end
// at the time of the call (see ReadPartition), partition by partition.
func ReadTopic(ctx context.Context, cl *kgo.Client, topic string, committed bool) ([]*kgo.Record, error) {
	details, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	td, ok := details[topic]
	if !ok || td.Err != nil {
		return nil, fmt.Errorf("metadata of %s: %v", topic, td.Err)
	}
	var out []*kgo.Record
	for _, part := range td.Partitions.Numbers() {
		err := ReadPartition(ctx, cl, topic, part, committed, func(r *kgo.Record) error {
			out = append(out, r)
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}
