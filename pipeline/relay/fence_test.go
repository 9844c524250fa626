package relay

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// The Kafka half of fencing: when a relay creates the producer of a shard,
// the producer a previous holder of the shard still has (here with a batch
// produced and acknowledged, not yet committed) can no longer commit, and
// what it produced never becomes visible to read_committed readers. This
// holds because the shard, not the process, names the transactional id.
func TestKafkaFencesThePreviousHolder(t *testing.T) {
	t.Parallel()
	pool, _ := pipelinetest.Pool(t)
	brokers := pipelinetest.Kafka(t)
	topics := pipelinetest.Topics(t, brokers, 2)
	newRelay := func(instance string) *Relay {
		r, err := New(Config{InstanceID: instance, TransactionalIDPrefix: "fence-" + topics.Prefix},
			pool, kafka.Config{Brokers: brokers}, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, bb := newRelay("a"), newRelay("b")
	wa := &worker{shard: 3, token: 1}
	wb := &worker{shard: 3, token: 2}
	defer func() {
		a.discardClient(wa)
		bb.discardClient(wb)
		a.wg.Wait()
		bb.wg.Wait()
	}()

	old, err := a.clientFor(ctx, wa)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := old.ProduceSync(ctx, &kgo.Record{Topic: topics.Commands(), Key: []byte("acme/acc-1"), Value: []byte("from a")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if _, err := bb.clientFor(ctx, wb); err != nil {
		t.Fatal(err)
	}
	if err := old.EndTransaction(ctx, kgo.TryCommit); err == nil {
		t.Fatal("the previous holder committed after the shard's new producer was created")
	}
	rows := []outboxRow{{id: 1, topic: topics.Commands(), key: []byte("acme/acc-1"), value: []byte("from b"), createdAt: time.Now()}}
	if _, err := bb.transact(ctx, wb.client, wb, rows); err != nil {
		t.Fatalf("the new holder cannot produce: %v", err)
	}

	cl := pipelinetest.Client(t, brokers, kgo.ConsumeTopics(topics.Commands()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var got []string
	for len(got) < 1 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read back: %v", err)
		}
		fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	pcancel()
	if len(got) != 1 || got[0] != "from b" {
		t.Fatalf("read_committed sees %q, want only the new holder's record", got)
	}
}

// fairShare splits the shards so the targets add up to the shard count
// whatever the number of relays, and every relay computes the same split.
func TestFairShare(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		shards int
		relays []string
		want   []int
	}{
		{16, []string{"a"}, []int{16}},
		{16, []string{"a", "b"}, []int{8, 8}},
		{16, []string{"a", "b", "c"}, []int{6, 5, 5}},
		{16, []string{"c", "a", "b"}, []int{5, 6, 5}},
		{2, []string{"a", "b", "c"}, []int{1, 1, 0}},
	} {
		sum := 0
		for i, self := range tc.relays {
			var others []string
			for _, o := range tc.relays {
				if o != self {
					others = append(others, o)
				}
			}
			got := fairShare(tc.shards, self, others)
			if got != tc.want[i] {
				t.Errorf("fairShare(%d, %s, %v) = %d, want %d", tc.shards, self, others, got, tc.want[i])
			}
			sum += got
		}
		if sum != tc.shards {
			t.Errorf("%d shards over %v: targets add up to %d", tc.shards, tc.relays, sum)
		}
	}
}
