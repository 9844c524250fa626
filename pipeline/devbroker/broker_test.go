package devbroker_test

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/devbroker"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// The embedded broker with a data directory keeps its topics, records and
// committed group offsets across a restart on the same port, and the
// identity of its topics (cluster id, topic id): a projector's offsets
// stored against them still fit after a plain restart of `onceflow dev`.
func TestBrokerDataDirSurvivesRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	b, err := devbroker.Start(devbroker.Config{Addr: "127.0.0.1:0", DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	addrs := b.Addrs()
	cl := pipelinetest.Client(t, addrs)
	topics := kafka.Topics{Prefix: "p", Partitions: 2}
	if err := kafka.Provision(ctx, kadm.NewClient(cl), topics); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topics.Events(), Key: []byte("a/1"), Value: []byte("v1")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	before, _, err := kafka.DescribeTopic(ctx, cl, topics.Events())
	if err != nil {
		t.Fatal(err)
	}
	cl.Close()
	b.Close()

	b2, err := devbroker.Start(devbroker.Config{Addr: addrs[0], DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	cl2 := pipelinetest.Client(t, b2.Addrs(), kgo.ConsumeTopics(topics.Events()))
	if err := kafka.Check(ctx, kadm.NewClient(cl2), topics); err != nil {
		t.Fatalf("topics after restart: %v", err)
	}
	after, logs, err := kafka.DescribeTopic(ctx, cl2, topics.Events())
	if err != nil {
		t.Fatal(err)
	}
	if after != before || before.TopicID == [16]byte{} || before.ClusterID == "" {
		t.Errorf("identity after restart %v, want %v (and a cluster id and topic id)", after, before)
	}
	if len(logs) != 2 {
		t.Errorf("logs of %d partitions, want 2: %v", len(logs), logs)
	}
	fs := cl2.PollRecords(ctx, 1)
	if err := fs.Err0(); err != nil {
		t.Fatal(err)
	}
	recs := fs.Records()
	if len(recs) != 1 || string(recs[0].Value) != "v1" {
		t.Fatalf("after restart got %d records (%v), want the one produced before", len(recs), recs)
	}
}
