package kafka_test

import (
	"context"
	"math"
	"strings"
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

	// The same figures as Prometheus metrics.
	c := kafka.NewLagCollector(pipelinetest.Client(t, brokers), nil)
	for _, s := range sources[:2] {
		c.Add(s)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	err = testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP kafka_consumergroup_group_lag Records between the group's committed offset and the partition's last stable offset.
# TYPE kafka_consumergroup_group_lag gauge
kafka_consumergroup_group_lag{group="kafka-group",partition="0",topic="lagged"} 4
kafka_consumergroup_group_lag{group="kafka-group",partition="1",topic="lagged"} 0
kafka_consumergroup_group_lag{group="pg-consumer",partition="0",topic="lagged"} 0
kafka_consumergroup_group_lag{group="pg-consumer",partition="1",topic="lagged"} 3
`), "kafka_consumergroup_group_lag")
	if err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(c, "kafka_consumergroup_group_lag_seconds"); n != 4 {
		t.Errorf("%d lag_seconds series, want 4", n)
	}
}
