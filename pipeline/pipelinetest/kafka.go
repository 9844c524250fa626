package pipelinetest

import (
	"context"
	"fmt"
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

var prefixSeq atomic.Int64

// Topics provisions onceflow's topics with a prefix unique to the test on
// the given broker, with partitions partitions each.
func Topics(t testing.TB, brokers []string, partitions int32) kafka.Topics {
	t.Helper()
	topics := kafka.Topics{Prefix: fmt.Sprintf("t%d", prefixSeq.Add(1)), Partitions: partitions}
	cl := Client(t, brokers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafka.Provision(ctx, kadm.NewClient(cl), topics); err != nil {
		t.Fatalf("provision topics: %v", err)
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
