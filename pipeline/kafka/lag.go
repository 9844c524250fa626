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
	Group string
	// Topics the consumer reads; each of their partitions gets a row. Empty
	// (a group found on the cluster, see Groups): the partitions it has
	// committed offsets for or that are assigned to one of its members.
	Topics []string
	// Offsets returns the consumer's next offsets by topic and partition.
	// Nil reads the group's offsets committed to Kafka.
	Offsets func(ctx context.Context) (map[string]map[int32]int64, error)
	// Elsewhere, if set, returns the partitions whose offsets (from
	// Offsets) were stored against another log than the topic's now
	// (another cluster, or the topic deleted and created again): they are
	// no position on this log (PartitionLag.Foreign).
	Elsewhere func(ctx context.Context) (map[string]map[int32]bool, error)
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
	// committed offset, or a Foreign one), never negative; 0 when all that
	// is left below LastStable is transaction markers and aborted records.
	Lag int64 `json:"lag"`
	// Foreign: the committed offset is no position on this log — past its
	// end, or stored against another log (LagSource.Elsewhere) — so the
	// consumer has read none of it: its lag counts the whole log.
	Foreign bool `json:"foreign,omitempty"`
	// LagSeconds is how long ago the oldest record the consumer has not
	// read yet was written (its record timestamp), 0 without lag, -1 when
	// it could not be read.
	LagSeconds float64 `json:"lag_seconds"`
	// The member that owns the partition in the group, if any.
	MemberID string `json:"consumer_id,omitempty"`
	Host     string `json:"host,omitempty"`
	ClientID string `json:"client_id,omitempty"`
}

// Groups returns every consumer group on the cluster as a lag source with
// no topics: Lag then measures the partitions each has committed offsets
// for or has assigned to a member. A group with neither has no rows.
func Groups(ctx context.Context, cl *kgo.Client) ([]LagSource, error) {
	listed, err := kadm.NewClient(cl).ListGroups(ctx)
	if err != nil {
		return nil, fmt.Errorf("list groups: %w", err)
	}
	var out []LagSource
	for _, g := range listed.Sorted() {
		out = append(out, LagSource{Group: g.Group})
	}
	return out, nil
}

// Lag measures every source's lag against the last stable offset, once
// (LagMeter keeps what it read for the next measurement).
func Lag(ctx context.Context, cl *kgo.Client, sources []LagSource) ([]PartitionLag, error) {
	return NewLagMeter(cl).Lag(ctx, sources)
}

// LagMeter measures consumer lag again and again with what it costs kept
// small. Lag in records costs a fixed number of requests whatever the
// number of groups and partitions: one listing of the groups' offsets per
// coordinator, one description of the groups, and one request per
// partition leader for each of the start, end and last stable offsets.
//
// Lag in seconds needs the timestamp of the first record each consumer has
// not read, which only a fetch can tell. The meter remembers it per
// partition and consumer position: the log below the last stable offset
// never changes, so a consumer that has not moved since the last
// measurement costs nothing, consumers at the same position share one
// fetch, and one fetch answers every position it read past. A fetch asks
// for at most 64 KiB per partition (a broker still returns a whole first
// record batch) from the consumer's position on, 64 partitions a request,
// never the log from its start. Per measurement it therefore costs about
// one partition fetch per region of 64 KiB holding positions that moved,
// plus up to maxMarkerReads more where a position sits on transaction
// markers or aborted records, and never more than maxLagFetches partition
// fetches; what it remembers is one entry per distinct lagging position,
// dropped as soon as no consumer is there any more.
//
// Its memory and a measurement's rows grow with groups × partitions. One
// LagMeter measures one set of sources (a process's collector, the CLI);
// its methods are safe to call concurrently but run one at a time.
type LagMeter struct {
	cl  *kgo.Client
	adm *kadm.Client

	mu    sync.Mutex
	gen   uint64
	first map[position]*firstRecordAt
}

// Bounds of one measurement's fetches: of one position that finds only
// transaction markers and aborted records (it goes on from there in the
// next measurement), and of all partition fetches (64 KiB each); positions
// left over have no lag in seconds this time and are read first next time,
// the others being remembered.
const (
	maxMarkerReads = 8
	maxLagFetches  = 1024
)

// position is where a consumer will read next in a partition.
type position struct {
	topic string
	part  int32
	from  int64
}

// firstRecordAt is what the meter knows of the first record a
// read_committed consumer reads from a position: found at offset, with
// its timestamp; or none below scanned yet (only transaction markers and
// aborted records between the position and scanned).
type firstRecordAt struct {
	found   bool
	offset  int64
	at      time.Time
	scanned int64
	gen     uint64 // of the last measurement that used it
}

// NewLagMeter returns a meter measuring with cl (any client of the
// cluster; it is not closed).
func NewLagMeter(cl *kgo.Client) *LagMeter {
	return &LagMeter{cl: cl, adm: kadm.NewClient(cl), first: map[position]*firstRecordAt{}}
}

// Lag measures every source's lag against the last stable offset. Rows are
// sorted by group, topic and partition. A group that is not there or that
// this client may not describe has no rows.
func (m *LagMeter) Lag(ctx context.Context, sources []LagSource) ([]PartitionLag, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gen++
	committed, err := m.committed(ctx, sources)
	if err != nil {
		return nil, err
	}
	owners := m.owners(ctx, sources)
	want, topics := wantedPartitions(sources, committed, owners)
	if len(topics) == 0 {
		m.sweep()
		return nil, nil
	}
	offs, err := m.listOffsets(ctx, topics)
	if err != nil {
		return nil, err
	}
	elsewhere := make([]map[string]map[int32]bool, len(sources))
	for i, s := range sources {
		if s.Elsewhere != nil {
			if elsewhere[i], err = s.Elsewhere(ctx); err != nil {
				return nil, fmt.Errorf("offsets of %s: %w", s.Group, err)
			}
		}
	}
	var out []PartitionLag
	for i, s := range sources {
		for _, t := range sortedKeys(want[i]) {
			for _, p := range offs.partitions(t, want[i][t]) {
				row := PartitionLag{Group: s.Group, Topic: t, Partition: p, OffsetsIn: s.offsetsIn(), Committed: -1}
				if o, ok := committed[i][t][p]; ok {
					row.Committed = o
				}
				e, _ := offs.ends.Lookup(t, p)
				ls, _ := offs.stables.Lookup(t, p)
				st, _ := offs.starts.Lookup(t, p)
				row.LogEnd, row.LastStable, row.LogStart = e.Offset, ls.Offset, st.Offset
				row.Foreign = row.Committed > row.LogEnd || elsewhere[i][t][p]
				row.Lag = max(row.LastStable-row.from(), 0)
				if mem, ok := owners[s.Group][t][p]; ok {
					row.MemberID, row.Host, row.ClientID = mem.MemberID, mem.ClientHost, mem.ClientID
				}
				out = append(out, row)
			}
		}
	}
	sort.SliceStable(out, func(a, b int) bool {
		x, y := out[a], out[b]
		if x.Group != y.Group {
			return x.Group < y.Group
		}
		if x.Topic != y.Topic {
			return x.Topic < y.Topic
		}
		return x.Partition < y.Partition
	})
	m.lagSeconds(ctx, out)
	m.sweep()
	return out, nil
}

// Committed returns each source's next offsets by topic and partition,
// in the order of sources, as Lag reads them: its own (Offsets) or its
// Kafka group's. A group that is gone or hidden has none (nil).
func Committed(ctx context.Context, cl *kgo.Client, sources []LagSource) ([]map[string]map[int32]int64, error) {
	return NewLagMeter(cl).committed(ctx, sources)
}

// committed returns each source's committed offsets by topic and
// partition: its own (Offsets), or its Kafka group's, fetched in one
// listing per coordinator. A group that is gone or hidden has none.
func (m *LagMeter) committed(ctx context.Context, sources []LagSource) ([]map[string]map[int32]int64, error) {
	committed := make([]map[string]map[int32]int64, len(sources))
	var inKafka []string
	for _, s := range sources {
		if s.Offsets == nil {
			inKafka = append(inKafka, s.Group)
		}
	}
	fetched := m.adm.FetchManyOffsets(ctx, inKafka...)
	for i, s := range sources {
		if s.Offsets != nil {
			offs, err := s.Offsets(ctx)
			if err != nil {
				return nil, fmt.Errorf("offsets of %s: %w", s.Group, err)
			}
			committed[i] = offs
			continue
		}
		r, ok := fetched[s.Group]
		if !ok {
			continue
		}
		if r.Err != nil {
			if skipGroup(r.Err) {
				continue
			}
			return nil, fmt.Errorf("offsets of group %s: %w", s.Group, r.Err)
		}
		offs := map[string]map[int32]int64{}
		r.Fetched.Each(func(o kadm.OffsetResponse) {
			if o.Err != nil || o.At < 0 {
				return
			}
			if offs[o.Topic] == nil {
				offs[o.Topic] = map[int32]int64{}
			}
			offs[o.Topic][o.Partition] = o.At
		})
		committed[i] = offs
	}
	return committed, nil
}

// owners returns who owns each partition, by group, topic and partition
// (a projector's Kafka group has its name); none when the groups cannot
// be described.
func (m *LagMeter) owners(ctx context.Context, sources []LagSource) map[string]map[string]map[int32]kadm.DescribedGroupMember {
	groups := make([]string, len(sources))
	for i, s := range sources {
		groups[i] = s.Group
	}
	owners := map[string]map[string]map[int32]kadm.DescribedGroupMember{}
	described, err := m.adm.DescribeGroups(ctx, groups...)
	if err != nil && len(described) == 0 {
		return owners
	}
	for g, d := range described {
		owners[g] = map[string]map[int32]kadm.DescribedGroupMember{}
		for _, mem := range d.Members {
			c, ok := mem.Assigned.AsConsumer()
			if !ok {
				continue
			}
			for _, t := range c.Topics {
				if owners[g][t.Topic] == nil {
					owners[g][t.Topic] = map[int32]kadm.DescribedGroupMember{}
				}
				for _, p := range t.Partitions {
					owners[g][t.Topic][p] = mem
				}
			}
		}
	}
	return owners
}

// wantedPartitions returns the partitions of each source by topic (a nil
// set: every partition of the topic) and every topic, sorted: a source's
// Topics whole, else the partitions it has offsets for or owns.
func wantedPartitions(sources []LagSource, committed []map[string]map[int32]int64,
	owners map[string]map[string]map[int32]kadm.DescribedGroupMember) ([]map[string]map[int32]bool, []string) {
	want := make([]map[string]map[int32]bool, len(sources))
	topicSet := map[string]bool{}
	for i, s := range sources {
		want[i] = map[string]map[int32]bool{}
		if len(s.Topics) > 0 {
			for _, t := range s.Topics {
				want[i][t] = nil
				topicSet[t] = true
			}
			continue
		}
		add := func(t string, p int32) {
			if want[i][t] == nil {
				want[i][t] = map[int32]bool{}
			}
			want[i][t][p] = true
			topicSet[t] = true
		}
		for t, ps := range committed[i] {
			for p := range ps {
				add(t, p)
			}
		}
		for t, ps := range owners[s.Group] {
			for p := range ps {
				add(t, p)
			}
		}
	}
	return want, sortedKeys(topicSet)
}

// listedOffsets are the topics' end, last stable and start offsets.
type listedOffsets struct {
	ends, stables, starts kadm.ListedOffsets
}

func (m *LagMeter) listOffsets(ctx context.Context, topics []string) (listedOffsets, error) {
	var o listedOffsets
	var err error
	if o.ends, err = m.adm.ListEndOffsets(ctx, topics...); err != nil {
		return o, fmt.Errorf("list end offsets: %w", err)
	}
	if o.stables, err = m.adm.ListCommittedOffsets(ctx, topics...); err != nil {
		return o, fmt.Errorf("list last stable offsets: %w", err)
	}
	if o.starts, err = m.adm.ListStartOffsets(ctx, topics...); err != nil {
		return o, fmt.Errorf("list start offsets: %w", err)
	}
	return o, nil
}

// partitions are topic's partitions in parts (nil: all of them), sorted.
func (o listedOffsets) partitions(topic string, parts map[int32]bool) []int32 {
	var out []int32
	o.ends.Each(func(l kadm.ListedOffset) {
		if l.Topic == topic && l.Err == nil && l.Partition >= 0 && (parts == nil || parts[l.Partition]) {
			out = append(out, l.Partition)
		}
	})
	sort.Slice(out, func(a, b int) bool { return out[a] < out[b] })
	return out
}

// from is where the consumer has read this log up to: its committed
// offset, or the log start when it has none, retention deleted what it had
// not read, or the offset is not a position on this log (Foreign).
func (r PartitionLag) from() int64 {
	if r.Foreign {
		return r.LogStart
	}
	return max(r.Committed, r.LogStart)
}

// skipGroup reports whether a group's offsets error means the group has no
// rows rather than that the measurement failed: it is gone, or this client
// may not see it (a cluster-wide view shows what it is allowed to).
func skipGroup(err error) bool {
	var ae *kadm.AuthError
	return errors.Is(err, kerr.GroupIDNotFound) || errors.Is(err, kerr.GroupAuthorizationFailed) || errors.As(err, &ae)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// sweep forgets the positions no consumer was at in this measurement.
func (m *LagMeter) sweep() {
	for k, f := range m.first {
		if f.gen != m.gen {
			delete(m.first, k)
		}
	}
}

// lagSeconds fills LagSeconds of the rows with lag, from the timestamp of
// the first record a read_committed consumer would read next. A consumer
// whose offsets up to the last stable offset hold only transaction markers
// and aborted records has nothing left to read: its lag is 0 (a consumer
// that stores "last record + 1" stops in front of the commit marker).
func (m *LagMeter) lagSeconds(ctx context.Context, rows []PartitionLag) {
	// What each lagging row needs, known or to fetch.
	pending := map[position]readOn{}
	for _, r := range rows {
		if r.Lag == 0 {
			continue
		}
		k := position{r.Topic, r.Partition, r.from()}
		f := m.first[k]
		if f == nil {
			f = &firstRecordAt{scanned: k.from}
			m.first[k] = f
		}
		f.gen = m.gen
		if !f.found && f.scanned < r.LastStable {
			pending[k] = readOn{from: f.scanned, stable: r.LastStable}
		}
	}
	if len(pending) > 0 {
		m.fetchFirst(ctx, pending)
	}
	now := time.Now()
	for i := range rows {
		r := &rows[i]
		if r.Lag == 0 {
			continue
		}
		f := m.first[position{r.Topic, r.Partition, r.from()}]
		switch {
		case f.found && f.offset < r.LastStable:
			r.LagSeconds = max(now.Sub(f.at).Seconds(), 0)
		case f.found || f.scanned >= r.LastStable: // only markers and aborted records to read
			r.Lag, r.LagSeconds = 0, 0
		default:
			r.LagSeconds = -1
		}
	}
}

// fetchFirst reads, for each pending position, on from its offset until it
// finds the first committed record, within the bounds of a measurement.
// Each round fetches the lowest pending offset of every partition, one
// request per leader and up to 64 partitions; a response answers every
// pending position of its partition that lies within what it read, so
// consumers close to each other share a fetch and only positions far
// apart take rounds of their own.
func (m *LagMeter) fetchFirst(ctx context.Context, pending map[position]readOn) {
	var topics []string
	seen := map[string]bool{}
	for k := range pending {
		if !seen[k.topic] {
			seen[k.topic] = true
			topics = append(topics, k.topic)
		}
	}
	details, err := m.adm.ListTopics(ctx, topics...)
	if err != nil {
		return
	}
	type tp struct {
		topic string
		part  int32
	}
	drop := func(p tp) {
		for k := range pending {
			if k.topic == p.topic && k.part == p.part {
				delete(pending, k)
			}
		}
	}
	budget := maxLagFetches
	silent := map[tp]int{} // rounds a partition answered nothing
	for len(pending) > 0 && budget > 0 && ctx.Err() == nil {
		// The lowest offset to read from in each partition, by leader.
		lowest := map[tp]int64{}
		for k, r := range pending {
			p := tp{k.topic, k.part}
			if cur, ok := lowest[p]; !ok || r.from < cur {
				lowest[p] = r.from
			}
		}
		byLeader := map[int32][]fetchFrom{}
		asked := map[tp]bool{}
		for p, off := range lowest {
			pd, ok := details[p.topic].Partitions[p.part]
			switch {
			case !ok || pd.Err != nil:
				drop(p)
			case budget > 0:
				budget--
				asked[p] = true
				byLeader[pd.Leader] = append(byLeader[pd.Leader], fetchFrom{p.topic, p.part, off})
			}
		}
		answered := map[tp]bool{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for leader, froms := range byLeader {
			wg.Go(func() {
				for len(froms) > 0 {
					n := min(len(froms), 64)
					got := fetchRecords(ctx, m.cl, leader, details, froms[:n])
					mu.Lock()
					for _, g := range got {
						answered[tp{g.topic, g.part}] = true
						m.learn(pending, g)
					}
					mu.Unlock()
					froms = froms[n:]
				}
			})
		}
		wg.Wait()
		// A partition that answered nothing (an error, or left out of a
		// full response) is tried again, once.
		for p := range asked {
			if !answered[p] {
				if silent[p]++; silent[p] > 1 {
					drop(p)
				}
			}
		}
	}
}

// readOn is where a pending position is read on from, the last stable
// offset it is read up to, and how often it was read on over markers and
// aborted records in this measurement.
type readOn struct {
	from, stable int64
	reads        int
}

// fetchFrom is one partition of a fetch request.
type fetchFrom struct {
	topic string
	part  int32
	from  int64
}

// fetched is a partition's answer: the committed records it returned from
// the requested offset on, and the offset after everything it read.
type fetched struct {
	fetchFrom
	records []*kgo.Record
	next    int64
}

// learn applies a partition's answer to every pending position it covers
// (read from at or before the position, read past it).
func (m *LagMeter) learn(pending map[position]readOn, g fetched) {
	for k, r := range pending {
		if k.topic != g.topic || k.part != g.part || r.from < g.from || r.from >= g.next {
			continue
		}
		f := m.first[k]
		i := sort.Search(len(g.records), func(i int) bool { return g.records[i].Offset >= r.from })
		switch {
		case i < len(g.records):
			f.found, f.offset, f.at = true, g.records[i].Offset, g.records[i].Timestamp
			delete(pending, k)
		case g.next >= r.stable: // only markers and aborted records left
			f.scanned = g.next
			delete(pending, k)
		case r.reads+1 >= maxMarkerReads:
			f.scanned = g.next
			delete(pending, k)
		default:
			f.scanned = g.next
			pending[k] = readOn{g.next, r.stable, r.reads + 1}
		}
	}
}

// fetchRecords fetches, from one leader, read_committed, the records of
// each partition from its offset on.
func fetchRecords(ctx context.Context, cl *kgo.Client, leader int32, details kadm.TopicDetails, froms []fetchFrom) []fetched {
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = 0
	req.MinBytes = 0
	req.MaxBytes = 4 << 20
	req.IsolationLevel = 1 // read_committed: lag is what a read_committed consumer has left
	req.SessionEpoch = -1
	byTopic := map[string]int{}
	for _, f := range froms {
		i, ok := byTopic[f.topic]
		if !ok {
			t := kmsg.NewFetchRequestTopic()
			t.Topic = f.topic
			t.TopicID = details[f.topic].ID
			req.Topics = append(req.Topics, t)
			i = len(req.Topics) - 1
			byTopic[f.topic] = i
		}
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition = f.part
		rp.FetchOffset = f.from
		rp.CurrentLeaderEpoch = -1
		rp.LogStartOffset = -1
		rp.PartitionMaxBytes = 64 << 10 // the broker still returns a whole first batch
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, rp)
	}
	kresp, err := cl.Broker(int(leader)).RetriableRequest(ctx, req)
	if err != nil {
		return nil
	}
	resp := kresp.(*kmsg.FetchResponse)
	asked := map[string]map[int32]int64{}
	for _, f := range froms {
		if asked[f.topic] == nil {
			asked[f.topic] = map[int32]int64{}
		}
		asked[f.topic][f.part] = f.from
	}
	var out []fetched
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
			from, ok := asked[topic][rp.Partition]
			if !ok || rp.ErrorCode != 0 {
				continue
			}
			fp, next := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{
				Offset: from, IsolationLevel: kgo.ReadCommitted(), Topic: topic, Partition: rp.Partition,
			}, rp, decompressor(cl), nil)
			if fp.Err != nil && len(fp.Records) == 0 || next <= from {
				continue // nothing learned (a batch too large to decompress says nothing): try again next round
			}
			g := fetched{fetchFrom: fetchFrom{topic, rp.Partition, from}, next: next}
			for _, r := range fp.Records {
				if r.Offset >= from {
					g.records = append(g.records, r)
				}
			}
			out = append(out, g)
		}
	}
	return out
}
