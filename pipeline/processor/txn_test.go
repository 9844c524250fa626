package processor_test

import (
	"bytes"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// workload sends n accounts an open and deposits, in one burst, and
// returns the command ids.
func (e *env) burst(prefix string, accounts, deposits int) []pipeline.ID {
	e.t.Helper()
	var cmds []cmd
	for a := range accounts {
		cmds = append(cmds, newCmd(fmt.Sprintf("acme/%s-%d", prefix, a), ledger.OpenAccount{Currency: "EUR"}))
	}
	for d := range deposits {
		for a := range accounts {
			cmds = append(cmds, newCmd(fmt.Sprintf("acme/%s-%d", prefix, a), ledger.Deposit{Amount: int64(1 + d)}))
		}
	}
	e.send(cmds...)
	ids := make([]pipeline.ID, len(cmds))
	for i, c := range cmds {
		ids[i] = c.id
	}
	return ids
}

// endTxnFault fails the next EndTxn that commits, for the processor's
// transactional id.
func (e *env) endTxnFault(txnID string, err *kerr.Error) *kfake.FaultHandle {
	return e.broker.Cluster().Fault(kfake.Fault{
		Keys:  []kmsg.Key{kmsg.EndTxn},
		TxnID: txnID,
		Err:   err,
		When:  func(r kmsg.Request) bool { return r.(*kmsg.EndTxnRequest).Commit },
	})
}

// checkRedecided checks a log in which some batches were aborted and
// decided again: read_committed holds each event once, and every aborted
// event has a committed twin with the same id and the same bytes. It
// returns how many aborted events the log holds.
func checkRedecided(t *testing.T, e *env, evs []event, commands int) int {
	t.Helper()
	checkEventLog(t, evs)
	if len(evs) != commands {
		t.Errorf("read_committed: %d events, want %d (one per command)", len(evs), commands)
	}
	committed := map[pipeline.ID]event{}
	for _, ev := range evs {
		committed[ev.ID] = ev
	}
	var aborted int
	for _, ev := range e.events(false) {
		c, ok := committed[ev.ID]
		if !ok {
			t.Errorf("aborted event %s (%s of command %s) was never committed", ev.ID, ev.Type(), ev.CommandID)
			continue
		}
		if c.offset == ev.offset && c.partition == ev.partition {
			continue // the committed copy itself
		}
		aborted++
		if !bytes.Equal(c.raw.Value, ev.raw.Value) || c.Version != ev.Version || c.raw.Timestamp != ev.raw.Timestamp {
			t.Errorf("event %s: the re-decided copy differs from the aborted one", ev.ID)
		}
	}
	return aborted
}

// A commit the broker refuses with UNKNOWN_SERVER_ERROR is unconfirmed to
// the client, which fence-aborts it and reports an abort; the processor
// decides the batch again from the state before it. The re-decided events
// carry the same ids (and bytes) as the aborted ones, and read_committed
// sees each once.
func TestIndeterminateCommitRedecidesSameIDs(t *testing.T) {
	pipelinetest.EmbeddedOnly(t, "EndTxn answered with an injected error", "TestBrokerKilledWithOpenTransaction (test/e2e: the broker killed with a transaction open, a commit's answer lost with it)")
	t.Parallel()
	e := newEnv(t, 2)
	p := e.start("p1", nil)
	fault := e.endTxnFault(p.Config().TransactionalID(), kerr.UnknownServerError)

	ids := e.burst("ind", 10, 5)
	evs := e.waitOutcomes(30*time.Second, ids...)
	if fault.Hits() != 1 {
		t.Fatalf("the EndTxn fault answered %d requests, want 1", fault.Hits())
	}
	aborted := checkRedecided(t, e, evs, len(ids))
	if aborted == 0 {
		t.Fatal("no aborted copy in the log: the fault did not abort a batch")
	}
	t.Logf("%d events were decided twice (aborted, then committed with the same ids)", aborted)
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if n := p.metric(t, "onceflow_processor_transactions_total", "result", "aborted"); n < 1 {
			return fmt.Errorf("aborted transactions: %v, want at least 1", n)
		}
		return nil
	})
}

// An EndTxn that fails with an error (REQUEST_TIMED_OUT, which kfake
// answers before acting) leaves the client unable to continue the session:
// the processor starts a new one, whose producer fences the old
// transaction, and decides the batch again with the same ids.
func TestIndeterminateCommitErrorStartsNewSession(t *testing.T) {
	pipelinetest.EmbeddedOnly(t, "EndTxn answered with an injected error", "TestBrokerKilledWithOpenTransaction (test/e2e: the broker killed with a transaction open, a commit's answer lost with it)")
	t.Parallel()
	e := newEnv(t, 2)
	p := e.start("p1", nil)
	fault := e.endTxnFault(p.Config().TransactionalID(), kerr.RequestTimedOut)

	ids := e.burst("err", 10, 5)
	evs := e.waitOutcomes(30*time.Second, ids...)
	if fault.Hits() != 1 {
		t.Fatalf("the EndTxn fault answered %d requests, want 1", fault.Hits())
	}
	if aborted := checkRedecided(t, e, evs, len(ids)); aborted == 0 {
		t.Error("no aborted copy in the log: the failed commit was not decided again")
	}
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if n := p.metric(t, "onceflow_processor_session_restarts_total"); n != 1 {
			return fmt.Errorf("session restarts: %v, want 1", n)
		}
		return nil
	})
	next := newCmd("acme/err-0", ledger.Deposit{Amount: 1000})
	e.send(next)
	e.waitOutcomes(30*time.Second, next.id)
	p.waitBalance(t, "acme/err-0", 1+2+3+4+5+1000)
}

// The true indeterminate commit: the broker commits, and the answer is
// lost with the connection. Whether the client retries and learns the
// outcome or gives up and starts a new session, nothing may be decided
// twice or lost: a new session restores the state and offsets the commit
// wrote.
func TestIndeterminateCommitAppliedResponseLost(t *testing.T) {
	pipelinetest.EmbeddedOnly(t, "listener that drops EndTxn's answer", "TestBrokerKilledWithOpenTransaction (test/e2e: the broker killed with a transaction open, a commit's answer lost with it)")
	t.Parallel()
	lossy := newLossyListener(kmsg.EndTxn)
	e := newEnv(t, 2, kfake.ListenFn(lossy.listen))
	p := e.start("p1", nil)
	// Every EndTxn answer is lost (retries included) until the processor
	// gives up on the transaction: otherwise a retry may learn the outcome,
	// which is correct too but not the case under test.
	lossy.lose.Store(math.MaxInt32)

	ids := e.burst("lost", 10, 5)
	pipelinetest.Eventually(t, 90*time.Second, func() error {
		if unknown := p.metric(t, "onceflow_processor_transactions_total", "result", "unknown"); unknown < 1 {
			return fmt.Errorf("no transaction of unknown outcome yet (%d EndTxn answers lost)", lossy.lost.Load())
		}
		return nil
	})
	lossy.lose.Store(0)
	evs := e.waitOutcomes(60*time.Second, ids...)
	if aborted := checkRedecided(t, e, evs, len(ids)); aborted != 0 {
		t.Errorf("%d events were decided again after a commit that happened", aborted)
	}
	pipelinetest.Eventually(t, 30*time.Second, func() error {
		if restarts := p.metric(t, "onceflow_processor_session_restarts_total"); restarts < 1 {
			return fmt.Errorf("session restarts %v, want at least 1", restarts)
		}
		return nil
	})
	// The new session restored the committed state: a deposit adds to it.
	next := newCmd("acme/lost-0", ledger.Deposit{Amount: 1000})
	e.send(next)
	e.waitOutcomes(30*time.Second, next.id)
	p.waitBalance(t, "acme/lost-0", 1+2+3+4+5+1000)
}
