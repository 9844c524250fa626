package kafka_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// Lag is measured against the last stable offset: an open transaction's
// records are not lag yet, a consumer stopped in front of a commit marker
// has none left, and lag in seconds is the age of the oldest record not yet
// read. Offsets come from Kafka or from elsewhere (a projector's Postgres).
func TestLagAgainstLastStableOffset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := pipelinetest.Broker(t)
	brokers := b.Addrs()
	adm := kadm.NewClient(pipelinetest.Client(t, brokers))
	const topic = "lagged"
	if _, err := adm.CreateTopic(ctx, 2, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Minute)
	older := time.Now().Add(-2 * time.Minute)

	// Partition 0: a committed transaction of 5 records (offsets 0-4, its
	// commit marker at 5), then an open one (from 6).
	txn := pipelinetest.Client(t, brokers, kgo.TransactionalID("lag-test"), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	produceTxn := func(n int, at time.Time, commit bool) {
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			if err := txn.ProduceSync(ctx, &kgo.Record{Partition: 0, Value: []byte("x"), Timestamp: at}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if commit {
			if err := txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
				t.Fatal(err)
			}
		}
	}
	produceTxn(5, old, true)
	produceTxn(3, time.Now(), false)
	// Partition 1: four plain records.
	plain := pipelinetest.Client(t, brokers, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for i := 0; i < 4; i++ {
		if err := plain.ProduceSync(ctx, &kgo.Record{Partition: 1, Value: []byte("y"), Timestamp: older}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	offsets := kadm.Offsets{}
	offsets.Add(kadm.Offset{Topic: topic, Partition: 0, At: 2, LeaderEpoch: -1})
	offsets.Add(kadm.Offset{Topic: topic, Partition: 1, At: 4, LeaderEpoch: -1})
	if _, err := adm.CommitOffsets(ctx, "kafka-group", offsets); err != nil {
		t.Fatal(err)
	}
	stored := kafka.LagSource{Group: "pg-consumer", Topics: []string{topic},
		Offsets: func(context.Context) (map[string]map[int32]int64, error) {
			return map[string]map[int32]int64{topic: {0: 5, 1: 1}}, nil
		}}
	sources := []kafka.LagSource{{Group: "kafka-group", Topics: []string{topic}}, stored, {Group: "nobody", Topics: []string{topic}}}

	rows, err := kafka.Lag(ctx, pipelinetest.Client(t, brokers), sources)
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		committed, logEnd, stable, lag int64
		seconds                        float64 // approximate; 0 exact
		in                             string
	}
	wants := map[string]want{
		"kafka-group/0": {2, 9, 6, 4, 60, kafka.OffsetsInKafka},
		"kafka-group/1": {4, 4, 4, 0, 0, kafka.OffsetsInKafka},
		"pg-consumer/0": {5, 9, 6, 0, 0, kafka.OffsetsInPostgres}, // only the commit marker is left
		"pg-consumer/1": {1, 4, 4, 3, 120, kafka.OffsetsInPostgres},
		"nobody/0":      {-1, 9, 6, 6, 60, kafka.OffsetsInKafka},
		"nobody/1":      {-1, 4, 4, 4, 120, kafka.OffsetsInKafka},
	}
	if len(rows) != len(wants) {
		t.Fatalf("got %d rows, want %d: %+v", len(rows), len(wants), rows)
	}
	for _, r := range rows {
		name := r.Group + "/" + string('0'+rune(r.Partition))
		w, ok := wants[name]
		if !ok {
			t.Errorf("unexpected row %+v", r)
			continue
		}
		if r.Committed != w.committed || r.LogEnd != w.logEnd || r.LastStable != w.stable || r.Lag != w.lag || r.OffsetsIn != w.in {
			t.Errorf("%s: got committed %d end %d stable %d lag %d in %s, want %+v", name, r.Committed, r.LogEnd, r.LastStable, r.Lag, r.OffsetsIn, w)
		}
		if w.seconds == 0 && r.LagSeconds != 0 || w.seconds > 0 && math.Abs(r.LagSeconds-w.seconds) > 10 {
			t.Errorf("%s: lag seconds %.1f, want about %.0f", name, r.LagSeconds, w.seconds)
		}
	}

	// The same figures as Prometheus metrics, with Kafka Lag Exporter's
	// labels (no member owns these partitions).
	c := kafka.NewLagCollector(pipelinetest.Client(t, brokers), nil)
	for _, s := range sources[:2] {
		c.Add(s)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	err = testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP kafka_consumergroup_group_lag Records between the group's committed offset and the partition's last stable offset.
# TYPE kafka_consumergroup_group_lag gauge
kafka_consumergroup_group_lag{client_id="unknown",cluster_name="onceflow-dev",consumer_id="unknown",group="kafka-group",member_host="unknown",partition="0",topic="lagged"} 4
kafka_consumergroup_group_lag{client_id="unknown",cluster_name="onceflow-dev",consumer_id="unknown",group="kafka-group",member_host="unknown",partition="1",topic="lagged"} 0
kafka_consumergroup_group_lag{client_id="unknown",cluster_name="onceflow-dev",consumer_id="unknown",group="pg-consumer",member_host="unknown",partition="0",topic="lagged"} 0
kafka_consumergroup_group_lag{client_id="unknown",cluster_name="onceflow-dev",consumer_id="unknown",group="pg-consumer",member_host="unknown",partition="1",topic="lagged"} 3
# HELP kafka_consumergroup_group_sum_lag The group's lag summed over its partitions, in records.
# TYPE kafka_consumergroup_group_sum_lag gauge
kafka_consumergroup_group_sum_lag{cluster_name="onceflow-dev",group="kafka-group"} 4
kafka_consumergroup_group_sum_lag{cluster_name="onceflow-dev",group="pg-consumer"} 3
# HELP kafka_partition_latest_offset The partition's last stable offset: as far as a read_committed consumer can read.
# TYPE kafka_partition_latest_offset gauge
kafka_partition_latest_offset{cluster_name="onceflow-dev",partition="0",topic="lagged"} 6
kafka_partition_latest_offset{cluster_name="onceflow-dev",partition="1",topic="lagged"} 4
`), "kafka_consumergroup_group_lag", "kafka_consumergroup_group_sum_lag", "kafka_partition_latest_offset")
	if err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(c, "kafka_consumergroup_group_lag_seconds"); n != 4 {
		t.Errorf("%d lag_seconds series, want 4", n)
	}
}

// sample is one gathered series.
type sample struct {
	labels map[string]string
	value  float64
}

// gather returns the series of reg by metric name.
func gather(t *testing.T, reg prometheus.Gatherer) map[string][]sample {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]sample{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			s := sample{labels: map[string]string{}, value: m.GetGauge().GetValue()}
			for _, l := range m.GetLabel() {
				s.labels[l.GetName()] = l.GetValue()
			}
			out[mf.GetName()] = append(out[mf.GetName()], s)
		}
	}
	return out
}

// one returns the single series of name whose labels include want.
func one(t *testing.T, got map[string][]sample, name string, want map[string]string) (sample, bool) {
	t.Helper()
	var found []sample
	for _, s := range got[name] {
		match := true
		for k, v := range want {
			if s.labels[k] != v {
				match = false
			}
		}
		if match {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Errorf("%s%v: %d series, want 1 (all: %v)", name, want, len(found), got[name])
		return sample{}, false
	}
	return found[0], true
}

// A consumer group that is none of onceflow's — a plain client that
// commits its offsets — shows in the metrics, found on the cluster, with
// its lag in records and in seconds (the age of the record at its
// committed offset), its member's labels, and Kafka Lag Exporter's
// per-group and per-partition series.
func TestLagOfAForeignGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := pipelinetest.Broker(t).Addrs()
	const topic = "orders"
	adm := kadm.NewClient(pipelinetest.Client(t, brokers))
	if _, err := adm.CreateTopic(ctx, 2, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	// Ten records on partition 0, five seconds apart and 100s old at the
	// first, so the age tells which record is the oldest unread.
	base := time.Now().Add(-100 * time.Second)
	prod := pipelinetest.Client(t, brokers, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for i := 0; i < 10; i++ {
		if err := prod.ProduceSync(ctx, &kgo.Record{Partition: 0, Value: []byte("o"), Timestamp: base.Add(time.Duration(i) * 5 * time.Second)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 4; i++ {
		if err := prod.ProduceSync(ctx, &kgo.Record{Partition: 1, Value: []byte("o"), Timestamp: base}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	// The foreign consumer reads everything, commits partition 0 up to
	// offset 6 (records 0-5) and partition 1 to its end, and stays in the
	// group.
	consumer := pipelinetest.Client(t, brokers, kgo.ConsumerGroup("billing"), kgo.ConsumeTopics(topic),
		kgo.ClientID("billing-client"), kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var got []*kgo.Record
	pollCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for len(got) < 14 {
		fs := consumer.PollFetches(pollCtx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("poll: %v", err)
		}
		got = append(got, fs.Records()...)
	}
	var commit []*kgo.Record
	for _, r := range got {
		if r.Partition == 0 && r.Offset == 5 || r.Partition == 1 && r.Offset == 3 {
			commit = append(commit, r)
		}
	}
	if err := consumer.CommitRecords(ctx, commit...); err != nil {
		t.Fatal(err)
	}
	var member kadm.DescribedGroupMember
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		d, err := adm.DescribeGroups(ctx, "billing")
		if err != nil || len(d["billing"].Members) != 1 {
			return fmt.Errorf("group billing: %+v (%v)", d, err)
		}
		member = d["billing"].Members[0]
		return nil
	})

	c := kafka.NewLagCollector(pipelinetest.Client(t, brokers), nil)
	meterClient := pipelinetest.Client(t, brokers)
	c.AddFinder(func(ctx context.Context) ([]kafka.LagSource, error) { return kafka.Groups(ctx, meterClient) })
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	m := gather(t, reg)
	labels := func(part string) map[string]string {
		return map[string]string{"cluster_name": "onceflow-dev", "group": "billing", "topic": topic, "partition": part,
			"member_host": member.ClientHost, "consumer_id": member.MemberID, "client_id": "billing-client"}
	}
	wantAge := time.Since(base.Add(30 * time.Second)).Seconds() // record 6
	for _, w := range []struct {
		name  string
		part  string
		value float64
		slack float64
	}{
		{"kafka_consumergroup_group_offset", "0", 6, 0},
		{"kafka_consumergroup_group_lag", "0", 4, 0},
		{"kafka_consumergroup_group_lag_seconds", "0", wantAge, 2},
		{"kafka_consumergroup_group_offset", "1", 4, 0},
		{"kafka_consumergroup_group_lag", "1", 0, 0},
		{"kafka_consumergroup_group_lag_seconds", "1", 0, 0},
	} {
		if s, ok := one(t, m, w.name, labels(w.part)); ok && math.Abs(s.value-w.value) > w.slack {
			t.Errorf("%s partition %s = %.1f, want %.1f", w.name, w.part, s.value, w.value)
		}
	}
	group := map[string]string{"cluster_name": "onceflow-dev", "group": "billing"}
	for _, w := range []struct {
		name  string
		value float64
		slack float64
	}{
		{"kafka_consumergroup_group_max_lag", 4, 0},
		{"kafka_consumergroup_group_sum_lag", 4, 0},
		{"kafka_consumergroup_group_max_lag_seconds", wantAge, 2},
		{"kafka_consumergroup_group_topic_sum_lag", 4, 0},
	} {
		if s, ok := one(t, m, w.name, group); ok && math.Abs(s.value-w.value) > w.slack {
			t.Errorf("%s = %.1f, want %.1f", w.name, s.value, w.value)
		}
	}
	for part, want := range map[string]float64{"0": 10, "1": 4} {
		if s, ok := one(t, m, "kafka_partition_latest_offset", map[string]string{"topic": topic, "partition": part}); ok && s.value != want {
			t.Errorf("latest offset of partition %s = %v, want %v", part, s.value, want)
		}
	}
}

// A read_committed consumer of a transactional topic that has read
// everything has lag 0, in records and seconds, although commit markers
// sit after its offset and an open transaction's records after those: lag
// is measured against the last stable offset, which the partition's
// latest offset reports too.
func TestLagOfTransactionalTopicReachesZero(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := pipelinetest.Broker(t).Addrs()
	const topic = "ledger-like"
	adm := kadm.NewClient(pipelinetest.Client(t, brokers))
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	txn := pipelinetest.Client(t, brokers, kgo.TransactionalID("lag-zero"), kgo.DefaultProduceTopic(topic))
	produce := func(n int, commit bool) {
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			if err := txn.ProduceSync(ctx, &kgo.Record{Value: []byte("e"), Timestamp: time.Now().Add(-time.Minute)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if commit {
			if err := txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
				t.Fatal(err)
			}
		}
	}
	produce(5, true)  // offsets 0-4, marker 5
	produce(5, true)  // 6-10, marker 11
	produce(2, false) // 12-13, open: the last stable offset stays 12

	consumer := pipelinetest.Client(t, brokers, kgo.ConsumerGroup("downstream"), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	c := kafka.NewLagCollector(pipelinetest.Client(t, brokers), nil)
	c.MinInterval = time.Nanosecond
	meterClient := pipelinetest.Client(t, brokers)
	c.AddFinder(func(ctx context.Context) ([]kafka.LagSource, error) { return kafka.Groups(ctx, meterClient) })
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	lag := func() (records, seconds float64) {
		m := gather(t, reg)
		want := map[string]string{"group": "downstream", "partition": "0"}
		r, _ := one(t, m, "kafka_consumergroup_group_lag", want)
		s, _ := one(t, m, "kafka_consumergroup_group_lag_seconds", want)
		if l, ok := one(t, m, "kafka_partition_latest_offset", map[string]string{"topic": topic}); ok && l.value != 12 {
			t.Errorf("latest offset %v, want the last stable offset 12", l.value)
		}
		return r.value, s.value
	}

	var read []*kgo.Record
	pollCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for len(read) < 10 {
		fs := consumer.PollFetches(pollCtx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("poll: %v", err)
		}
		read = append(read, fs.Records()...)
	}
	// Halfway: committed after the first transaction's last record, in
	// front of its marker.
	if err := consumer.CommitRecords(ctx, read[4]); err != nil {
		t.Fatal(err)
	}
	if records, seconds := lag(); records != 7 || seconds < 59 {
		t.Errorf("halfway: lag %v records, %.1f s; want 7 records (12 - 5), about 60 s", records, seconds)
	}
	// Caught up: committed at 11, the second marker's offset.
	if err := consumer.CommitRecords(ctx, read[9]); err != nil {
		t.Fatal(err)
	}
	if records, seconds := lag(); records != 0 || seconds != 0 {
		t.Errorf("caught up: lag %v records, %v s; want 0 and 0", records, seconds)
	}
}

// fetchCounter counts the fetch requests a client writes.
type fetchCounter struct{ n atomic.Int64 }

func (f *fetchCounter) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, _ error) {
	if key == 1 { // Fetch
		f.n.Add(1)
	}
}

// Lag in seconds costs a fetch only for a consumer position not seen
// before: measuring again with nobody moved reads no records, consumers at
// the same or nearby positions share one fetch, and a position that moved
// is read anew.
func TestLagSecondsAreRemembered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := pipelinetest.Broker(t).Addrs()
	const topic = "remembered"
	adm := kadm.NewClient(pipelinetest.Client(t, brokers))
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	base := time.Now().Add(-time.Hour)
	prod := pipelinetest.Client(t, brokers, kgo.DefaultProduceTopic(topic))
	for i := 0; i < 20; i++ {
		if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("r"), Timestamp: base.Add(time.Duration(i) * time.Minute)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	commit := func(group string, at int64) {
		o := kadm.Offsets{}
		o.Add(kadm.Offset{Topic: topic, Partition: 0, At: at, LeaderEpoch: -1})
		if _, err := adm.CommitOffsets(ctx, group, o); err != nil {
			t.Fatal(err)
		}
	}
	commit("a", 2)
	commit("b", 2)
	commit("c", 3)
	var fetches fetchCounter
	meter := kafka.NewLagMeter(pipelinetest.Client(t, brokers, kgo.WithHooks(&fetches)))
	sources := []kafka.LagSource{{Group: "a"}, {Group: "b"}, {Group: "c"}}
	ages := func() map[string]float64 {
		rows, err := meter.Lag(ctx, sources)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, r := range rows {
			out[r.Group] = r.LagSeconds
		}
		return out
	}
	wantAge := func(group string, got float64, offset int) {
		t.Helper()
		if want := time.Since(base.Add(time.Duration(offset) * time.Minute)).Seconds(); math.Abs(got-want) > 2 {
			t.Errorf("group %s: lag %.1f s, want %.1f (the record at %d)", group, got, want, offset)
		}
	}

	first := ages()
	wantAge("a", first["a"], 2)
	wantAge("b", first["b"], 2)
	wantAge("c", first["c"], 3)
	if n := fetches.n.Load(); n != 1 {
		t.Errorf("first measurement: %d fetches, want 1 (three consumers, two positions, one read)", n)
	}
	again := ages()
	if n := fetches.n.Load(); n != 1 {
		t.Errorf("nobody moved: %d fetches in all, want still 1", n)
	}
	if again["a"] < first["a"] {
		t.Errorf("remembered age went down: %.3f then %.3f", first["a"], again["a"])
	}
	commit("a", 15)
	moved := ages()
	wantAge("a", moved["a"], 15)
	wantAge("c", moved["c"], 3)
	if n := fetches.n.Load(); n != 2 {
		t.Errorf("a moved: %d fetches in all, want 2", n)
	}
}
