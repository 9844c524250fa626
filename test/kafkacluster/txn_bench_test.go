package kafkacluster_test

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/test/kafkacluster"
)

// BenchmarkBackToBackTransactions measures what a transactional producer
// that begins its next transaction as soon as the last one committed (the
// relay's shards and the processor under load) waits on Apache Kafka: a
// node with the broker's default add.partitions.to.txn.retry.backoff.ms
// (20, the baseline) against one with this package's setting (2), each
// transaction one record produced and committed, with no pause and with a
// pause of 2 ms between transactions, on onceflow's client settings.
//
//	go test -run '^$' -bench BackToBack -benchtime 300x ./test/kafkacluster/
func BenchmarkBackToBackTransactions(b *testing.B) {
	if _, err := exec.LookPath("java"); err != nil {
		b.Skip("Apache Kafka needs Java 17 (java on PATH); .ci/run's machines have it")
	}
	ctx := context.Background()
	for _, backoff := range []string{"20", "2"} {
		c, err := kafkacluster.Start(ctx, kafkacluster.Config{Dir: b.TempDir(), HeapMB: 384,
			Props: map[string]string{"add.partitions.to.txn.retry.backoff.ms": backoff}})
		if err != nil {
			b.Fatal(err)
		}
		for _, pause := range []time.Duration{0, 2 * time.Millisecond} {
			b.Run(fmt.Sprintf("backoff=%sms/pause=%v", backoff, pause), func(b *testing.B) {
				backToBack(b, c, pause)
			})
		}
		c.Stop(10 * time.Second)
	}
}

func backToBack(b *testing.B, c *kafkacluster.Cluster, pause time.Duration) {
	ctx := context.Background()
	topic := fmt.Sprintf("back-to-back-%d", time.Now().UnixNano())
	adm, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...))
	if err != nil {
		b.Fatal(err)
	}
	defer adm.Close()
	if _, err := kadm.NewClient(adm).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		b.Fatal(err)
	}
	// onceflow's client settings (pipeline/kafka), as its producers have.
	cl, err := kafka.Config{Brokers: c.Brokers()}.NewClient(kgo.TransactionalID(topic), kgo.DefaultProduceTopic(topic))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	var took []time.Duration
	for b.Loop() {
		start := time.Now()
		if err := cl.BeginTransaction(); err != nil {
			b.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr(); err != nil {
			b.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
		b.StopTimer()
		time.Sleep(pause)
		b.StartTimer()
	}
	slices.Sort(took)
	ms := func(q float64) float64 { return float64(took[int(q*float64(len(took)-1))]) / 1e6 }
	b.ReportMetric(ms(0.5), "p50-ms")
	b.ReportMetric(ms(0.99), "p99-ms")
}
