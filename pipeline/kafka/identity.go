package kafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TopicIdentity is what an offset of a topic counts: the cluster's id and
// the topic's id (KIP-516) as the brokers report them. A topic deleted and
// created again, or the same name on another cluster, has another identity
// and another log, whose offsets start again at 0.
type TopicIdentity struct {
	ClusterID string
	// TopicID is zero when the brokers report no topic ids (before Kafka
	// 2.8).
	TopicID [16]byte
}

// Differs reports whether an offset stored against i counts another log
// than one of o: another cluster, or another topic id (a zero id, not
// reported, differs from none).
func (i TopicIdentity) Differs(o TopicIdentity) bool {
	if i.ClusterID != o.ClusterID {
		return true
	}
	return i.TopicID != [16]byte{} && o.TopicID != [16]byte{} && i.TopicID != o.TopicID
}

// String is how the identity reads in a park's detail and the audit:
// cluster CLUSTER, topic id ID.
func (i TopicIdentity) String() string {
	id := "unknown"
	if i.TopicID != [16]byte{} {
		id = kadm.TopicID(i.TopicID).String()
	}
	return fmt.Sprintf("cluster %s, topic id %s", i.ClusterID, id)
}

// LogRange is a partition's log: its first offset and its end (the high
// watermark, the offset the next record gets).
type LogRange struct{ Start, End int64 }

// Contains reports whether off is a position a consumer can read from: at
// or after the log start, at or before its end.
func (r LogRange) Contains(off int64) bool { return off >= r.Start && off <= r.End }

// DescribeTopic returns topic's identity on the cluster cl speaks to and
// the range of each of its partitions' logs.
func DescribeTopic(ctx context.Context, cl *kgo.Client, topic string) (TopicIdentity, map[int32]LogRange, error) {
	adm := kadm.NewClient(cl)
	md, err := adm.Metadata(ctx, topic)
	if err != nil {
		return TopicIdentity{}, nil, fmt.Errorf("describe topic %s: %w", topic, err)
	}
	d, ok := md.Topics[topic]
	if !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
		return TopicIdentity{}, nil, missingTopicError(topic)
	}
	if d.Err != nil {
		return TopicIdentity{}, nil, fmt.Errorf("describe topic %s: %w", topic, d.Err)
	}
	id := TopicIdentity{ClusterID: md.Cluster, TopicID: d.ID}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return id, nil, fmt.Errorf("list start offsets of %s: %w", topic, err)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return id, nil, fmt.Errorf("list end offsets of %s: %w", topic, err)
	}
	logs := make(map[int32]LogRange)
	starts.Each(func(o kadm.ListedOffset) {
		e, _ := ends.Lookup(topic, o.Partition)
		logs[o.Partition] = LogRange{Start: o.Offset, End: e.Offset}
	})
	return id, logs, nil
}
