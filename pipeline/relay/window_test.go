package relay_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/relay"
)

// franz-go v1.22.3 stores a topic's partitions in a new producer's view
// only after it partitioned the records that waited for them; records
// acknowledged in between are not seen by EndTransaction, which then
// aborts and returns nil (awaitPartitions in produce.go).
// The test widens that window the way test/repro's patch does, with
// franz-go's own hooks: the producer's first metadata answer is held until
// one more record, the tail, waits behind the batch for the topic, and the
// tail's partitioning blocks (the producer's view still without the topic)
// until the relay has either committed or waited for the view. The tail is
// then refused by its partitioner, so only the batch reaches Kafka. Every
// round's batch is readable read_committed: with the relay's wait for the
// partitions removed from its commit path, the rounds whose window was
// widened lose theirs.
func TestFirstCommitAfterTheTopicsPartitionsAreSeen(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const rows = 4
	agg := "acme/acc-window"
	sent := map[string][]command{}
	widened := 0
	for round := 0; round < 10 && widened < 3; round++ {
		sent[agg] = append(sent[agg], e.insert(t, agg, rows, 64)...)
		w := &window{batch: rows, tailTopic: e.topics.Commands(), metadataHeld: make(chan struct{})}
		var reg atomic.Pointer[prometheus.Registry]
		w.waited = func() bool {
			r := reg.Load()
			return r != nil && gathered(r, "onceflow_outbox_commit_waits_total") > 0
		}
		r := e.start(t, relay.Config{InstanceID: fmt.Sprintf("round-%d", round)}, func(r *relay.Relay) {
			relay.SetHooks(r, nil, func(int) { w.committed.Store(true) }, nil)
			relay.SetClientOpts(r, func(shard int) []kgo.Opt {
				if shard != pipeline.OutboxShard(agg, pipeline.DefaultOutboxShards) {
					return nil
				}
				return []kgo.Opt{kgo.WithHooks(w), kgo.RecordPartitioner(w)}
			})
		})
		reg.Store(r.reg)
		e.waitEmpty(t, 30*time.Second)
		r.stop(t)
		if w.widened.Load() {
			widened++
		}
	}
	if widened == 0 {
		t.Fatal("no round widened the window: the tail never came after the whole batch")
	}
	checkOrder(t, sent, e.readTopic(t, e.topics.Commands(), len(sent[agg])))
}

// window is the hooks and partitioner of one producer that widen the
// window between the acknowledgement of its first records and the storing
// of their topic's partitions.
type window struct {
	batch     int
	tailTopic string
	waited    func() bool // the relay waits for the producer's view
	committed atomic.Bool // the relay's commit returned

	mu           sync.Mutex
	cl           *kgo.Client
	buffered     int // the batch's records produced
	partitioned  int // the batch's records partitioned
	metadataHeld chan struct{}
	tailOnce     sync.Once
	widened      atomic.Bool
}

var tailKey = []byte("window-tail")

func (w *window) OnNewClient(cl *kgo.Client) {
	w.mu.Lock()
	w.cl = cl
	w.mu.Unlock()
}

// OnProduceRecordBuffered counts the batch's records; after the last, the
// tail is produced from another goroutine (this hook runs before the
// record is queued behind its topic's metadata).
func (w *window) OnProduceRecordBuffered(r *kgo.Record) {
	if string(r.Key) == string(tailKey) {
		return
	}
	w.mu.Lock()
	w.buffered++
	last := w.buffered == w.batch
	cl := w.cl
	w.mu.Unlock()
	if !last {
		return
	}
	go func() {
		time.Sleep(20 * time.Millisecond) // the last record's Produce returns
		cl.Produce(context.Background(), &kgo.Record{Topic: w.tailTopic, Key: tailKey}, func(*kgo.Record, error) {})
		w.tailOnce.Do(func() { close(w.metadataHeld) })
	}()
}

// OnBrokerRead holds every metadata answer read once the batch is being
// produced until the tail waits behind it.
func (w *window) OnBrokerRead(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, _ error) {
	w.mu.Lock()
	started := w.buffered > 0
	w.mu.Unlock()
	if key != 3 || !started {
		return
	}
	select {
	case <-w.metadataHeld:
	case <-time.After(10 * time.Second):
	}
}

func (w *window) ForTopic(topic string) kgo.TopicPartitioner {
	return windowTopic{w: w, keyed: kgo.StickyKeyPartitioner(nil).ForTopic(topic)}
}

type windowTopic struct {
	w     *window
	keyed kgo.TopicPartitioner
}

func (p windowTopic) RequiresConsistency(*kgo.Record) bool { return true }

// Partition places the batch's records as the default partitioner does
// (murmur2 of the key). The tail, when the whole batch went before it,
// blocks until the relay committed or waits for the producer's view, then
// is refused.
func (p windowTopic) Partition(r *kgo.Record, n int) int {
	w := p.w
	if string(r.Key) != string(tailKey) {
		w.mu.Lock()
		w.partitioned++
		w.mu.Unlock()
		return p.keyed.Partition(r, n)
	}
	w.mu.Lock()
	whole := w.partitioned == w.batch
	w.mu.Unlock()
	if whole {
		w.widened.Store(true)
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && !w.committed.Load() && !w.waited(); {
			time.Sleep(time.Millisecond)
		}
	}
	return -1
}

// gathered is the value of the counter name in reg, 0 when absent.
func gathered(reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}
