package pipelinetest

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/devbroker"
	"github.com/onceflow/onceflow/pipeline/kafka"
)

// Broker starts an in-memory embedded broker for the test, closed when the
// test ends. Group session timeouts may go down to 100ms so tests of
// rebalances and zombies run quickly.
func Broker(t testing.TB, opts ...kfake.Opt) *devbroker.Broker {
	t.Helper()
	b, err := devbroker.Start(devbroker.Config{
		Addr: "127.0.0.1:0",
		Opts: append([]kfake.Opt{kfake.GroupMinSessionTimeout(100 * time.Millisecond)}, opts...),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// ExternalKafka returns the seed brokers of the cluster KAFKA_BROKERS names
// in the tests' environment (Apache Kafka: make test-kafka, make
// kafka-up), or nil when every test runs on an embedded broker of its own.
func ExternalKafka() []string { return kafka.ParseBrokers(os.Getenv("KAFKA_BROKERS")) }

// Kafka returns the brokers a test runs on: the external cluster's
// (ExternalKafka), else those of an embedded broker of the test's own
// (Broker). A test that needs the embedded broker's hooks (faults,
// compaction on demand, its settings) calls Broker instead.
func Kafka(t testing.TB) []string {
	t.Helper()
	if brokers := ExternalKafka(); len(brokers) > 0 {
		return brokers
	}
	return Broker(t).Addrs()
}

// EmbeddedOnly skips t when the tests run on an external cluster: t
// relies on what only the embedded broker has (what: its faults, its
// compaction on demand, a setting), and onKafka names the test that shows
// the same behaviour on Apache Kafka with real faults.
func EmbeddedOnly(t testing.TB, what, onKafka string) {
	t.Helper()
	if len(ExternalKafka()) > 0 {
		t.Skipf("relies on the embedded broker's %s; on Apache Kafka: %s", what, onKafka)
	}
}

var prefixSeq atomic.Int64

// runID tells this process's topics from those other runs left on an
// external cluster.
var runID = fmt.Sprintf("%d-%d", os.Getpid(), time.Now().Unix()%100000)

// Topics provisions onceflow's topics with a prefix unique to the test on
// the given broker, with partitions partitions each. On an external
// cluster the prefix is unique to the run too, and the topics are deleted
// when the test ends.
func Topics(t testing.TB, brokers []string, partitions int32) kafka.Topics {
	t.Helper()
	topics := kafka.Topics{Prefix: fmt.Sprintf("t%d", prefixSeq.Add(1)), Partitions: partitions}
	external := len(ExternalKafka()) > 0
	if external {
		topics.Prefix = fmt.Sprintf("t%s-%d", runID, prefixSeq.Load())
	}
	cl := Client(t, brokers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafka.Provision(ctx, kadm.NewClient(cl), topics); err != nil {
		t.Fatalf("provision topics: %v", err)
	}
	if external {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var names []string
			for _, s := range topics.Specs() {
				names = append(names, s.Name)
			}
			kadm.NewClient(cl).DeleteTopics(ctx, names...)
		})
	}
	return topics
}

// Client returns a plain client for the test, closed when it ends.
func Client(t testing.TB, brokers []string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kafka.Config{Brokers: brokers}.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// Eventually polls cond every 20ms until it returns nil or within passes,
// then fails the test with cond's last error.
func Eventually(t testing.TB, within time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s: %v", within, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
