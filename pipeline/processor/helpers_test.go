package processor_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/devbroker"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/processor"
)

// env is one test's broker, topics, serdes and a plain client.
type env struct {
	t       testing.TB
	broker  *devbroker.Broker // nil on an external cluster
	kcfg    kafka.Config
	topics  kafka.Topics
	serdes  serdes
	cl      *kgo.Client
	nextSeq int
	t0      int64 // command times are t0 + sequence, in Unix ms
}

// newEnv makes a test's topics on the external cluster when KAFKA_BROKERS
// names one (pipelinetest.Kafka), else on an embedded broker of its own;
// with opts (the embedded broker's faults and settings) always on an
// embedded broker.
func newEnv(t testing.TB, partitions int32, opts ...kfake.Opt) *env {
	t.Helper()
	var b *devbroker.Broker
	brokers := pipelinetest.ExternalKafka()
	if len(brokers) == 0 || len(opts) > 0 {
		b = pipelinetest.Broker(t, opts...)
		brokers = b.Addrs()
	}
	topics := pipelinetest.Topics(t, brokers, partitions)
	ctx := context.Background()
	reg := avro.NewEmbedded()
	s, err := newSerdes(ctx, reg, topics)
	if err != nil {
		t.Fatal(err)
	}
	return &env{
		t: t, broker: b, kcfg: kafka.Config{Brokers: brokers}, topics: topics, serdes: s,
		cl: pipelinetest.Client(t, brokers, kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil))),
		t0: time.Now().UnixMilli(),
	}
}

// serdes are the ledger's serdes, built as package onceflow builds them (the
// tests do not import it: the library never imports the application).
type serdes struct {
	Commands, Events, State *avro.Serde
}

func newSerdes(ctx context.Context, reg avro.Registry, topics kafka.Topics) (serdes, error) {
	mk := func(topic, suffix string, types map[string]any) (*avro.Serde, error) {
		schemaText, err := ledger.SchemaOf(suffix)
		schema := []byte(schemaText)
		if err != nil {
			return nil, err
		}
		s, err := avro.NewSerde(reg, avro.ValueSubject(topic), string(schema), types)
		if err != nil {
			return nil, err
		}
		_, err = s.Register(ctx)
		return s, err
	}
	var s serdes
	var err error
	if s.Commands, err = mk(topics.Commands(), ledger.Commands, ledger.CommandTypes()); err != nil {
		return s, err
	}
	if s.Events, err = mk(topics.Events(), ledger.Events, ledger.EventTypes()); err != nil {
		return s, err
	}
	s.State, err = mk(topics.State(), ledger.State, map[string]any{"onceflow.Snapshot": processor.Snapshot[ledger.Account]{}})
	return s, err
}

func (s serdes) processor() processor.Serdes {
	return processor.Serdes{Commands: s.Commands, Events: s.Events, State: s.State}
}

// running is a processor running in the background.
type running struct {
	*processor.Processor[ledger.Account]
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan struct{}
	err    error // Run's result, once done is closed
}

// start runs a ledger processor with instance id and waits until it is
// ready. mod adjusts its configuration.
func (e *env) start(instance string, mod func(*processor.Config)) *running {
	return e.startWith(instance, ledger.NewDecider(), mod)
}

func (e *env) startWith(instance string, d pipeline.Decider[ledger.Account], mod func(*processor.Config)) *running {
	e.t.Helper()
	r := e.launch(instance, d, mod)
	r.waitReady(e.t, instance)
	return r
}

// launch runs a processor without waiting until it is ready.
func (e *env) launch(instance string, d pipeline.Decider[ledger.Account], mod func(*processor.Config)) *running {
	e.t.Helper()
	// A group (and so transactional ids) of the test's own: on a shared
	// cluster, parallel tests would otherwise join one group and fence
	// one another.
	cfg := processor.Config{Topics: e.topics, Group: "onceflow-processor-" + e.topics.Prefix, InstanceID: instance, SessionTimeout: 2 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	reg := prometheus.NewRegistry()
	p, err := processor.New(cfg, e.kcfg, d, e.serdes.processor(), nil, reg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Processor: p, reg: reg, cancel: cancel, done: make(chan struct{})}
	go func() {
		r.err = p.Run(ctx)
		close(r.done)
	}()
	e.t.Cleanup(func() { r.stop(e.t) })
	return r
}

// waitReady waits until the processor has joined and restored its
// partitions.
func (r *running) waitReady(t testing.TB, instance string) {
	t.Helper()
	select {
	case <-r.Ready():
	case <-r.done:
		t.Fatalf("processor %s ended before it was ready: %v", instance, r.err)
	case <-time.After(30 * time.Second):
		t.Fatalf("processor %s not ready within 30s", instance)
	}
}

// stop ends the processor gracefully and checks it returned nil.
func (r *running) stop(t testing.TB) {
	t.Helper()
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case <-r.done:
		if r.err != nil {
			t.Errorf("processor Run: %v", r.err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("processor did not stop within 30s")
	}
}

func (r *running) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue metrics
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
		}
	}
	return 0
}

// cmd is a command the test sends.
type cmd struct {
	id        pipeline.ID
	aggregate string
	payload   pipeline.Message
}

// newCmd returns a command with a fresh id.
func newCmd(aggregate string, payload pipeline.Message) cmd {
	return cmd{id: pipeline.NewCommandID(), aggregate: aggregate, payload: payload}
}

// record encodes c as a command record.
func (e *env) record(c cmd) *kgo.Record {
	e.t.Helper()
	value, err := e.serdes.Commands.Encode(context.Background(), c.payload)
	if err != nil {
		e.t.Fatal(err)
	}
	e.nextSeq++
	r, err := kafka.CommandRecord(e.topics.Commands(), c.aggregate, c.id, c.payload.MessageType(), value,
		time.UnixMilli(e.t0+int64(e.nextSeq)), "")
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

// recordAt encodes c as a command record of command time at.
func (e *env) recordAt(c cmd, at time.Time) *kgo.Record {
	e.t.Helper()
	r := e.record(c)
	r.Timestamp = at
	return r
}

// send produces commands in order.
func (e *env) send(cmds ...cmd) {
	e.t.Helper()
	recs := make([]*kgo.Record, len(cmds))
	for i, c := range cmds {
		recs[i] = e.record(c)
	}
	e.produce(recs...)
}

func (e *env) produce(recs ...*kgo.Record) {
	e.t.Helper()
	if err := e.cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		e.t.Fatal(err)
	}
}

// event is one record of the events topic, decoded.
type event struct {
	pipeline.Event
	partition int32
	offset    int64
	raw       *kgo.Record
}

// events reads the events topic, read_committed (or everything, aborted
// records included, with committed false), in partition and offset order.
func (e *env) events(committed bool) []event {
	e.t.Helper()
	var out []event
	for _, r := range e.read(e.topics.Events(), committed) {
		out = append(out, e.decodeEvent(r))
	}
	return out
}

func (e *env) decodeEvent(r *kgo.Record) event {
	e.t.Helper()
	v, err := e.serdes.Events.Decode(context.Background(), r.Value)
	if err != nil {
		e.t.Fatalf("decode event at %d/%d: %v", r.Partition, r.Offset, err)
	}
	h := headers(r)
	id, err := pipeline.ParseID(h[pipeline.HeaderEventID])
	if err != nil {
		e.t.Fatalf("event id: %v", err)
	}
	cid, err := pipeline.ParseID(h[pipeline.HeaderCommandID])
	if err != nil {
		e.t.Fatalf("event command id: %v", err)
	}
	ver, err := strconv.ParseInt(h[pipeline.HeaderAggregateVersion], 10, 64)
	if err != nil {
		e.t.Fatalf("event version: %v", err)
	}
	return event{
		Event: pipeline.Event{ID: id, CommandID: cid, Tenant: h[pipeline.HeaderTenant], AggregateID: string(r.Key),
			Version: ver, Time: r.Timestamp, Payload: v.(pipeline.Message)},
		partition: r.Partition, offset: r.Offset, raw: r,
	}
}

// read reads every partition of topic up to its end.
func (e *env) read(topic string, committed bool) []*kgo.Record {
	e.t.Helper()
	var out []*kgo.Record
	for part := int32(0); part < e.topics.Partitions; part++ {
		err := kafka.ReadPartition(context.Background(), e.cl, topic, part, committed, func(r *kgo.Record) error {
			out = append(out, r)
			return nil
		})
		if err != nil {
			e.t.Fatal(err)
		}
	}
	return out
}

func headers(r *kgo.Record) map[string]string {
	h := make(map[string]string, len(r.Headers))
	for _, x := range r.Headers {
		h[x.Key] = string(x.Value)
	}
	return h
}

// outcomes groups committed events by the command that caused them.
func outcomes(evs []event) map[pipeline.ID][]event {
	out := map[pipeline.ID][]event{}
	for _, ev := range evs {
		out[ev.CommandID] = append(out[ev.CommandID], ev)
	}
	return out
}

// waitOutcomes waits until every command in ids has at least one committed
// event, and returns the committed events.
func (e *env) waitOutcomes(within time.Duration, ids ...pipeline.ID) []event {
	e.t.Helper()
	var evs []event
	pipelinetest.Eventually(e.t, within, func() error {
		evs = e.events(true)
		got := outcomes(evs)
		missing := 0
		for _, id := range ids {
			if len(got[id]) == 0 {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d commands have no outcome yet", missing, len(ids))
		}
		return nil
	})
	return evs
}

// checkEventLog checks what every consumer of the events topic relies on:
// no event id twice, event ids derived from their command (index 0..n-1),
// versions 1..n per aggregate without gaps (a rejection repeats the
// current version), and the ledger's money conservation: every debit is
// matched by exactly one credit or refund.
func checkEventLog(t testing.TB, evs []event) (balances map[string]int64) {
	t.Helper()
	seen := map[pipeline.ID]bool{}
	version := map[string]int64{}
	byCommand := outcomes(evs)
	for _, ev := range evs {
		if seen[ev.ID] {
			t.Errorf("event %s (%s of command %s) appears twice", ev.ID, ev.Type(), ev.CommandID)
		}
		seen[ev.ID] = true
		want := version[ev.AggregateID] + 1
		switch ev.Payload.(type) {
		case pipeline.CommandRejected, pipeline.CommandFailed: // the aggregate is unchanged
			want--
		}
		if ev.Version != want {
			t.Errorf("%s: %s at version %d after version %d", ev.AggregateID, ev.Type(), ev.Version, version[ev.AggregateID])
		}
		version[ev.AggregateID] = ev.Version
	}
	for cid, group := range byCommand {
		index := map[string]int{} // a command id is one command per aggregate
		for _, ev := range group {
			if _, failed := ev.Payload.(pipeline.CommandFailed); failed {
				continue // its id names the DLQ'd delivery (pipeline.FailureEventID)
			}
			i := index[ev.AggregateID]
			index[ev.AggregateID]++
			if ev.ID != pipeline.EventID(ev.AggregateID, cid, i) {
				t.Errorf("command %s: event %d has id %s, want %s", cid, i, ev.ID, pipeline.EventID(ev.AggregateID, cid, i))
			}
		}
	}
	// Settlements are matched to their request through the derived
	// command ids: a credit's id is CreditCommandID(source, request, transfer id),
	// a refund's RefundCommandID(credit id).
	requestOf := map[pipeline.ID]pipeline.ID{}
	for _, ev := range evs {
		if d, ok := ev.Payload.(ledger.TransferDebited); ok {
			credit := ledger.CreditCommandID(ev.AggregateID, ev.CommandID, d.TransferID)
			requestOf[credit] = ev.CommandID
			requestOf[ledger.RefundCommandID(credit)] = ev.CommandID
		}
	}
	balances = map[string]int64{}
	debited := map[pipeline.ID]int64{}
	settled := map[pipeline.ID]int64{}
	settlements := map[pipeline.ID]int{}
	settle := func(ev event, amount int64) {
		req, ok := requestOf[ev.CommandID]
		if !ok {
			t.Errorf("%s of command %s matches no debit", ev.Type(), ev.CommandID)
		}
		settled[req] += amount
		settlements[req]++
	}
	for _, ev := range evs {
		switch p := ev.Payload.(type) {
		case ledger.Deposited:
			balances[ev.AggregateID] += p.Amount
		case ledger.Withdrawn:
			balances[ev.AggregateID] -= p.Amount
		case ledger.TransferDebited:
			balances[ev.AggregateID] -= p.Amount
			debited[ev.CommandID] += p.Amount
		case ledger.TransferCredited:
			balances[ev.AggregateID] += p.Amount
			settle(ev, p.Amount)
		case ledger.TransferRefunded:
			balances[ev.AggregateID] += p.Amount
			settle(ev, p.Amount)
		}
		if balances[ev.AggregateID] < 0 {
			t.Errorf("%s: balance %d after %s v%d", ev.AggregateID, balances[ev.AggregateID], ev.Type(), ev.Version)
		}
	}
	for req, amount := range debited {
		if settlements[req] != 1 || settled[req] != amount {
			t.Errorf("transfer request %s: debited %d, settled %d times for %d", req, amount, settlements[req], settled[req])
		}
	}
	return balances
}

// stateOf returns the processor's state, sorted for messages.
func stateOf(t testing.TB, p *processor.Processor[ledger.Account]) map[string]processor.AggregateState[ledger.Account] {
	t.Helper()
	st, err := p.State(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// waitBalance waits until the processor's state shows balance for an
// account: a committed event is visible a moment before the processor
// installs the state its transaction wrote.
func (r *running) waitBalance(t testing.TB, account string, balance int64) {
	t.Helper()
	r.waitState(t, account, func(s processor.AggregateState[ledger.Account]) error {
		if s.State.Balance != balance {
			return fmt.Errorf("%s: balance %d, want %d", account, s.State.Balance, balance)
		}
		return nil
	})
}

// waitState waits until cond accepts the processor's state of an aggregate.
func (r *running) waitState(t testing.TB, aggregate string, cond func(processor.AggregateState[ledger.Account]) error) {
	t.Helper()
	pipelinetest.Eventually(t, 10*time.Second, func() error { return cond(stateOf(t, r.Processor)[aggregate]) })
}
