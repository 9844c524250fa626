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

// startCluster starts a cluster of n nodes on free ports for the test,
// stopped when it ends.
func startCluster(t *testing.T, ctx context.Context, n int) *kafkacluster.Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts Apache Kafka; skipped with -short")
	}
	if _, err := exec.LookPath("java"); err != nil {
		t.Skip("Apache Kafka needs Java 17 (java on PATH); .ci/run's machines have it")
	}
	c, err := kafkacluster.Start(ctx, kafkacluster.Config{Dir: t.TempDir(), Nodes: n, HeapMB: 384})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.Nodes() {
				t.Log(n.Tail(40))
			}
		}
		c.Stop(10 * time.Second)
	})
	return c
}

// A three-node cluster replicates what onceflow creates 3 times with
// min.insync.replicas 2, kafka.Provision creates and checks deployments'
// topics on it right after its start, and the helpers the chaos harness
// uses find and break what they say: the transaction coordinator and a
// partition leader killed and started again, a paused node, a rolling
// restart; committed transactions survive all of it.
func TestThreeNodesFaults(t *testing.T) {
	// A bound, not a measure: at load 40 the provisioning and a rolling
	// restart outlasted 5 minutes, and the whole test took 10 at load
	// 35-58.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, 3)

	// Provision's check right after the creation may reach a node that
	// has not learned of a topic yet (DescribeConfigs:
	// UNKNOWN_TOPIC_OR_PARTITION); Provision waits for it.
	pcl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...))
	if err != nil {
		t.Fatal(err)
	}
	defer pcl.Close()
	for i := range 2 {
		topics := kafka.Topics{Prefix: fmt.Sprintf("provision%d", i)}
		if err := kafka.Provision(ctx, kadm.NewClient(pcl), topics); err != nil {
			t.Fatalf("provision %s on three nodes just started: %v", topics.Prefix, err)
		}
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...), kgo.TransactionalID("tx-1"),
		kgo.DefaultProduceTopic("t"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, 2, -1, nil, "t"); err != nil {
		t.Fatal(err)
	}
	details, err := adm.DescribeTopicConfigs(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := details.On("t", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct{ key, value string }{{"min.insync.replicas", "2"}} {
		for _, c := range cfg.Configs {
			if c.Key == want.key && c.MaybeValue() != want.value {
				t.Errorf("%s = %s, want %s", c.Key, c.MaybeValue(), want.value)
			}
		}
	}
	commit := func(value string) {
		t.Helper()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for p := range int32(2) {
			if err := cl.ProduceSync(ctx, &kgo.Record{Partition: p, Value: []byte(value)}).FirstErr(); err != nil {
				t.Fatalf("produce %s: %v", value, err)
			}
		}
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatalf("commit %s: %v", value, err)
		}
	}
	commit("before") // the first transaction: __transaction_state exists now

	// Every partition of what was created, and of the internal topics, has
	// three replicas (once the metadata has caught up with the creation).
	deadline := time.Now().Add(time.Minute)
	for _, name := range []string{"t", "__transaction_state", "__consumer_offsets"} {
		for {
			md, err := adm.Metadata(ctx, name)
			if err == nil {
				err = md.Topics[name].Err
			}
			var replicas []int
			if err == nil {
				for _, p := range md.Topics[name].Partitions {
					replicas = append(replicas, len(p.Replicas))
				}
			}
			if err == nil && len(replicas) > 0 && !slices.ContainsFunc(replicas, func(n int) bool { return n != 3 }) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: replicas per partition %v (%v), want 3 each", name, replicas, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	coord, err := c.TxnCoordinator(ctx, "tx-1")
	if err != nil {
		t.Fatal(err)
	}
	coord.Kill()
	if coord.Running() {
		t.Fatalf("node %d runs after Kill", coord.ID)
	}
	commit("coordinator-killed") // another node took over its transaction state
	if err := coord.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitInSync(ctx); err != nil {
		t.Fatal(err)
	}

	leader, err := c.Leader(ctx, "t", 0)
	if err != nil {
		t.Fatal(err)
	}
	leader.Pause()
	// A paused leader loses its partitions once the controller stops
	// hearing from it (broker.session.timeout.ms, 9 s).
	deadline = time.Now().Add(time.Minute)
	for {
		now, err := c.Leader(ctx, "t", 0)
		if err == nil && now != leader {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partition 0 still led by paused node %d (%v)", leader.ID, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	commit("leader-paused")
	leader.Resume()
	if err := c.WaitInSync(ctx); err != nil {
		t.Fatal(err)
	}

	if err := c.RollingRestart(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	commit("after-rolling-restart")

	// A read_committed reader sees every committed value on both
	// partitions, once.
	rd, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...), kgo.ConsumeTopics("t"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	got := map[string]int{}
	for total := 0; total < 8; {
		fs := rd.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of 8 records: %v (%v)", total, err, got)
		}
		fs.EachRecord(func(r *kgo.Record) { got[string(r.Value)]++; total++ })
	}
	for _, v := range []string{"before", "coordinator-killed", "leader-paused", "after-rolling-restart"} {
		if got[v] != 2 {
			t.Errorf("%s read %d times, want 2 (once per partition)", v, got[v])
		}
	}
}

// A cluster started detached is found again from its directory by
// another process (make kafka-down), which can stop it.
func TestOpenStops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, 1)
	opened, err := kafkacluster.Open(c.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := opened.Bootstrap(), c.Bootstrap(); got != want {
		t.Fatalf("opened %s, want %s", got, want)
	}
	if err := opened.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	// This process reaps the node it started: wait for that to be seen.
	for deadline := time.Now().Add(10 * time.Second); c.Nodes()[0].Running(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the node runs after the opened cluster stopped it")
		}
	}
	if _, err := kafkacluster.Open(c.Dir()); !kafkacluster.IsNotRunning(err) {
		t.Fatalf("Open of a stopped cluster: %v, want it not running", err)
	}
	// Started again on its storage.
	again, err := kafkacluster.Start(ctx, kafkacluster.Config{Dir: c.Dir(), HeapMB: 384})
	if err != nil {
		t.Fatal(err)
	}
	again.Stop(10 * time.Second)
}
