package processor_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/processor"
)

// A producer writing straight to the commands topic gets no more trust than
// an HTTP client: every record that ingest would refuse goes to the DLQ
// with its reason, the ones that name a valid command of a valid aggregate
// are recorded on it as CommandFailed (so they are never pending), the
// good commands around them are applied once each, and a command id reused
// on another aggregate or by another tenant is another command.
func TestHostileRecords(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	p := e.start("p1", func(c *processor.Config) { c.MaxCommandBytes = 2048 })
	acc, other, foreign := "acme/acc-1", "acme/acc-2", "evil/acc-1"
	opens := []cmd{newCmd(acc, ledger.OpenAccount{Currency: "EUR"}), newCmd(other, ledger.OpenAccount{Currency: "EUR"}),
		newCmd(foreign, ledger.OpenAccount{Currency: "EUR"})}
	e.send(opens...)
	e.waitOutcomes(30*time.Second, opens[0].id, opens[1].id, opens[2].id)

	refund := func(reason string) cmd {
		return newCmd(acc, ledger.RefundTransfer{TransferID: "t1", To: "acc-2", Amount: 1, Reason: reason})
	}
	withKey := func(key string) *kgo.Record {
		r := e.record(newCmd(acc, ledger.Deposit{Amount: 1}))
		r.Key = []byte(key)
		r.Partition = partitionOf(t, e, acc) // kept on the account's partition, as a custom partitioner could
		return r
	}
	future := newCmd(acc, ledger.Deposit{Amount: 1})
	cases := []struct {
		reason string
		rec    *kgo.Record
		onAgg  bool // names a valid command of acc: recorded there as CommandFailed
	}{
		{processor.ReasonInvalidKey, withKey("acme/acc\xff1"), false},
		{processor.ReasonInvalidKey, withKey("acme/acc\x001"), false},
		{processor.ReasonInvalidKey, withKey("acme/" + strings.Repeat("a", pipeline.MaxLocalIDLen+1)), false},
		{processor.ReasonInvalidKey, withKey("ac me/acc-1"), false},
		{processor.ReasonInvalidField, e.record(refund("bad \x00 byte")), true},
		{processor.ReasonInvalidField, e.record(refund("bad \xc3\x28 utf-8")), true},
		{processor.ReasonInvalidField, e.record(newCmd(acc, ledger.Deposit{Amount: -5})), true},
		{processor.ReasonInvalidField, e.record(newCmd(acc, ledger.RequestTransfer{TransferID: "t 2", To: "acc-2", Amount: 1})), true},
		{processor.ReasonTooLarge, e.record(refund(strings.Repeat("x", 3000))), true},
		// Inside Apache Kafka 4's message.timestamp.after.max.ms (an hour),
		// which refuses a record dated later at produce.
		{processor.ReasonFutureTimestamp, e.recordAt(future, time.Now().Add(30*time.Minute)), true},
		// Dated before the commands topic's retention and a day; before
		// the Unix epoch; before year 0, which no JSON encoder of a time
		// takes; before 4713 BC, which Postgres's timestamps do not hold.
		{processor.ReasonPastTimestamp, e.recordAt(newCmd(acc, ledger.Deposit{Amount: 1}), time.Now().Add(-9*24*time.Hour)), true},
		{processor.ReasonPastTimestamp, e.recordAt(newCmd(acc, ledger.Deposit{Amount: 1}), time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC)), true},
		{processor.ReasonPastTimestamp, e.recordAt(newCmd(acc, ledger.Deposit{Amount: 1}), time.Date(-1, 6, 1, 0, 0, 0, 0, time.UTC)), true},
		{processor.ReasonPastTimestamp, e.recordAt(newCmd(acc, ledger.Deposit{Amount: 1}), time.Date(-5000, 1, 1, 0, 0, 0, 0, time.UTC)), true},
	}
	// The first good command's id is reused for the other account and for
	// another tenant's account: three commands, each applied.
	shared := newCmd(acc, ledger.Deposit{Amount: 100})
	sharedOther, sharedForeign := shared, shared
	sharedOther.aggregate, sharedForeign.aggregate = other, foreign
	var good []pipeline.ID
	e.send(shared, sharedOther, sharedForeign)
	for _, c := range cases {
		if c.rec.Partition != 0 || string(c.rec.Key) != acc {
			e.produceTo(c.rec)
		} else {
			e.produce(c.rec)
		}
		next := newCmd(acc, ledger.Deposit{Amount: 10})
		good = append(good, next.id)
		e.send(next)
	}
	// A malformed traceparent is dropped, as W3C Trace Context says; the
	// command is applied.
	tracedCmd := newCmd(acc, ledger.Deposit{Amount: 1000})
	traced := e.record(tracedCmd)
	traced.Headers = append(traced.Headers, kgo.RecordHeader{Key: pipeline.HeaderTraceparent, Value: []byte("00-\x00\xff-garbage")})
	e.produce(traced)

	e.waitOutcomes(30*time.Second, append(good, shared.id, tracedCmd.id)...)
	p.waitBalance(t, other, 100)
	p.waitBalance(t, foreign, 100)
	evs := e.events(true)
	balances := checkEventLog(t, evs)
	if want := int64(100 + 10*len(cases) + 1000); balances[acc] != want {
		t.Errorf("%s: balance %d, want %d", acc, balances[acc], want)
	}
	for _, a := range []string{other, foreign} {
		if balances[a] != 100 {
			t.Errorf("%s: balance %d, want 100 (the reused command id is its own command)", a, balances[a])
		}
	}
	// Whatever a record's time, what the processor writes is dated within
	// the bounds: a refused record's failure carries the time it was
	// handled.
	since := time.Now().Add(-time.Hour)
	for _, ev := range evs {
		if ev.Time.Before(since) || ev.Time.After(time.Now().Add(time.Minute)) {
			t.Errorf("event %s of %s dated %s, want within the last hour", ev.Type(), ev.AggregateID, ev.Time)
		}
	}
	var failed []pipeline.CommandFailed
	for _, ev := range evs {
		if f, ok := ev.Payload.(pipeline.CommandFailed); ok {
			if ev.AggregateID != acc || ev.Tenant != "acme" {
				t.Errorf("CommandFailed on %s (tenant %q), want only on %s", ev.AggregateID, ev.Tenant, acc)
			}
			failed = append(failed, f)
		}
		if ev.Traceparent != "" {
			t.Errorf("event %s carries traceparent %q", ev.Type(), ev.Traceparent)
		}
	}
	var wantFailed []string
	for _, c := range cases {
		if c.onAgg {
			wantFailed = append(wantFailed, c.reason)
		}
	}
	if len(failed) != len(wantFailed) {
		t.Fatalf("%d CommandFailed events, want %d: %+v", len(failed), len(wantFailed), failed)
	}
	for i, f := range failed {
		if f.Reason != wantFailed[i] || f.Detail == "" || f.CommandType == "" {
			t.Errorf("CommandFailed %d: %+v, want reason %s with a detail and a command type", i, f, wantFailed[i])
		}
	}

	var dlq []*kgo.Record
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if dlq = e.read(e.topics.DLQ(), true); len(dlq) != len(cases) {
			return fmt.Errorf("DLQ holds %d records, want %d", len(dlq), len(cases))
		}
		return nil
	})
	got := map[string]int{}
	for _, r := range dlq {
		got[headers(r)[pipeline.HeaderDLQReason]]++
		if r.Timestamp.Before(since) {
			t.Errorf("DLQ record of %s dated %s, want the time it was handled", headers(r)[pipeline.HeaderDLQReason], r.Timestamp)
		}
	}
	want := map[string]int{}
	for _, c := range cases {
		want[c.reason]++
	}
	for reason, n := range want {
		if got[reason] != n {
			t.Errorf("DLQ: %d records of reason %s, want %d (all: %v)", got[reason], reason, n, got)
		}
	}
	if n := p.metric(t, "onceflow_command_dedup_total"); n != 0 {
		t.Errorf("dedup: %v commands skipped, want 0 (a reused id on another aggregate is no duplicate)", n)
	}
}
