package processor_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/processor"
)

// zombie is a transaction left open on a partition's state and dedup
// records by a processor that went silent mid-batch (paused, say) after
// its partitions went to another member: it holds their last stable
// offset back until it ends.
type zombie struct {
	t  testing.TB
	cl *kgo.Client
}

// openZombie begins a transaction with a transactional id of its own,
// writes a record to partition part of the state and the dedup topics and
// leaves the transaction open. Its timeout is long: the test ends it.
func (e *env) openZombie(part int32) *zombie {
	e.t.Helper()
	cl := pipelinetest.Client(e.t, e.kcfg.Brokers,
		kgo.TransactionalID("zombie-"+e.topics.Prefix),
		kgo.TransactionTimeout(5*time.Minute),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := cl.BeginTransaction(); err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := cl.ProduceSync(ctx,
		&kgo.Record{Topic: e.topics.State(), Partition: part, Key: []byte("acme/zombie"), Value: []byte("never committed")},
		&kgo.Record{Topic: e.topics.Dedup(), Partition: part, Value: []byte("never committed")},
	).FirstErr()
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { // a test that failed before it ended the transaction
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cl.EndTransaction(ctx, kgo.TryAbort)
	})
	return &zombie{t: e.t, cl: cl}
}

// abort ends the zombie's transaction, as the broker does at its timeout
// or a new incarnation of its instance does at once.
func (z *zombie) abort() {
	z.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := z.cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		z.t.Fatal(err)
	}
}

// A zombie's open transaction holds the state and dedup partitions' last
// stable offset back while the partition's owner commits above it; then
// the partition moves to another processor. Its committed offsets cover
// those commits, so its restore must include them: it waits until the
// open transaction ends rather than stopping at the last stable offset,
// and decides from the state the offsets say. The redelivered command is
// absorbed, the next one gets the next version. (On Apache Kafka the
// coordinator aborts a timed-out transaction only at its next sweep, and
// TestProcessorZombieAndRebalanceThree, test/e2e, doubled events this
// way: docs/decisions/0020-restore-waits-for-open-transactions.md.)
func TestRestoreWaitsForAZombiesTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	acc := "acme/z-1"
	p1 := e.start("p1", nil)
	open, first := newCmd(acc, ledger.OpenAccount{Currency: "EUR"}), newCmd(acc, ledger.Deposit{Amount: 10})
	e.send(open, first)
	e.waitOutcomes(30*time.Second, open.id, first.id)

	z := e.openZombie(0)
	second := newCmd(acc, ledger.Deposit{Amount: 20})
	e.send(second)
	e.waitOutcomes(30*time.Second, second.id) // committed above the zombie's records
	p1.stop(t)

	p2 := e.launch("p2", ledger.NewDecider(), nil)
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		select {
		case <-p2.Ready():
			return nil
		default:
		}
		if p2.metric(t, "onceflow_processor_restore_waits_total") > 0 {
			return nil
		}
		return errors.New("p2 neither ready nor waiting for the open transaction")
	})
	z.abort()
	p2.waitReady(t, "p2")
	if n := p2.metric(t, "onceflow_processor_restore_waits_total"); n < 1 {
		t.Errorf("restore waits %v: the restore did not wait for the open transaction", n)
	}

	third := newCmd(acc, ledger.Deposit{Amount: 40})
	e.send(second, third) // second again: a redelivery
	evs := e.waitOutcomes(30*time.Second, third.id)
	checkEventLog(t, evs)
	for _, ev := range evs {
		if ev.CommandID == third.id && ev.Version != 4 {
			t.Errorf("the deposit after the handover is version %d, want 4", ev.Version)
		}
	}
	p2.waitBalance(t, acc, 70)
}

// Two processors with the same instance id (so the same transactional id):
// the second's first InitProducerId fences the first, whose next session asks
// the coordinator whether its producer still holds the id and learns that
// another has initialized it since. One of the two leaves with ErrReplaced
// rather than start a session that would fence the other, which would fence
// it back, the two taking turns; the other serves on, and every command has
// one outcome. Which one leaves is not asserted, nor that the other never
// restarts: when the two check and initialize at the same moment the
// coordinator can take a check for a retry of the bump it made aborting the
// checker's transaction and accept it, so a round of fencing can pass first
// (docs/decisions/0018-processor-sessions-and-fencing.md).
func TestReplacedProcessorLeaves(t *testing.T) {
	if len(pipelinetest.ExternalKafka()) == 0 {
		t.Skip("kfake re-initializes a transactional id from any earlier epoch (KIP-360), even after another producer took it, so a replaced processor cannot tell (docs/decisions/0055-apache-kafka-differences.md); on Apache Kafka: make test-kafka KAFKA_TEST_PKGS=./pipeline/processor/, and TestZombieProcessorFencedByItsSuccessor (test/e2e)")
	}
	t.Parallel()
	e := newEnv(t, 2)
	first := e.start("same", nil)
	ids := e.burst("first", 6, 3)
	e.waitOutcomes(30*time.Second, ids...)

	second := e.launch("same", ledger.NewDecider(), nil)
	var left, stays *running
	round := 0
	pipelinetest.Eventually(t, 60*time.Second, func() error {
		select {
		case <-first.done:
			left, stays = first, second
			return nil
		case <-second.done:
			left, stays = second, first
			return nil
		default:
		}
		round++
		ids = append(ids, e.burst(fmt.Sprintf("r%d", round), 6, 1)...)
		return errors.New("both processors still run")
	})
	if !errors.Is(left.err, processor.ErrReplaced) {
		t.Errorf("a processor ended with %v, want ErrReplaced", left.err)
	}
	left.cancel, left.err = nil, nil // ended; nothing for the cleanup to stop

	ids = append(ids, e.burst("after", 6, 1)...)
	evs := e.waitOutcomes(60*time.Second, ids...)
	checkEventLog(t, evs)
	select {
	case <-stays.done:
		t.Fatalf("the other processor ended too: %v", stays.err)
	default:
	}
	t.Logf("the %s processor left; the other restarted %v sessions", map[bool]string{true: "first", false: "second"}[left == first],
		stays.metric(t, "onceflow_processor_session_restarts_total"))
}
