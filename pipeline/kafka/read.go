package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

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
	return readPartition(ctx, cl, topic, part, from, committed, nil, fn)
}

// ReadPartitionStable calls fn for every committed record of topic/part
// below the high watermark at the time of the call, and waits, as long as
// ctx lets it, while a transaction still open holds the partition's last
// stable offset below that watermark. ReadPartition would stop at the
// last stable offset; a transaction committed above it (by another
// producer, while the open one's producer was silent) would be left out.
// held, if not nil, is called before each wait with the last stable
// offset and the end the read waits for, and the time waited so far.
//
// This is how state is restored
// (docs/decisions/0020-restore-waits-for-open-transactions.md): everything
// committed by the time of the call is read, whatever another producer left
// open beneath it, and nothing that is aborted.
func ReadPartitionStable(ctx context.Context, cl *kgo.Client, topic string, part int32, held func(lastStable, end int64, waited time.Duration), fn func(*kgo.Record) error) error {
	if held == nil {
		held = func(int64, int64, time.Duration) {}
	}
	_, err := readPartition(ctx, cl, topic, part, 0, true, held, fn)
	return err
}

// readPartition reads topic/part from from on. Committed, it reads
// read_committed up to the last stable offset of its first fetch; with
// held set, up to the high watermark, waiting for the last stable offset
// to reach it. Not committed, it reads everything up to the high
// watermark.
func readPartition(ctx context.Context, cl *kgo.Client, topic string, part int32, from int64, committed bool, held func(int64, int64, time.Duration), fn func(*kgo.Record) error) (int64, error) {
	isolation, level := kgo.ReadCommitted(), int8(1)
	if !committed {
		isolation, level = kgo.ReadUncommitted(), 0
	}
	td, leader, err := partitionLeader(ctx, cl, topic, part)
	if err != nil {
		return from, err
	}
	next := max(from, 0)
	end := int64(-1) // fixed by the first response
	var waitStart time.Time
	backoff := 20 * time.Millisecond
	for {
		presp, err := fetch(ctx, cl, leader, td.ID, topic, part, next, level, 16<<20)
		if err != nil {
			return next, err
		}
		if err := kerr.ErrorForCode(presp.ErrorCode); err != nil {
			if errors.Is(err, kerr.OffsetOutOfRange) && next < presp.LogStartOffset {
				next = presp.LogStartOffset
				continue
			}
			return next, fmt.Errorf("fetch %s/%d at %d: %w", topic, part, next, err)
		}
		if end < 0 {
			end = presp.LastStableOffset
			if !committed || held != nil {
				end = presp.HighWatermark
			}
		}
		fp, after := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{
			Offset:         next,
			IsolationLevel: isolation,
			Topic:          topic,
			Partition:      part,
		}, presp, decompressor(cl), nil)
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
		if after > next {
			next = after
			continue
		}
		// Nothing more is readable below the end now. A stable read waits
		// while an open transaction holds the last stable offset at or
		// below where it is; any other read stops here, and a later call
		// goes on from here.
		if held == nil || presp.LastStableOffset > next {
			return next, nil
		}
		if waitStart.IsZero() {
			waitStart = time.Now()
		}
		held(presp.LastStableOffset, end, time.Since(waitStart))
		select {
		case <-ctx.Done():
			return next, fmt.Errorf("read %s/%d: an open transaction holds the last stable offset at %d, below %d: %w",
				topic, part, presp.LastStableOffset, end, ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
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

// BlockedBatch reports whether the first batch of records at or after
// offset of topic/part (past transaction markers and aborted records)
// decompresses beyond cl's MaxDecompressBatchBytes: a consumer with the
// same bound at offset cannot read past it (`onceflow lag` asks, for the
// partitions a group lags on). It fetches a batch at a time, a few at
// most.
func BlockedBatch(ctx context.Context, cl *kgo.Client, topic string, part int32, offset int64) (*kgo.ErrDecompressTooLarge, error) {
	td, leader, err := partitionLeader(ctx, cl, topic, part)
	if err != nil {
		return nil, err
	}
	for range 8 {
		// One byte at most: the broker still returns the whole first batch.
		presp, err := fetch(ctx, cl, leader, td.ID, topic, part, offset, 1, 1)
		if err != nil {
			return nil, err
		}
		if err := kerr.ErrorForCode(presp.ErrorCode); err != nil {
			return nil, fmt.Errorf("fetch %s/%d at %d: %w", topic, part, offset, err)
		}
		fp, next := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{Offset: offset, IsolationLevel: kgo.ReadCommitted(), Topic: topic, Partition: part},
			presp, decompressor(cl), nil)
		if e, ok := BatchTooLarge(fp.Err); ok && len(fp.Records) == 0 {
			return e, nil
		}
		if len(fp.Records) > 0 || fp.Err != nil || next <= offset {
			return nil, nil // a record, another error, or the end
		}
		offset = next // only markers or aborted records: the next batch
	}
	return nil, nil
}

// partitionLeader returns topic's metadata and the leader of its partition
// part.
func partitionLeader(ctx context.Context, cl *kgo.Client, topic string, part int32) (kadm.TopicDetail, int32, error) {
	details, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		return kadm.TopicDetail{}, 0, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	td, ok := details[topic]
	if !ok || td.Err != nil {
		return kadm.TopicDetail{}, 0, fmt.Errorf("metadata of %s: %v", topic, td.Err)
	}
	pd, ok := td.Partitions[part]
	if !ok {
		return kadm.TopicDetail{}, 0, fmt.Errorf("%s has no partition %d", topic, part)
	}
	return td, pd.Leader, nil
}

// fetch sends one fetch of topic/part at offset, of at most maxBytes
// (isolation 1: read_committed, 0: read_uncommitted), to the partition's
// leader without waiting for records, and returns the partition's
// answer; its error code is the caller's to read.
func fetch(ctx context.Context, cl *kgo.Client, leader int32, topicID [16]byte, topic string, part int32, offset int64, isolation int8, maxBytes int32) (*kmsg.FetchResponseTopicPartition, error) {
	req := kmsg.NewPtrFetchRequest()
	req.IsolationLevel = isolation
	req.MaxBytes = maxBytes
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = topic, topicID
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = part, offset, maxBytes
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	kresp, err := cl.Broker(int(leader)).RetriableRequest(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("fetch %s/%d at %d: %w", topic, part, offset, err)
	}
	resp := kresp.(*kmsg.FetchResponse)
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, fmt.Errorf("fetch %s/%d: %w", topic, part, err)
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		return nil, fmt.Errorf("fetch %s/%d: unexpected response shape", topic, part)
	}
	return &resp.Topics[0].Partitions[0], nil
}
