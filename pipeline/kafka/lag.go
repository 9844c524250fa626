package kafka

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Where a consumer's committed offsets live (the OFFSETS-IN column of
// `onceflow lag`).
const (
	OffsetsInKafka    = "kafka"
	OffsetsInPostgres = "postgres"
)

// LagSource is one consumer whose lag is measured: a consumer group and its
// topics, with its offsets either committed to Kafka (Offsets nil) or kept
// elsewhere (a projector's, in Postgres) and read by Offsets.
type LagSource struct {
	Group  string
	Topics []string
	// Offsets returns the consumer's next offsets by topic and partition.
	// Nil reads the group's offsets committed to Kafka.
	Offsets func(ctx context.Context) (map[string]map[int32]int64, error)
}

func (s LagSource) offsetsIn() string {
	if s.Offsets != nil {
		return OffsetsInPostgres
	}
	return OffsetsInKafka
}

// PartitionLag is one row of `onceflow lag`: the columns of
// `kafka-consumer-groups --describe` plus where the offset lives, the last
// stable offset and the lag in seconds.
type PartitionLag struct {
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Committed is the consumer's next offset, -1 if it has none (it will
	// start at the log start).
	Committed int64  `json:"current_offset"`
	OffsetsIn string `json:"offsets_in"` // OffsetsInKafka or OffsetsInPostgres
	LogStart  int64  `json:"log_start_offset"`
	// LogEnd is the high watermark; LastStable the last stable offset
	// (below it no transaction is open). Under read_committed a consumer
	// can only reach the last stable offset: transaction markers occupy
	// offsets, so lag against the high watermark never reaches zero.
	LogEnd     int64 `json:"log_end_offset"`
	LastStable int64 `json:"last_stable_offset"`
	// Lag is LastStable minus Committed (or minus LogStart with no
	// committed offset), never negative; 0 when all that is left below
	// LastStable is transaction markers and aborted records.
	Lag int64 `json:"lag"`
	// LagSeconds is how long ago the oldest record the consumer has not
	// read yet was written (its record timestamp), 0 without lag, -1 when
	// it could not be read.
	LagSeconds float64 `json:"lag_seconds"`
	// The member that owns the partition in the group, if any.
	MemberID string `json:"consumer_id,omitempty"`
	Host     string `json:"host,omitempty"`
	ClientID string `json:"client_id,omitempty"`
}

// Lag measures every source's lag against the last stable offset.
func Lag(ctx context.Context, cl *kgo.Client, sources []LagSource) ([]PartitionLag, error) {
	adm := kadm.NewClient(cl)
	topicSet := map[string]bool{}
	for _, s := range sources {
		for _, t := range s.Topics {
			topicSet[t] = true
		}
	}
	if len(topicSet) == 0 {
		return nil, nil
	}
	topics := make([]string, 0, len(topicSet))
	for t := range topicSet {
		topics = append(topics, t)
	}
	sort.Strings(topics)
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("list end offsets: %w", err)
	}
	stables, err := adm.ListCommittedOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("list last stable offsets: %w", err)
	}
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("list start offsets: %w", err)
	}
	var groups []string
	for _, s := range sources {
		groups = append(groups, s.Group)
	}
	owners := map[string]map[string]map[int32]kadm.DescribedGroupMember{} // group -> topic -> partition
	if described, err := adm.DescribeGroups(ctx, groups...); err == nil || len(described) > 0 {
		for g, d := range described {
			owners[g] = map[string]map[int32]kadm.DescribedGroupMember{}
			for _, m := range d.Members {
				c, ok := m.Assigned.AsConsumer()
				if !ok {
					continue
				}
				for _, t := range c.Topics {
					if owners[g][t.Topic] == nil {
						owners[g][t.Topic] = map[int32]kadm.DescribedGroupMember{}
					}
					for _, p := range t.Partitions {
						owners[g][t.Topic][p] = m
					}
				}
			}
		}
	}

	var out []PartitionLag
	for _, s := range sources {
		committed, err := s.committed(ctx, adm)
		if err != nil {
			return nil, fmt.Errorf("offsets of %s: %w", s.Group, err)
		}
		for _, t := range s.Topics {
			var parts []int32
			ends.Each(func(o kadm.ListedOffset) {
				if o.Topic == t && o.Err == nil && o.Partition >= 0 {
					parts = append(parts, o.Partition)
				}
			})
			sort.Slice(parts, func(i, j int) bool { return parts[i] < parts[j] })
			for _, p := range parts {
				row := PartitionLag{Group: s.Group, Topic: t, Partition: p, OffsetsIn: s.offsetsIn(), Committed: -1, LagSeconds: 0}
				if o, ok := committed[t][p]; ok {
					row.Committed = o
				}
				e, _ := ends.Lookup(t, p)
				ls, _ := stables.Lookup(t, p)
				st, _ := starts.Lookup(t, p)
				row.LogEnd, row.LastStable, row.LogStart = e.Offset, ls.Offset, st.Offset
				from := row.Committed
				if from < row.LogStart {
					from = row.LogStart
				}
				row.Lag = max(row.LastStable-from, 0)
				if m, ok := owners[s.Group][t][p]; ok {
					row.MemberID, row.Host, row.ClientID = m.MemberID, m.ClientHost, m.ClientID
				}
				out = append(out, row)
			}
		}
	}
	lagSeconds(ctx, cl, adm, out)
	return out, nil
}

func (s LagSource) committed(ctx context.Context, adm *kadm.Client) (map[string]map[int32]int64, error) {
	if s.Offsets != nil {
		return s.Offsets(ctx)
	}
	resp, err := adm.FetchOffsetsForTopics(ctx, s.Group, s.Topics...)
	if err != nil {
		var ke *kerr.Error
		if errors.As(err, &ke) && ke == kerr.GroupIDNotFound {
			return nil, nil
		}
		return nil, err
	}
	out := map[string]map[int32]int64{}
	resp.Each(func(o kadm.OffsetResponse) {
		if o.Err != nil || o.At < 0 {
			return
		}
		if out[o.Topic] == nil {
			out[o.Topic] = map[int32]int64{}
		}
		out[o.Topic][o.Partition] = o.At
	})
	return out, nil
}

// lagSeconds fills LagSeconds of the rows with lag, from the timestamp of
// the first record a read_committed consumer would read next: small
// read_committed fetches from the consumer's offset, one request per
// partition leader and round. A consumer whose offsets up to the last
// stable offset hold only transaction markers and aborted records has
// nothing left to read: its lag is 0 (a consumer that stores "last record
// + 1" stops in front of the commit marker).
func lagSeconds(ctx context.Context, cl *kgo.Client, adm *kadm.Client, rows []PartitionLag) {
	pending := map[fetchKey]int64{} // -> offset to fetch from
	var topics []string
	seen := map[string]bool{}
	for _, r := range rows {
		if r.Lag > 0 {
			pending[fetchKey{r.Topic, r.Partition, max(r.Committed, r.LogStart), r.LastStable}] = max(r.Committed, r.LogStart)
			if !seen[r.Topic] {
				seen[r.Topic] = true
				topics = append(topics, r.Topic)
			}
		}
	}
	if len(pending) == 0 {
		return
	}
	details, err := adm.ListTopics(ctx, topics...)
	if err != nil {
		markUnknown(rows)
		return
	}
	found := map[fetchKey]time.Time{}
	nothing := map[fetchKey]bool{} // only markers and aborted records below the last stable offset
	for round := 0; round < 8 && len(pending) > 0; round++ {
		byLeader := map[int32]map[fetchKey]int64{}
		for k, off := range pending {
			pd, ok := details[k.topic].Partitions[k.part]
			if !ok {
				delete(pending, k)
				continue
			}
			if byLeader[pd.Leader] == nil {
				byLeader[pd.Leader] = map[fetchKey]int64{}
			}
			byLeader[pd.Leader][k] = off
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for leader, parts := range byLeader {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got := fetchFirst(ctx, cl, leader, details, parts)
				mu.Lock()
				defer mu.Unlock()
				for k, res := range got {
					switch {
					case res.found && res.at.Offset < k.stable:
						found[k] = res.at.Timestamp
						delete(pending, k)
					case res.found || res.next >= k.stable:
						nothing[k] = true
						delete(pending, k)
					case res.next > pending[k]:
						pending[k] = res.next // only markers so far: read on
					default:
						delete(pending, k)
					}
				}
			}()
		}
		wg.Wait()
	}
	now := time.Now()
	for i := range rows {
		r := &rows[i]
		if r.Lag == 0 {
			continue
		}
		k := fetchKey{r.Topic, r.Partition, max(r.Committed, r.LogStart), r.LastStable}
		switch {
		case nothing[k]:
			r.Lag, r.LagSeconds = 0, 0
		case !found[k].IsZero():
			r.LagSeconds = max(now.Sub(found[k]).Seconds(), 0)
		default:
			r.LagSeconds = -1
		}
	}
}

// fetchKey is one consumer position to read from.
type fetchKey struct {
	topic        string
	part         int32
	from, stable int64
}

func markUnknown(rows []PartitionLag) {
	for i := range rows {
		if rows[i].Lag > 0 {
			rows[i].LagSeconds = -1
		}
	}
}

type firstRecord struct {
	found bool
	at    *kgo.Record
	next  int64 // where to read on when nothing was found
}

// fetchFirst fetches, from one leader, the first committed record at or
// after each offset.
func fetchFirst(ctx context.Context, cl *kgo.Client, leader int32, details kadm.TopicDetails, parts map[fetchKey]int64) map[fetchKey]firstRecord {
	out := map[fetchKey]firstRecord{}
	// One request holds a partition once: keys of the same partition at
	// other offsets wait for a later round.
	type tp struct {
		topic string
		part  int32
	}
	chosen := map[tp]fetchKey{}
	for k := range parts {
		if _, dup := chosen[tp{k.topic, k.part}]; !dup {
			chosen[tp{k.topic, k.part}] = k
		}
	}
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = 0
	req.MinBytes = 0
	req.MaxBytes = 4 << 20
	req.IsolationLevel = 1 // read_committed: lag is what a read_committed consumer has left
	req.SessionEpoch = -1
	byTopic := map[string]int{}
	for p, k := range chosen {
		i, ok := byTopic[p.topic]
		if !ok {
			t := kmsg.NewFetchRequestTopic()
			t.Topic = p.topic
			t.TopicID = details[p.topic].ID
			req.Topics = append(req.Topics, t)
			i = len(req.Topics) - 1
			byTopic[p.topic] = i
		}
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition = p.part
		rp.FetchOffset = parts[k]
		rp.CurrentLeaderEpoch = -1
		rp.LogStartOffset = -1
		rp.PartitionMaxBytes = 64 << 10 // the broker still returns a whole first batch
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, rp)
	}
	kresp, err := cl.Broker(int(leader)).RetriableRequest(ctx, req)
	if err != nil {
		return out
	}
	resp := kresp.(*kmsg.FetchResponse)
	for i := range resp.Topics {
		rt := &resp.Topics[i]
		topic := rt.Topic
		if topic == "" { // newer fetch versions answer by topic id
			for name, td := range details {
				if td.ID == rt.TopicID {
					topic = name
				}
			}
		}
		for j := range rt.Partitions {
			rp := &rt.Partitions[j]
			k, ok := chosen[tp{topic, rp.Partition}]
			if !ok || rp.ErrorCode != 0 {
				continue
			}
			off := parts[k]
			fp, next := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{
				Offset: off, IsolationLevel: kgo.ReadCommitted(), Topic: topic, Partition: rp.Partition,
			}, rp, kgo.DefaultDecompressor(), nil)
			res := firstRecord{next: next}
			for _, r := range fp.Records {
				if r.Offset >= off {
					res.found, res.at = true, r
					break
				}
			}
			out[k] = res
		}
	}
	return out
}
