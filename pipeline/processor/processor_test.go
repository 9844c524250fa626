package processor_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/pipelinetest"
	"github.com/onceflow/onceflow/pipeline/processor"
)

// The ledger's every command through a real processor and broker: events
// with derived ids and versions, rejections (overdraft, unknown account,
// closed account, another tenant's account) as CommandRejected with their
// reason, a transfer that debits the source and credits the target in one
// transaction, and transfers the target cannot take coming back as
// refunds. Money is conserved.
func TestLedgerCommands(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	p := e.start("p1", nil)

	a, b, usd := "acme/a", "acme/b", "acme/usd"
	steps := []struct {
		c      cmd
		events []string // event types of the outcome, in order
		reject string
		fail   string // a DLQ reason: the outcome is one CommandFailed
	}{
		{newCmd(a, ledger.OpenAccount{Currency: "EUR"}), []string{"AccountOpened"}, "", ""},
		{newCmd(b, ledger.OpenAccount{Currency: "EUR"}), []string{"AccountOpened"}, "", ""},
		{newCmd(usd, ledger.OpenAccount{Currency: "USD"}), []string{"AccountOpened"}, "", ""},
		{newCmd(a, ledger.Deposit{Amount: 100}), []string{"Deposited"}, "", ""},
		{newCmd(a, ledger.Withdraw{Amount: 500}), nil, ledger.ReasonInsufficientFunds, ""},
		{newCmd(a, ledger.Withdraw{Amount: 10}), []string{"Withdrawn"}, "", ""},
		{newCmd("acme/ghost", ledger.Deposit{Amount: 5}), nil, ledger.ReasonUnknownAccount, ""},
		{newCmd(a, ledger.RequestTransfer{TransferID: "t1", To: "b", Amount: 30}), []string{"TransferDebited"}, "", ""},
		{newCmd(a, ledger.RequestTransfer{TransferID: "t2", To: "nobody", Amount: 20}), []string{"TransferDebited"}, "", ""},
		{newCmd(a, ledger.RequestTransfer{TransferID: "t3", To: "usd", Amount: 5}), []string{"TransferDebited"}, "", ""},
		{newCmd(b, ledger.CloseAccount{}), nil, ledger.ReasonBalanceNotZero, ""},
		{newCmd(usd, ledger.CloseAccount{}), []string{"AccountClosed"}, "", ""},
		{newCmd(usd, ledger.Deposit{Amount: 1}), nil, ledger.ReasonAccountClosed, ""},
		// A target in another tenant is no local id: the field check
		// refuses it, as ingest would, before the decider sees it.
		{newCmd(a, ledger.RequestTransfer{TransferID: "t4", To: "evil/b", Amount: 1}), nil, "", processor.ReasonInvalidField},
	}
	// The follow-ups: t1's credit lands; t2's credit is refused (unknown
	// account) and refunded; t3's is refused (currency) and refunded.
	credit := func(i int, tr string) pipeline.ID {
		return ledger.CreditCommandID(steps[i].c.aggregate, steps[i].c.id, tr)
	}
	followUps := []pipeline.ID{
		credit(7, "t1"), credit(8, "t2"), credit(9, "t3"),
		ledger.RefundCommandID(credit(8, "t2")), ledger.RefundCommandID(credit(9, "t3")),
	}
	// Commands to different accounts are ordered only per account: the
	// closes go once the transfers have settled.
	var ids []pipeline.ID
	for i, s := range steps {
		if i == 10 {
			e.waitOutcomes(30*time.Second, append(ids, followUps...)...)
		}
		e.send(s.c)
		ids = append(ids, s.c.id)
	}
	evs := e.waitOutcomes(30*time.Second, append(ids, followUps...)...)
	byCmd := outcomes(evs)
	for i, s := range steps {
		got := byCmd[s.c.id]
		if s.fail != "" {
			f, ok := got[0].Payload.(pipeline.CommandFailed)
			if len(got) != 1 || !ok || f.Reason != s.fail || f.CommandType != s.c.payload.MessageType() {
				t.Errorf("step %d (%s): got %v, want one CommandFailed %s", i, s.c.payload.MessageType(), got, s.fail)
			}
			continue
		}
		if s.reject != "" {
			r, ok := got[0].Payload.(pipeline.CommandRejected)
			if len(got) != 1 || !ok || r.Reason != s.reject || r.CommandType != s.c.payload.MessageType() {
				t.Errorf("step %d (%s): got %v, want one CommandRejected %s", i, s.c.payload.MessageType(), got, s.reject)
			}
			continue
		}
		if len(got) != len(s.events) {
			t.Errorf("step %d (%s): got %d events, want %v", i, s.c.payload.MessageType(), len(got), s.events)
			continue
		}
		for j, ev := range got {
			if ev.Type() != s.events[j] {
				t.Errorf("step %d: event %d is %s, want %s", i, j, ev.Type(), s.events[j])
			}
		}
	}
	wantOutcome := map[pipeline.ID]string{
		followUps[0]: "TransferCredited",
		followUps[1]: "CommandRejected:" + ledger.ReasonUnknownAccount,
		followUps[2]: "CommandRejected:" + ledger.ReasonCurrencyMismatch,
		followUps[3]: "TransferRefunded",
		followUps[4]: "TransferRefunded",
	}
	for id, want := range wantOutcome {
		got := byCmd[id]
		desc := got[0].Type()
		if r, ok := got[0].Payload.(pipeline.CommandRejected); ok {
			desc += ":" + r.Reason
		}
		if len(got) != 1 || desc != want {
			t.Errorf("follow-up %s: got %d events, first %s; want %s", id, len(got), desc, want)
		}
	}
	// Each decision's events name the commands it sent, a rejection's too
	// (the credit refused sends the refund); a decision that sent none
	// names none.
	derived := map[pipeline.ID]pipeline.CommandRef{
		steps[7].c.id: {ID: followUps[0], AggregateID: b, Type: "CreditTransfer"},
		steps[8].c.id: {ID: followUps[1], AggregateID: "acme/nobody", Type: "CreditTransfer"},
		followUps[1]:  {ID: followUps[3], AggregateID: a, Type: "RefundTransfer"},
		followUps[2]:  {ID: followUps[4], AggregateID: a, Type: "RefundTransfer"},
	}
	envelope := func(id pipeline.ID) pipeline.Event {
		got := byCmd[id]
		if len(got) != 1 {
			t.Fatalf("command %s: %d events, want 1", id, len(got))
		}
		ev, err := kafka.EventOf(got[0].raw)
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	for cause, want := range derived {
		if ev := envelope(cause); len(ev.Derived) != 1 || ev.Derived[0] != want {
			t.Errorf("command %s: event names the derived commands %v, want %v", cause, ev.Derived, want)
		}
	}
	if ev := envelope(steps[3].c.id); ev.Derived != nil {
		t.Errorf("the deposit's event names derived commands %v", ev.Derived)
	}
	balances := checkEventLog(t, evs)
	want := map[string]int64{a: 60, b: 30, usd: 0}
	for id, w := range want {
		if balances[id] != w {
			t.Errorf("%s: balance from events %d, want %d", id, balances[id], w)
		}
	}
	// The processor installs a batch's state a moment after its events are
	// visible.
	for id, w := range want {
		p.waitBalance(t, id, w)
	}
	pipelinetest.Eventually(t, 10*time.Second, func() error {
		if n := p.metric(t, "onceflow_processor_commands_total", "outcome", "rejected"); n != 6 {
			return fmt.Errorf("rejected commands: %v, want 6", n)
		}
		return nil
	})
}
