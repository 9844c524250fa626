package natsink_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/natsink"
	"github.com/onceflow/onceflow/pipeline/natsink/natsinktest"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// kfake closes its connections' goroutines asynchronously.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

// env is one test's embedded broker with onceflow's topics, a nats-server
// with JetStream, and the events serde.
type env struct {
	t       testing.TB
	brokers []string
	topics  kafka.Topics
	nats    *natsinktest.Server
	js      jetstream.JetStream
	serde   *avro.Serde
	prod    *kgo.Client
	adm     *kadm.Client
	version map[string]int64 // the last version produced, by aggregate
}

func newEnv(t testing.TB, partitions int32) *env {
	t.Helper()
	ns := natsinktest.Start(t) // first: skips the test without nats-server
	b := pipelinetest.Broker(t)
	e := &env{t: t, brokers: b.Addrs(), nats: ns, version: map[string]int64{}}
	e.topics = pipelinetest.Topics(t, e.brokers, partitions)
	_, e.js = ns.Connect(t)
	e.serde = eventsSerde(t, e.topics)
	e.prod = pipelinetest.Client(t, e.brokers, kgo.ProducerLinger(5*time.Millisecond))
	e.adm = kadm.NewClient(pipelinetest.Client(t, e.brokers))
	return e
}

func eventsSerde(t testing.TB, topics kafka.Topics) *avro.Serde {
	t.Helper()
	schema, err := ledger.SchemaOf(ledger.Events)
	if err != nil {
		t.Fatal(err)
	}
	s, err := avro.NewSerde(avro.NewEmbedded(), avro.ValueSubject(topics.Events()), schema, ledger.EventTypes())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Register(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// event returns the next event of tenant/account as the processor writes
// it: its id from a new command, its version counting on.
func (e *env) event(tenant, account string, payload pipeline.Message) *kgo.Record {
	e.t.Helper()
	agg := pipeline.AggregateID(tenant, account)
	e.version[agg]++
	cmd := pipeline.NewCommandID()
	ev := pipeline.Event{ID: pipeline.EventID(agg, cmd, 0), CommandID: cmd, CommandType: "Deposit", Tenant: tenant,
		AggregateID: agg, Version: e.version[agg], Time: time.Now().UTC().Truncate(time.Millisecond), Payload: payload}
	value, err := e.serde.Encode(context.Background(), payload)
	if err != nil {
		e.t.Fatal(err)
	}
	return kafka.EventRecord(e.topics.Events(), ev, value)
}

// deposits returns n events over accounts accounts of tenant "acme": each
// account opened, then deposits.
func (e *env) deposits(n, accounts int) []*kgo.Record {
	e.t.Helper()
	recs := make([]*kgo.Record, n)
	for i := range recs {
		acc := fmt.Sprintf("acc-%d", i%accounts)
		var m pipeline.Message = ledger.Deposited{Amount: int64(i + 1)}
		if e.version[pipeline.AggregateID("acme", acc)] == 0 {
			m = ledger.AccountOpened{Currency: "EUR"}
		}
		recs[i] = e.event("acme", acc, m)
	}
	return recs
}

// produce writes records and returns them with their positions.
func (e *env) produce(recs ...*kgo.Record) []*kgo.Record {
	e.t.Helper()
	if err := e.prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		e.t.Fatalf("produce: %v", err)
	}
	return recs
}

var groupSeq atomic.Int64

// sink is one running sink with its metrics.
type sink struct {
	*natsink.Sink
	cfg    natsink.Config
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// config returns a sink configuration for the env with a group of its
// own.
func (e *env) config() natsink.Config {
	return natsink.Config{
		Topic: e.topics.Events(), URL: e.nats.URL, Group: fmt.Sprintf("natsink-test-%d", groupSeq.Add(1)),
		SessionTimeout: time.Second, MaxBackoff: 500 * time.Millisecond,
		// One nats-server: one replica, allowed as a user of one server
		// that syncs every write would.
		Replicas: 1, AllowSingleReplica: true,
	}
}

// stream is the stream a sink of cfg writes to.
func stream(cfg natsink.Config) string {
	if cfg.Stream != "" {
		return cfg.Stream
	}
	return natsink.DefaultStream(cfg.Topic)
}

// start runs a sink until stop or the test's end, and waits until it is
// ready.
func (e *env) start(cfg natsink.Config) *sink {
	e.t.Helper()
	reg := prometheus.NewRegistry()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := natsink.New(cfg, kafka.Config{Brokers: e.brokers}, logger, reg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sk := &sink{Sink: s, cfg: cfg, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { sk.done <- s.Run(ctx) }()
	e.t.Cleanup(func() { sk.stop(e.t) })
	select {
	case <-s.Ready():
	case err := <-sk.done:
		sk.done <- err
		e.t.Fatalf("sink ended before it was ready: %v", err)
	case <-time.After(60 * time.Second):
		e.t.Fatal("sink not ready within 60s")
	}
	return sk
}

// stop ends the sink gracefully and checks Run returned nil.
func (s *sink) stop(t testing.TB) {
	t.Helper()
	s.once.Do(func() {
		s.cancel()
		select {
		case err := <-s.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("sink did not stop within 30s")
		}
	})
}

// metric returns a counter or gauge of the sink (name, with labels as
// "name" plus a label value for a vector).
func (s *sink) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var sum float64
	metrics:
		for _, m := range mf.GetMetric() {
			for i, l := range m.GetLabel() {
				if i < len(labels) && l.GetValue() != labels[i] {
					continue metrics
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			}
		}
		return sum
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// lag returns the sink group's lag over every partition, as `onceflow lag`
// measures it (against the last stable offset).
func (e *env) lag(s *natsink.Sink) (int64, error) {
	lags, err := kafka.Lag(context.Background(), pipelinetest.Client(e.t, e.brokers), []kafka.LagSource{s.LagSource()})
	if err != nil {
		return 0, err
	}
	var n int64
	for _, l := range lags {
		n += l.Lag
	}
	return n, nil
}

// caughtUp waits until the sink has committed every record.
func (e *env) caughtUp(s *natsink.Sink) {
	e.t.Helper()
	pipelinetest.Eventually(e.t, 60*time.Second, func() error {
		n, err := e.lag(s)
		if err == nil && n != 0 {
			err = fmt.Errorf("lag %d", n)
		}
		return err
	})
}

// messages reads the stream whole.
func (e *env) messages(stream string) []jetstream.Msg {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs, err := natsinktest.Messages(ctx, e.js, stream)
	if err != nil {
		e.t.Fatal(err)
	}
	return msgs
}

// resetGroup moves a group's committed offsets back to the start of the
// topic, as if the sink had crashed after JetStream's acknowledgements
// and before its commits. No member may be running.
func (e *env) resetGroup(group string) {
	e.t.Helper()
	ctx := context.Background()
	starts, err := e.adm.ListStartOffsets(ctx, e.topics.Events())
	if err != nil {
		e.t.Fatal(err)
	}
	var os kadm.Offsets
	starts.Each(func(o kadm.ListedOffset) {
		os.Add(kadm.Offset{Topic: o.Topic, Partition: o.Partition, At: o.Offset, LeaderEpoch: -1})
	})
	resp, err := e.adm.CommitOffsets(ctx, group, os)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		e.t.Fatalf("reset %s: %v", group, err)
	}
}
