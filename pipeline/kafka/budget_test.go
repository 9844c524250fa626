package kafka_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// Many small bombs: batches of a few hundred bytes on the wire, each
// decompressing to 2 MiB, under the bound of one batch (4 MiB), forty of
// them on each of two partitions. Without a budget for the whole poll,
// one poll holds every batch of a fetch decompressed (160 MiB here; 9 GiB
// from a fetch of 1 MiB of 15 MiB zstd bombs). With it, no poll returns
// more than the budget, every record is read once and in order, and no
// partition stops: a batch past the budget is only fetched again after
// the next poll.
func TestManySmallBombsStayWithinThePollBudget(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	brokers := pipelinetest.Broker(t).Addrs()
	const topic, parts, bombs, size, pollBudget = "small-bombs", 2, 40, 2 << 20, 8 << 20
	if _, err := kadm.NewClient(pipelinetest.Client(t, brokers)).CreateTopic(ctx, parts, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	bomber := pipelinetest.Client(t, brokers, kgo.ProducerBatchCompression(kgo.ZstdCompression()),
		kgo.ProducerBatchMaxBytes(64<<20), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for i := range bombs {
		for p := range int32(parts) {
			// One record a batch: each produced alone.
			r := &kgo.Record{Topic: topic, Partition: p, Key: fmt.Appendf(nil, "%d", i), Value: make([]byte, size)}
			if err := bomber.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}

	for _, read := range []struct {
		name string
		poll func(*kgo.Client) kgo.Fetches
	}{
		{"PollFetches", func(cl *kgo.Client) kgo.Fetches { return cl.PollFetches(ctx) }},
		{"PollRecords", func(cl *kgo.Client) kgo.Fetches { return cl.PollRecords(ctx, 5) }},
	} {
		t.Run(read.name, func(t *testing.T) {
			consumer, err := kafka.Config{Brokers: brokers, MaxDecompressBatchBytes: 4 << 20, MaxDecompressPollBytes: pollBudget}.NewClient(
				kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			if err != nil {
				t.Fatal(err)
			}
			defer consumer.Close()
			next := make([]int, parts) // the key each partition reads next
			polls, largest := 0, 0
			for total := 0; total < parts*bombs; {
				fs := read.poll(consumer)
				if ctx.Err() != nil {
					t.Fatalf("read %d of %d records in %d polls: %v", total, parts*bombs, polls, ctx.Err())
				}
				polls++
				fs.EachError(func(topic string, part int32, err error) {
					if !kafka.OverBudget(err) {
						t.Fatalf("%s/%d: %v", topic, part, err)
					}
				})
				held := 0
				fs.EachRecord(func(r *kgo.Record) {
					held += len(r.Value)
					if want := fmt.Sprint(next[r.Partition]); string(r.Key) != want {
						t.Fatalf("partition %d: record %s, want %s", r.Partition, r.Key, want)
					}
					next[r.Partition]++
					total++
				})
				largest = max(largest, held)
			}
			if largest > pollBudget {
				t.Errorf("a poll held %d MiB decompressed, over the budget of %d MiB", largest>>20, pollBudget>>20)
			}
			t.Logf("%d records in %d polls, at most %d MiB a poll", parts*bombs, polls, largest>>20)
		})
	}
}

// The budget of a poll is at least the bound of one batch, or a batch
// under the one could never be read; a setting below it is refused.
func TestPollBudgetBelowTheBatchBoundIsRefused(t *testing.T) {
	_, err := kafka.Config{MaxDecompressBatchBytes: 4 << 20, MaxDecompressPollBytes: 1 << 20}.Opts()
	if err == nil {
		t.Fatal("a poll budget of 1 MiB under a batch bound of 4 MiB: no error")
	}
	if _, err := (kafka.Config{MaxDecompressPollBytes: 16 << 20}).Opts(); err != nil {
		t.Errorf("a poll budget equal to the default batch bound: %v", err)
	}
}

// BenchmarkPollBudget reads a partition of zstd batches from the start,
// as a consumer catching up does: legitimate batches (100 records of 1 KiB
// each, so 100 KiB decompressed a batch) through onceflow's client with
// its budget (budget) against franz-go's client with its own bound of one
// batch only (baseline), and small bombs (2 MiB of zeros a batch, 8 MiB a
// poll) through the budget: what it costs where there is nothing to stop,
// and how fast it gets through what it stops. MiB/op is the most one poll
// returned decompressed.
func BenchmarkPollBudget(b *testing.B) {
	ctx := context.Background()
	brokers := pipelinetest.Broker(b).Addrs()
	admin := kadm.NewClient(pipelinetest.Client(b, brokers))
	producer := pipelinetest.Client(b, brokers, kgo.ProducerBatchCompression(kgo.ZstdCompression()), kgo.ProducerBatchMaxBytes(64<<20))
	const batches, perBatch = 200, 100
	fill := func(topic string, records, size int, random bool) {
		if _, err := admin.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
			b.Fatal(err)
		}
		value := make([]byte, size)
		for i := range batches {
			var rs []*kgo.Record
			for j := range records {
				v := value
				if random { // compressible as an event is, not as zeros are
					v = fmt.Appendf(nil, "%0*d", size, i*records+j)
				}
				rs = append(rs, &kgo.Record{Topic: topic, Value: v})
			}
			if err := producer.ProduceSync(ctx, rs...).FirstErr(); err != nil {
				b.Fatal(err)
			}
		}
	}
	fill("legit", perBatch, 1<<10, true)
	fill("bombs", 1, 2<<20, false)

	read := func(b *testing.B, topic string, want int, newClient func(...kgo.Opt) (*kgo.Client, error)) {
		largest := 0
		for b.Loop() {
			cl, err := newClient(kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			if err != nil {
				b.Fatal(err)
			}
			for n := 0; n < want; {
				fs := cl.PollFetches(ctx)
				fs.EachError(func(_ string, _ int32, err error) {
					if !kafka.OverBudget(err) {
						b.Fatal(err)
					}
				})
				held := 0
				fs.EachRecord(func(r *kgo.Record) { held += len(r.Value); n++ })
				largest = max(largest, held)
			}
			cl.Close()
		}
		b.ReportMetric(float64(want)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
		b.ReportMetric(float64(largest)/(1<<20), "MiB/op")
	}
	onceflow := kafka.Config{Brokers: brokers, MaxDecompressBatchBytes: 4 << 20, MaxDecompressPollBytes: 8 << 20}
	franz := func(opts ...kgo.Opt) (*kgo.Client, error) {
		return kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.MaxDecompressBatchBytes(4 << 20)}, opts...)...)
	}
	b.Run("legit/baseline", func(b *testing.B) { read(b, "legit", batches*perBatch, franz) })
	b.Run("legit/budget", func(b *testing.B) { read(b, "legit", batches*perBatch, onceflow.NewClient) })
	b.Run("bombs/baseline", func(b *testing.B) { read(b, "bombs", batches, franz) })
	b.Run("bombs/budget", func(b *testing.B) { read(b, "bombs", batches, onceflow.NewClient) })
}
