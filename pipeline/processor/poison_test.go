package processor_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/processor"
)

// flaky is the ledger with the bugs a release could ship: a deposit of 666
// panics, a deposit of 667 fails with an error that is not a rejection, a
// withdrawal emits an event the events schema does not have; and it does
// not handle CloseAccount at all.
func flaky() *pipeline.Aggregate[ledger.Account] {
	d := ledger.NewDecider()
	a := pipeline.NewAggregate(ledger.Evolve)
	pipeline.Handle(a, func(s ledger.Account, c pipeline.Command, p ledger.OpenAccount) (pipeline.Decision, error) {
		return d.Decide(s, c)
	})
	pipeline.Handle(a, func(s ledger.Account, c pipeline.Command, p ledger.Deposit) (pipeline.Decision, error) {
		switch p.Amount {
		case 666:
			var m map[string]int
			//lint:ignore SA5000 a nil map write on purpose: the panic the processor must survive
			m["boom"]++
		case 667:
			return pipeline.Decision{}, errors.New("ledger service unavailable")
		}
		return d.Decide(s, c)
	})
	pipeline.Handle(a, func(s ledger.Account, c pipeline.Command, p ledger.Withdraw) (pipeline.Decision, error) {
		return pipeline.Emit(strange{}), nil
	})
	return a
}

// strange is an event no schema has.
type strange struct{}

func (strange) MessageType() string { return "Strange" }

// Every kind of poison command goes to the DLQ with its reason and the
// source coordinates, in the transaction that commits its offset, and the
// commands behind it on the same partition (the same account) still flow.
func TestPoisonCommandsGoToTheDLQ(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	p := e.startWith("p1", flaky(), nil)
	ctx := context.Background()
	acc := "acme/acc-1"
	open := newCmd(acc, ledger.OpenAccount{Currency: "EUR"})
	e.send(open)

	good := func() *kgo.Record { return e.record(newCmd(acc, ledger.Deposit{Amount: 1})) }
	withHeader := func(r *kgo.Record, key, value string) *kgo.Record {
		for i, h := range r.Headers {
			if h.Key == key {
				if value == "" {
					r.Headers = append(r.Headers[:i], r.Headers[i+1:]...)
				} else {
					r.Headers[i].Value = []byte(value)
				}
				return r
			}
		}
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: key, Value: []byte(value)})
		return r
	}
	eventValue, err := e.serdes.Events.Encode(ctx, ledger.Deposited{Amount: 1})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		reason string
		rec    *kgo.Record
	}{
		{processor.ReasonUndecodable, func() *kgo.Record { r := good(); r.Value = []byte("not avro at all"); return r }()},
		{processor.ReasonUndecodable, func() *kgo.Record { r := good(); r.Value = nil; return r }()},
		{processor.ReasonUndecodable, func() *kgo.Record { r := good(); r.Value = r.Value[:len(r.Value)-1]; return r }()},
		{processor.ReasonUnknownSchema, func() *kgo.Record { r := good(); r.Value = avro.AppendHeader(nil, 4242); return r }()},
		// An events-topic value on the commands topic: a schema the
		// registry has, whose type is no command.
		{processor.ReasonUnknownType, func() *kgo.Record { r := good(); r.Value = eventValue; return r }()},
		// A command of the schema that no decider is registered for.
		{processor.ReasonUnknownType, e.record(newCmd(acc, ledger.CloseAccount{}))},
		{processor.ReasonCommandTypeMismatch, withHeader(good(), pipeline.HeaderCommandType, "Withdraw")},
		{processor.ReasonMissingCommandID, withHeader(good(), pipeline.HeaderCommandID, "")},
		{processor.ReasonInvalidCommandID, withHeader(good(), pipeline.HeaderCommandID, "42")},
		{processor.ReasonMissingTenant, withHeader(good(), pipeline.HeaderTenant, "")},
		{processor.ReasonTenantMismatch, withHeader(good(), pipeline.HeaderTenant, "evil")},
		{processor.ReasonInvalidKey, func() *kgo.Record { r := good(); r.Key = []byte("no-tenant"); return r }()},
		{processor.ReasonDeciderPanic, e.record(newCmd(acc, ledger.Deposit{Amount: 666}))},
		{processor.ReasonDeciderError, e.record(newCmd(acc, ledger.Deposit{Amount: 667}))},
		{processor.ReasonEncode, e.record(newCmd(acc, ledger.Withdraw{Amount: 1}))},
	}
	// Each poison record is followed by a good deposit to the same
	// account, so they share a partition.
	var deposits []pipeline.ID
	for _, c := range cases {
		next := newCmd(acc, ledger.Deposit{Amount: 10})
		deposits = append(deposits, next.id)
		if string(c.rec.Key) == "no-tenant" {
			// Kept on the account's partition, as a producer with a
			// custom partitioner could.
			c.rec.Partition = partitionOf(t, e, acc)
			e.produceTo(c.rec)
		} else {
			e.produce(c.rec)
		}
		e.send(next)
	}
	evs := e.waitOutcomes(30*time.Second, append(deposits, open.id)...)
	if got := checkEventLog(t, evs)[acc]; got != int64(10*len(cases)) {
		t.Errorf("balance %d, want %d: every good deposit, none of the poison", got, 10*len(cases))
	}

	var dlq []*kgo.Record
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		dlq = e.read(e.topics.DLQ(), true)
		if len(dlq) < len(cases) {
			return errors.New("DLQ: " + strconv.Itoa(len(dlq)) + " records")
		}
		return nil
	})
	if len(dlq) != len(cases) {
		t.Fatalf("DLQ holds %d records, want %d", len(dlq), len(cases))
	}
	// DLQ records are keyed by the original key; order them as their
	// sources were.
	sort.Slice(dlq, func(i, j int) bool {
		oi, _ := strconv.ParseInt(headers(dlq[i])[pipeline.HeaderDLQSourceOffset], 10, 64)
		oj, _ := strconv.ParseInt(headers(dlq[j])[pipeline.HeaderDLQSourceOffset], 10, 64)
		return oi < oj
	})
	srcPart := partitionOf(t, e, acc)
	for i, c := range cases {
		r := dlq[i]
		h := headers(r)
		if h[pipeline.HeaderDLQReason] != c.reason {
			t.Errorf("case %d: dlq-reason %q (detail %q), want %q", i, h[pipeline.HeaderDLQReason], h[processor.HeaderDLQDetail], c.reason)
		}
		if h[processor.HeaderDLQDetail] == "" {
			t.Errorf("case %d: no dlq-detail", i)
		}
		if h[pipeline.HeaderDLQSourceTopic] != e.topics.Commands() || h[pipeline.HeaderDLQSourcePartition] != strconv.Itoa(int(srcPart)) {
			t.Errorf("case %d: source %s/%s, want %s/%d", i, h[pipeline.HeaderDLQSourceTopic], h[pipeline.HeaderDLQSourcePartition], e.topics.Commands(), srcPart)
		}
		if _, err := strconv.ParseInt(h[pipeline.HeaderDLQSourceOffset], 10, 64); err != nil {
			t.Errorf("case %d: dlq-source-offset %q", i, h[pipeline.HeaderDLQSourceOffset])
		}
		if string(r.Key) != string(c.rec.Key) || string(r.Value) != string(c.rec.Value) {
			t.Errorf("case %d: the DLQ record does not carry the original key and value", i)
		}
	}
	for _, reason := range []string{processor.ReasonUndecodable, processor.ReasonDeciderPanic} {
		want := 0.0
		for _, c := range cases {
			if c.reason == reason {
				want++
			}
		}
		pipelinetest.Eventually(t, 10*time.Second, func() error {
			if got := p.metric(t, "onceflow_dlq_records_total", "reason", reason); got != want {
				return fmt.Errorf("onceflow_dlq_records_total{reason=%q} = %v, want %v", reason, got, want)
			}
			return nil
		})
	}
}

// partitionOf is the commands partition of an aggregate (murmur2 of the key).
func partitionOf(t *testing.T, e *env, aggregate string) int32 {
	t.Helper()
	r := e.record(newCmd(aggregate, ledger.Deposit{Amount: 1}))
	r.Topic = e.topics.Commands()
	return int32(kgo.StickyKeyPartitioner(nil).ForTopic(r.Topic).Partition(r, int(e.topics.Partitions)))
}

// produceTo produces r to the partition it names.
func (e *env) produceTo(r *kgo.Record) {
	e.t.Helper()
	cl := pipelinetest.Client(e.t, e.kcfg.Brokers, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
		e.t.Fatal(err)
	}
}

// A command whose decision the broker can never take (an event and a
// snapshot over the broker's message size limit, or over the client's
// own) goes to the DLQ with reason output-refused, after one aborted try,
// instead of stalling its partition; nothing of its decision is committed
// and the commands behind it on the same account are decided.
func TestRefusedDecisionGoesToTheDLQ(t *testing.T) {
	pipelinetest.EmbeddedOnly(t, "message.max.bytes lowered to 64 KiB", "TestHostileProducer (test/e2e), whose record over the topic's max.message.bytes the broker refuses")
	t.Parallel()
	e := newEnv(t, 2, kfake.BrokerConfigs(map[string]string{"message.max.bytes": "65536"}))
	d := ledger.NewDecider()
	a := pipeline.NewAggregate(ledger.Evolve)
	pipeline.Handle(a, func(s ledger.Account, c pipeline.Command, p ledger.OpenAccount) (pipeline.Decision, error) {
		return d.Decide(s, c)
	})
	// Random text: the broker's limit applies to compressed batches.
	noise := func(n int) string {
		b := make([]byte, n/2)
		crand.Read(b)
		return hex.EncodeToString(b)
	}
	pipeline.Handle(a, func(s ledger.Account, c pipeline.Command, p ledger.Deposit) (pipeline.Decision, error) {
		switch p.Amount {
		case 668: // over the broker's 64 KiB
			return pipeline.Emit(ledger.AccountOpened{Currency: noise(200_000)}), nil
		case 669: // over the client's 1 MB
			return pipeline.Emit(ledger.AccountOpened{Currency: noise(1_100_000)}), nil
		}
		return d.Decide(s, c)
	})
	p := e.startWith("p1", a, nil)
	acc := "acme/acc-1"
	open := newCmd(acc, ledger.OpenAccount{Currency: "EUR"})
	big, huge := newCmd(acc, ledger.Deposit{Amount: 668}), newCmd(acc, ledger.Deposit{Amount: 669})
	var good []pipeline.ID
	e.send(open)
	for _, c := range []cmd{big, huge} {
		next := newCmd(acc, ledger.Deposit{Amount: 10})
		good = append(good, next.id)
		e.send(c, next)
	}
	evs := e.waitOutcomes(30*time.Second, append(good, open.id)...)
	if got := checkEventLog(t, evs)[acc]; got != 20 {
		t.Errorf("balance %d, want 20: the good deposits, none of the refused", got)
	}
	for _, ev := range evs {
		if ev.CommandID != big.id && ev.CommandID != huge.id {
			continue
		}
		if f, ok := ev.Payload.(pipeline.CommandFailed); !ok || f.Reason != processor.ReasonOutputRefused {
			t.Errorf("refused command %s has a committed event %s, want only its CommandFailed", ev.CommandID, ev.Type())
		}
	}
	p.waitState(t, acc, func(s processor.AggregateState[ledger.Account]) error {
		if s.State.Currency != "EUR" || s.State.Balance != 20 {
			return fmt.Errorf("state has a currency of %d bytes and balance %d, want EUR with balance 20", len(s.State.Currency), s.State.Balance)
		}
		return nil
	})
	var dlq []*kgo.Record
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if dlq = e.read(e.topics.DLQ(), true); len(dlq) < 2 {
			return fmt.Errorf("DLQ: %d records", len(dlq))
		}
		return nil
	})
	if len(dlq) != 2 {
		t.Fatalf("DLQ holds %d records, want 2", len(dlq))
	}
	for _, r := range dlq {
		h := headers(r)
		id := h[pipeline.HeaderCommandID]
		if id != big.id.String() && id != huge.id.String() {
			t.Errorf("DLQ holds command %s, not one of the refused", id)
		}
		if h[pipeline.HeaderDLQReason] != processor.ReasonOutputRefused || !strings.Contains(h[processor.HeaderDLQDetail], "MESSAGE_TOO_LARGE") {
			t.Errorf("command %s: dlq-reason %q detail %q, want %s naming MESSAGE_TOO_LARGE", id,
				h[pipeline.HeaderDLQReason], h[processor.HeaderDLQDetail], processor.ReasonOutputRefused)
		}
	}
	if got := p.metric(t, "onceflow_dlq_records_total", "reason", processor.ReasonOutputRefused); got != 2 {
		t.Errorf("onceflow_dlq_records_total{reason=output-refused} = %v, want 2", got)
	}
}
