package processor_test

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/processor"
)

// mixed sends a workload that exercises every kind of state change:
// opens, deposits, withdrawals (some overdrawing), transfers between the
// accounts (some to unknown ones, refunded), closes, and some commands sent
// twice with the same id. Sends are spread over several produce calls so
// the processor sees many batches.
func (e *env) mixed(rng *rand.Rand, prefix string, accounts, commands int) []pipeline.ID {
	e.t.Helper()
	acc := func(i int) string { return fmt.Sprintf("acme/%s-%d", prefix, i) }
	var opens []cmd
	for i := range accounts {
		opens = append(opens, newCmd(acc(i), ledger.OpenAccount{Currency: "EUR"}))
	}
	e.send(opens...)
	var ids []pipeline.ID
	for _, c := range opens {
		ids = append(ids, c.id)
	}
	var sent []cmd
	for n := 0; n < commands; {
		var chunk []cmd
		for range 50 {
			a := acc(rng.IntN(accounts))
			var c cmd
			switch r := rng.IntN(20); {
			case r < 8:
				c = newCmd(a, ledger.Deposit{Amount: int64(1 + rng.IntN(100))})
			case r < 12:
				c = newCmd(a, ledger.Withdraw{Amount: int64(1 + rng.IntN(150))})
			case r < 17:
				c = newCmd(a, ledger.RequestTransfer{TransferID: fmt.Sprintf("t%d", n), To: fmt.Sprintf("%s-%d", prefix, rng.IntN(accounts+2)), Amount: int64(1 + rng.IntN(50))})
			case r < 18:
				c = newCmd(a, ledger.CloseAccount{})
			default:
				if len(sent) == 0 {
					continue
				}
				c = sent[rng.IntN(len(sent))] // the same command again
			}
			chunk = append(chunk, c)
			sent = append(sent, c)
			ids = append(ids, c.id)
			n++
		}
		e.send(chunk...)
	}
	return ids
}

// settle waits until every command and every transfer follow-up has its
// outcome, and returns the committed events.
func (e *env) settle(within time.Duration, ids []pipeline.ID) []event {
	e.t.Helper()
	evs := e.waitOutcomes(within, ids...)
	// Follow-ups of the transfers: credits, then refunds of refused ones.
	for round := 0; round < 2; round++ {
		var more []pipeline.ID
		for _, ev := range evs {
			switch p := ev.Payload.(type) {
			case ledger.TransferDebited:
				more = append(more, ledger.CreditCommandID(ev.AggregateID, ev.CommandID, p.TransferID))
			case pipeline.CommandRejected:
				if p.CommandType == "CreditTransfer" {
					more = append(more, ledger.RefundCommandID(ev.CommandID))
				}
			}
		}
		evs = e.waitOutcomes(within, append(ids, more...)...)
	}
	return evs
}

// The state a processor restores after a restart equals, aggregate by
// aggregate, the state it held before: balances, versions and the
// remembered command ids. A command sent again after the restart is
// recognized as a duplicate.
func TestRestoreEqualsStateBeforeRestart(t *testing.T) {
	pipelinetest.EmbeddedOnly(t, "compaction on demand", "TestRestartMidStream (test/e2e), which restores the processors' state after restarts; Apache Kafka compacts on its log cleaner's schedule, which a test cannot call")
	t.Parallel()
	e := newEnv(t, 4)
	p1 := e.start("p1", nil)
	rng := rand.New(rand.NewPCG(7, 8))
	ids := e.mixed(rng, "r", 40, 1500)
	evs := e.settle(60*time.Second, ids)
	balances := checkEventLog(t, evs)

	// Wait until the last committed batch is installed.
	var before map[string]processor.AggregateState[ledger.Account]
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		before = stateOf(t, p1.Processor)
		for id, b := range balances {
			if before[id].State.Balance != b {
				return fmt.Errorf("%s: processor balance %d, events say %d", id, before[id].State.Balance, b)
			}
		}
		return nil
	})
	p1.stop(t)

	// Snapshots are rewritten by every batch that changes an aggregate:
	// compaction must leave the latest of each.
	e.broker.Cluster().Compact()

	p2 := e.start("p2", nil)
	after := stateOf(t, p2.Processor)
	if len(after) != len(before) {
		t.Errorf("restored %d aggregates, had %d", len(after), len(before))
	}
	for _, id := range sortedKeys(before) {
		if !reflect.DeepEqual(after[id], before[id]) {
			t.Errorf("%s: restored %+v, had %+v", id, after[id], before[id])
		}
	}
	if t.Failed() {
		return
	}

	// Commands sent again after the restart are all duplicates: the first
	// 200 records of the commands topic, as they were.
	n := p2.metric(t, "onceflow_command_dedup_total")
	var dup []*kgo.Record
	for _, r := range e.read(e.topics.Commands(), true)[:200] {
		dup = append(dup, &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: r.Headers, Timestamp: r.Timestamp})
	}
	e.produce(dup...)
	marker := newCmd("acme/r-0", ledger.Deposit{Amount: 1})
	e.send(marker)
	e.waitOutcomes(30*time.Second, marker.id)
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if got := p2.metric(t, "onceflow_command_dedup_total") - n; got != float64(len(dup)) {
			return fmt.Errorf("dedup after restart: %v commands skipped, want %d", got, len(dup))
		}
		return nil
	})
	if after := e.events(true); len(after) != len(evs)+1 {
		t.Errorf("events after replaying %d commands: %d, want %d (only the marker's)", len(dup), len(after), len(evs)+1)
	}
}

// The dedup window runs from when the processor handled a command: a
// duplicate of the oldest id inside it is skipped; once the window (and
// the sixteenth of it an id may be kept longer) has passed, the id is
// forgotten and its memory freed.
func TestDedupWindow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	t0 := time.UnixMilli(1_700_000_000_000)
	var clock atomic.Int64
	clock.Store(t0.UnixMilli())
	p := e.start("p1", func(c *processor.Config) {
		c.DedupWindow = time.Hour
		processor.SetClock(c, func() time.Time { return time.UnixMilli(clock.Load()) })
	})
	open := newCmd("acme/w", ledger.OpenAccount{Currency: "EUR"})
	dep := newCmd("acme/w", ledger.Deposit{Amount: 5})
	e.produce(e.recordAt(open, t0), e.recordAt(dep, t0))
	e.waitOutcomes(30*time.Second, open.id, dep.id)

	clock.Store(t0.Add(59 * time.Minute).UnixMilli())
	e.produce(e.recordAt(dep, t0))
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if n := p.metric(t, "onceflow_command_dedup_total"); n != 1 {
			return fmt.Errorf("dedup: %v, want 1 (the deposit sent again 59 minutes later)", n)
		}
		return nil
	})

	clock.Store(t0.Add(time.Hour + 5*time.Minute).UnixMilli())
	later := newCmd("acme/w", ledger.Deposit{Amount: 7})
	e.produce(e.recordAt(later, t0.Add(time.Hour+5*time.Minute)))
	e.waitOutcomes(30*time.Second, later.id)
	// The batch installs its ids and forgets the expired ones just after
	// its transaction commits, so its outcome can be read a moment before.
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if n := p.Remembered(); n != 1 {
			return fmt.Errorf("remembered %d ids 65 minutes later, want 1 (the last deposit)", n)
		}
		return nil
	})
	e.produce(e.recordAt(dep, t0))
	p.waitBalance(t, "acme/w", 17) // the first deposit, forgotten, is handled again
	if n := p.metric(t, "onceflow_command_dedup_total"); n != 1 {
		t.Errorf("dedup: %v, want still 1", n)
	}
}

// A command older than the aggregate's newest (a DLQ record redriven hours
// later keeps its original time) is remembered for a full window from the
// aggregate's newest command, not forgotten by the next one: redriven
// twice, with other commands between, it is handled once.
func TestOldCommandRememberedForAWindow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	now := time.UnixMilli(1_700_000_000_000)
	p := e.start("p1", func(c *processor.Config) {
		c.DedupWindow = time.Hour
		processor.SetClock(c, func() time.Time { return now.Add(2 * time.Minute) })
	})
	open := newCmd("acme/r", ledger.OpenAccount{Currency: "EUR"})
	old := newCmd("acme/r", ledger.Deposit{Amount: 5}) // from three hours before: three windows
	next, last := newCmd("acme/r", ledger.Deposit{Amount: 1}), newCmd("acme/r", ledger.Deposit{Amount: 2})
	e.produce(e.recordAt(open, now), e.recordAt(old, now.Add(-3*time.Hour)), e.recordAt(next, now.Add(time.Minute)),
		e.recordAt(old, now.Add(-3*time.Hour)), e.recordAt(last, now.Add(2*time.Minute)))
	e.waitOutcomes(30*time.Second, open.id, old.id, next.id, last.id)
	p.waitState(t, "acme/r", func(s processor.AggregateState[ledger.Account]) error {
		if s.State.Balance != 8 {
			return fmt.Errorf("balance %d, want 8: the old deposit once", s.State.Balance)
		}
		return nil
	})
	if n := p.metric(t, "onceflow_command_dedup_total"); n != 1 {
		t.Errorf("dedup: %v, want 1 (the old deposit's second delivery)", n)
	}
}
