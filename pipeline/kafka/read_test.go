package kafka_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// A reader that keeps up with a partition reads each committed record
// once: ReadPartitionFrom returns where the next call goes on, past the
// commit markers and an aborted transaction's records, and a call with
// nothing new reads nothing.
func TestReadPartitionFromGoesOn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	brokers := pipelinetest.Broker(t).Addrs()
	const topic = "read-from"
	if _, err := kadm.NewClient(pipelinetest.Client(t, brokers)).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	txn := pipelinetest.Client(t, brokers, kgo.TransactionalID("read-from-test"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	produce := func(commit bool, values ...string) {
		t.Helper()
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, v := range values {
			if err := txn.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte(v)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := txn.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	reader := pipelinetest.Client(t, brokers)
	next := int64(0)
	read := func() []string {
		t.Helper()
		var got []string
		n, err := kafka.ReadPartitionFrom(ctx, reader, topic, 0, next, true, func(r *kgo.Record) error {
			got = append(got, string(r.Value))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if n < next {
			t.Fatalf("read from %d goes on at %d: backwards", next, n)
		}
		next = n
		return got
	}

	produce(true, "a", "b")
	if got := read(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("first read: %q, want a b", got)
	}
	if next != 3 { // a, b and the commit marker
		t.Errorf("first read goes on at %d, want 3", next)
	}
	if got := read(); len(got) != 0 {
		t.Errorf("a read with nothing new: %q", got)
	}
	produce(false, "aborted")
	produce(true, "c")
	if got := read(); !slices.Equal(got, []string{"c"}) {
		t.Errorf("after an aborted and a committed transaction: %q, want c", got)
	}
	var all []string
	for v := range 3 {
		all = append(all, fmt.Sprint(v))
	}
	produce(true, all...)
	if got := read(); !slices.Equal(got, all) {
		t.Errorf("third read: %q, want %q", got, all)
	}
}
