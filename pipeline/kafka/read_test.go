package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
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

// A transaction left open (a silent producer's) holds a partition's last
// stable offset back while another producer commits above it.
// ReadPartition stops at the last stable offset and misses those commits;
// ReadPartitionStable reads up to the high watermark, waiting while the
// open transaction lasts (as long as its context lets it), and then reads
// every committed record and nothing of the aborted one.
func TestReadPartitionStableWaitsForAnOpenTransaction(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	brokers := pipelinetest.Kafka(t)
	topic := pipelinetest.Topics(t, brokers, 1).State() // compacted: records need keys
	open := pipelinetest.Client(t, brokers, kgo.TransactionalID(topic+"-open"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	other := pipelinetest.Client(t, brokers, kgo.TransactionalID(topic+"-other"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := open.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := open.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("open")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := other.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := other.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("b"), Value: []byte("b1")}, &kgo.Record{Topic: topic, Key: []byte("c"), Value: []byte("b2")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := other.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	reader := pipelinetest.Client(t, brokers)
	collect := func(got *[]string) func(*kgo.Record) error {
		return func(r *kgo.Record) error {
			*got = append(*got, string(r.Value))
			return nil
		}
	}

	var upToStable []string
	if err := kafka.ReadPartition(ctx, reader, topic, 0, true, collect(&upToStable)); err != nil {
		t.Fatal(err)
	}
	if len(upToStable) != 0 {
		t.Errorf("ReadPartition read %q below the open transaction, want nothing", upToStable)
	}

	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	var partial []string
	err := kafka.ReadPartitionStable(short, reader, topic, 0, nil, collect(&partial))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a stable read while the transaction stays open: %v, want the context's deadline", err)
	}

	var got []string
	var holds atomic.Int32
	aborted := make(chan error, 1)
	err = kafka.ReadPartitionStable(ctx, reader, topic, 0, func(lastStable, end int64, waited time.Duration) {
		if holds.Add(1) == 1 {
			if lastStable != 0 || end < 4 { // open, b1, b2, the commit marker
				t.Errorf("held at last stable offset %d for end %d, want 0 and at least 4", lastStable, end)
			}
			go func() { aborted <- open.EndTransaction(ctx, kgo.TryAbort) }()
		}
	}, collect(&got))
	if err != nil {
		t.Fatal(err)
	}
	if err := <-aborted; err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{"b1", "b2"}) {
		t.Errorf("stable read: %q, want b1 b2", got)
	}
	if holds.Load() == 0 {
		t.Error("the stable read never waited")
	}
}

// A batch of a few KiB that decompresses to megabytes (a bomb: the broker
// measures it compressed) is refused by every reader with the bound of its
// Config, named by offsets, instead of decompressed: ReadPartition returns
// BatchTooLarge, BlockedBatch finds it, and a consumer's partition stops
// at it with the same error while the records around it are read.
func TestDecompressionIsBounded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	brokers := pipelinetest.Broker(t).Addrs()
	const topic = "bombs"
	if _, err := kadm.NewClient(pipelinetest.Client(t, brokers)).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	plain := pipelinetest.Client(t, brokers)
	bomber := pipelinetest.Client(t, brokers, kgo.ProducerBatchCompression(kgo.ZstdCompression()), kgo.ProducerBatchMaxBytes(64<<20))
	if err := plain.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("before")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	bomb, err := bomber.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: make([]byte, 32<<20)}).First()
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("after")}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	bounded, err := kafka.Config{Brokers: brokers, MaxDecompressBatchBytes: 16 << 20}.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer bounded.Close()
	var read []string
	err = kafka.ReadPartition(ctx, bounded, topic, 0, true, func(r *kgo.Record) error { read = append(read, string(r.Value)); return nil })
	tooLarge, ok := kafka.BatchTooLarge(err)
	if !ok || tooLarge.Offset != bomb.Offset || tooLarge.NextOffset != bomb.Offset+1 || !slices.Equal(read, []string{"before"}) {
		t.Fatalf("ReadPartition: read %q, error %v; want the record before, then the batch at %d too large", read, err, bomb.Offset)
	}
	if b, err := kafka.BlockedBatch(ctx, bounded, topic, 0, bomb.Offset); err != nil || b == nil || b.NextOffset != bomb.Offset+1 {
		t.Errorf("BlockedBatch at the bomb: %+v, %v", b, err)
	}
	if b, err := kafka.BlockedBatch(ctx, bounded, topic, 0, bomb.Offset+1); err != nil || b != nil {
		t.Errorf("BlockedBatch after the bomb: %+v, %v; want nothing blocked", b, err)
	}

	// A consumer: the partition stops at the bomb, with its offsets.
	consumer, err := kafka.Config{Brokers: brokers, MaxDecompressBatchBytes: 1 << 20}.NewClient(
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	var fetchErr error
	read = nil
	for fetchErr == nil {
		fs := consumer.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) { read = append(read, string(r.Value)) })
		fs.EachError(func(_ string, _ int32, err error) { fetchErr = err })
	}
	if tl, ok := kafka.BatchTooLarge(fetchErr); !ok || tl.Offset != bomb.Offset || !slices.Equal(read, []string{"before"}) {
		t.Fatalf("consumer: read %q, error %v", read, fetchErr)
	}
	// Past it on purpose, the rest is read.
	consumer.SetOffsets(map[string]map[int32]kgo.EpochOffset{topic: {0: {Epoch: -1, Offset: tooLarge.NextOffset}}})
	fs := consumer.PollFetches(ctx)
	if fs.NumRecords() != 1 || string(fs.Records()[0].Value) != "after" {
		t.Errorf("after skipping the bomb: %d records, errors %v", fs.NumRecords(), fs.Errors())
	}
}
