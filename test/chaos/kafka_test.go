package chaos

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/test/kafkacluster"
)

var kafkaFlag = flag.Bool("chaos.kafka", false,
	"run on three nodes of Apache Kafka of the run's own (replication factor 3, min.insync.replicas 2) instead of the embedded broker; the broker's faults are then the real ones: kill -9 of a transaction coordinator while a processor commits, of a commands or events partition leader, a node paused past its session timeout, a rolling restart")

var kafkaPortFlag = flag.Int("chaos.kafka.port", 0,
	"the base port of the three nodes' listeners (node i's broker at port+2(i-1), its controller one above); 0 takes free ports")

// Fault kinds of Apache Kafka's nodes (-chaos.kafka), in place of the
// embedded broker's restart.
const (
	faultCoordinator = "kill -9 of a processor's transaction coordinator"
	faultLeader      = "kill -9 of a commands or events partition leader"
	faultNodePause   = "node paused past its session timeout"
	faultRolling     = "rolling restart of the nodes"
)

// brokerSessionTimeout is the nodes' broker.session.timeout.ms (Apache
// Kafka's default): a node silent for longer is fenced by the controller
// and its partitions' leadership moves. A paused node is paused for
// longer.
const brokerSessionTimeout = 9 * time.Second

// startKafka starts the run's cluster of three nodes in dir.
func startKafka(ctx context.Context, dir, cgroups string) (*kafkacluster.Cluster, error) {
	return kafkacluster.Start(ctx, kafkacluster.Config{
		Dir: filepath.Join(dir, "kafka"), Nodes: 3, HeapMB: 384, BasePort: *kafkaPortFlag, Cgroups: cgroups,
		Props: map[string]string{
			"broker.session.timeout.ms": fmt.Sprint(brokerSessionTimeout.Milliseconds()),
			// A node that has not registered with the controller within
			// this exits (60 s by default): three JVMs starting at once
			// on two busy cores took longer (load 50: node 2 gave up
			// after 3 minutes of starting).
			"initial.broker.registration.timeout.ms": "600000",
		},
	})
}

// provisionTopics creates the deployment's topics on the run's cluster
// with time to spare: three nodes just started on a busy machine took
// longer than the 30 s a component gives its topics' creation and check
// at start (`onceflow dev --broker-only` stopped with "describe topic
// configs: context deadline exceeded" at load 83), which then only finds
// them.
func provisionTopics(ctx context.Context, kc *kafkacluster.Cluster, topics kafka.Topics) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.Brokers()...))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	return kafka.Provision(ctx, kadm.NewClient(cl), topics)
}

// injectKafka injects one of Apache Kafka's faults and waits until every
// partition is in sync again, so the next fault never takes a second
// replica of a partition down (min.insync.replicas 2 of 3: a second one
// down stops the writes, which no client could ride out).
func (f *faults) injectKafka(ctx context.Context, kind, processor string, pick int) {
	kc := f.c.kafka
	start := time.Now()
	var detail string
	var err error
	switch kind {
	case faultCoordinator:
		detail, err = f.killCoordinator(ctx, processor)
	case faultLeader:
		topics := kafka.Topics{Prefix: f.c.pl.Prefix}
		topic := []string{topics.Commands(), topics.Events()}[pick%2]
		var n *kafkacluster.Node
		if n, err = kc.Leader(ctx, topic, int32(pick%3)); err == nil {
			detail = fmt.Sprintf("node %d, leader of %s/%d", n.ID, topic, pick%3)
			err = f.killAndStart(ctx, n)
		}
	case faultNodePause:
		n := kc.Nodes()[pick%len(kc.Nodes())]
		n.Pause()
		time.Sleep(brokerSessionTimeout + 3*time.Second)
		n.Resume()
		detail = fmt.Sprintf("node %d for %s", n.ID, time.Since(start).Round(time.Millisecond))
	case faultRolling:
		detail = "three nodes one at a time, the controller last"
		err = kc.RollingRestart(ctx, 2*time.Minute)
	}
	if err == nil {
		err = kc.WaitInSync(ctx)
	}
	if err != nil {
		f.fail(fmt.Errorf("%s: %w", kind, err))
		return
	}
	f.note(kind, fmt.Sprintf("%s; in sync again after %s", detail, time.Since(start).Round(time.Millisecond)), start)
}

// killCoordinator kills the node that coordinates processor's
// transactional id at a moment the coordinator shows its transaction
// committing (PrepareCommit: the commit decided and logged, its markers
// not yet all written). Under the workload a processor commits many times
// a second, and PrepareCommit lasts as long as the markers take, so the
// coordinator is asked again and again, by several askers at once, for up
// to coordinatorHunt; the kill follows the answer at once. The state of
// the last answer before the kill is the fault's state in the summary
// (docs/chaos.md#coordinator).
func (f *faults) killCoordinator(ctx context.Context, processor string) (string, error) {
	kc := f.c.kafka
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.Brokers()...))
	if err != nil {
		return "", err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	txnID, err := transactionalID(ctx, adm, processor)
	if err != nil {
		return "", err
	}
	n, err := kc.TxnCoordinator(ctx, txnID)
	if err != nil {
		return "", err
	}
	state, took := huntState(ctx, adm, txnID, "PrepareCommit")
	n.Kill()
	f.noteState(faultCoordinator, state)
	if err := n.Start(ctx); err != nil {
		return "", err
	}
	return fmt.Sprintf("node %d, coordinator of %s, killed at %s (seen after %s)", n.ID, txnID, state, took.Round(time.Millisecond)), nil
}

// coordinatorHunt bounds the wait for a transaction in a given state
// before a coordinator fault strikes anyway.
const coordinatorHunt = 30 * time.Second

// txnNone is the state of a transactional id the coordinator does not
// describe (no answer, or none in progress).
const txnNone = "no answer"

// huntState asks the coordinator of txnID for its transaction's state
// until it answers want, from four askers at once, for up to
// coordinatorHunt, and returns the state of the last answer (want, or
// what it was when the hunt gave up) and how long the hunt took.
func huntState(ctx context.Context, adm *kadm.Client, txnID, want string) (string, time.Duration) {
	start := time.Now()
	hctx, cancel := context.WithTimeout(ctx, coordinatorHunt)
	defer cancel()
	var (
		mu   sync.Mutex
		last = txnNone
	)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for hctx.Err() == nil {
				d, err := adm.DescribeTransactions(hctx, txnID)
				if err != nil {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				tx, ok := d[txnID]
				if !ok || tx.Err != nil {
					continue
				}
				mu.Lock()
				if last != want {
					last = tx.State
				}
				mu.Unlock()
				if tx.State == want {
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	return last, time.Since(start)
}

// killAndStart kills node n with SIGKILL and starts it again on its
// storage.
func (f *faults) killAndStart(ctx context.Context, n *kafkacluster.Node) error {
	n.Kill()
	return n.Start(ctx)
}

// transactionalID returns the transactional id of processor among the
// coordinator's transactions: the group's, suffixed with the instance.
func transactionalID(ctx context.Context, adm *kadm.Client, processor string) (string, error) {
	txs, err := adm.ListTransactions(ctx, nil, nil)
	if err != nil {
		return "", err
	}
	for _, id := range txs.TransactionalIDs() {
		if strings.HasSuffix(id, "-"+processor) {
			return id, nil
		}
	}
	return "", fmt.Errorf("no transactional id of %s among the coordinators' transactions", processor)
}
