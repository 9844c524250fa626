package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/kafka"
)

// TestBrokerKilledWithOpenTransaction kills the embedded broker twice
// while transactions are open. Whatever a producer is told must stay true:
// a commit that returns nil is visible to read_committed readers, one that
// returns an error is not, and not after a later crash either (kfake's
// own recovery aborts an open transaction in memory only; the next replay
// took the aborted records for part of the producer's next committed
// transaction).
func TestBrokerKilledWithOpenTransaction(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process end-to-end test; skipped with -short")
	}
	// Three starts of Apache Kafka's JVM on Apache Kafka: 40 s each when
	// the machine is loaded.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pl := newPipeline(t, "")
	broker := startCrashableBroker(t, ctx, pl)
	cfg := kafka.Config{Brokers: pl.Brokers()}
	topic := pl.Prefix + ".commands"
	producer := func() *kgo.Client {
		cl, err := cfg.NewClient(kgo.TransactionalID("e2e-broker-kill"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	// produce opens a transaction and writes one record to partition 0.
	produce := func(cl *kgo.Client, value string) {
		t.Helper()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		rec := &kgo.Record{Topic: topic, Partition: 0, Key: []byte("acme/acc-1"), Value: []byte(value)}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	restart := func() {
		t.Helper()
		broker.Kill()
		if err := broker.Restart(ctx); err != nil {
			t.Fatal(err)
		}
	}
	told := map[string]error{}

	cl := producer()
	produce(cl, "first")
	told["first"] = cl.EndTransaction(ctx, kgo.TryCommit)
	produce(cl, "second") // on the broker's disk, open, when it dies
	restart()
	told["second"] = cl.EndTransaction(ctx, kgo.TryCommit)
	// As the relay and the processor do after an error: a new producer
	// with the same transactional id, and the next transaction.
	cl = producer()
	produce(cl, "third")
	told["third"] = cl.EndTransaction(ctx, kgo.TryCommit)
	produce(cl, "fourth")
	restart()

	reader, err := cfg.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	visible := map[string]bool{}
	err = kafka.ReadPartition(ctx, reader, topic, 0, true, func(r *kgo.Record) error {
		visible[string(r.Value)] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"first", "second", "third"} {
		t.Logf("%s: commit returned %v; visible: %v", v, told[v], visible[v])
		if (told[v] == nil) != visible[v] {
			t.Errorf("%s: the producer was told %v, but a read_committed reader sees it: %v", v, told[v], visible[v])
		}
	}
	if visible["fourth"] {
		t.Error("fourth: never committed, but a read_committed reader sees it")
	}
}
