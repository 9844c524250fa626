package ledger_test

import (
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
)

func cmd(aggregate string, payload pipeline.Message) pipeline.Command {
	return pipeline.Command{
		ID:          pipeline.MustParseID("01890a5d-ac96-774b-bcce-b302099a8057"),
		Tenant:      "acme",
		AggregateID: aggregate,
		Time:        time.UnixMilli(1_700_000_000_000),
		Payload:     payload,
	}
}

var (
	closedAcc = ledger.Account{Open: true, Closed: true, Currency: "EUR"}
	openAcc   = func(balance int64) ledger.Account {
		return ledger.Account{Open: true, Currency: "EUR", Balance: balance}
	}
)

func TestDecide(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		state  ledger.Account
		cmd    pipeline.Message
		events []pipeline.Message
		reject string
	}{
		{"open", ledger.Account{}, ledger.OpenAccount{Currency: "EUR"}, []pipeline.Message{ledger.AccountOpened{Currency: "EUR"}}, ""},
		{"open twice", openAcc(0), ledger.OpenAccount{Currency: "EUR"}, nil, ledger.ReasonAlreadyOpen},
		{"open bad currency", ledger.Account{}, ledger.OpenAccount{Currency: "eur"}, nil, ledger.ReasonInvalidCurrency},
		{"deposit", openAcc(5), ledger.Deposit{Amount: 10}, []pipeline.Message{ledger.Deposited{Amount: 10}}, ""},
		{"deposit unknown", ledger.Account{}, ledger.Deposit{Amount: 10}, nil, ledger.ReasonUnknownAccount},
		{"deposit closed", closedAcc, ledger.Deposit{Amount: 10}, nil, ledger.ReasonAccountClosed},
		{"deposit zero", openAcc(0), ledger.Deposit{Amount: 0}, nil, ledger.ReasonInvalidAmount},
		{"deposit negative", openAcc(0), ledger.Deposit{Amount: -1}, nil, ledger.ReasonInvalidAmount},
		{"deposit overflow", openAcc(math.MaxInt64 - 5), ledger.Deposit{Amount: 6}, nil, ledger.ReasonBalanceOverflow},
		{"deposit to the brim", openAcc(math.MaxInt64 - 5), ledger.Deposit{Amount: 5}, []pipeline.Message{ledger.Deposited{Amount: 5}}, ""},
		{"withdraw", openAcc(10), ledger.Withdraw{Amount: 10}, []pipeline.Message{ledger.Withdrawn{Amount: 10}}, ""},
		{"withdraw overdraft", openAcc(10), ledger.Withdraw{Amount: 11}, nil, ledger.ReasonInsufficientFunds},
		{"close at zero", openAcc(0), ledger.CloseAccount{}, []pipeline.Message{ledger.AccountClosed{}}, ""},
		{"close with money", openAcc(1), ledger.CloseAccount{}, nil, ledger.ReasonBalanceNotZero},
		{"close twice", closedAcc, ledger.CloseAccount{}, nil, ledger.ReasonAccountClosed},
		{"transfer to self", openAcc(10), ledger.RequestTransfer{TransferID: "t1", To: "a", Amount: 5}, nil, ledger.ReasonInvalidTarget},
		{"transfer to another tenant", openAcc(10), ledger.RequestTransfer{TransferID: "t1", To: "x/y", Amount: 5}, nil, ledger.ReasonWrongTenant},
		{"transfer bad target", openAcc(10), ledger.RequestTransfer{TransferID: "t1", To: "acme/y", Amount: 5}, nil, ledger.ReasonInvalidTarget},
		{"transfer bad target id", openAcc(10), ledger.RequestTransfer{TransferID: "t1", To: "a b", Amount: 5}, nil, ledger.ReasonInvalidTarget},
		{"transfer overdraft", openAcc(4), ledger.RequestTransfer{TransferID: "t1", To: "b", Amount: 5}, nil, ledger.ReasonInsufficientFunds},
		{"credit", openAcc(1), ledger.CreditTransfer{TransferID: "t1", From: "a", Amount: 5, Currency: "EUR"}, []pipeline.Message{ledger.TransferCredited{TransferID: "t1", From: "a", Amount: 5}}, ""},
		{"refund to a closed account", closedAcc, ledger.RefundTransfer{TransferID: "t1", To: "b", Amount: 5, Reason: "x"}, []pipeline.Message{ledger.TransferRefunded{TransferID: "t1", To: "b", Amount: 5, Reason: "x"}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := ledger.NewDecider().Decide(tc.state, cmd("acme/a", tc.cmd))
			if tc.reject != "" {
				r, ok := pipeline.AsRejection(err)
				if !ok || r.Reason != tc.reject {
					t.Fatalf("got %v, want rejection %s", err, tc.reject)
				}
				return
			}
			if err != nil {
				t.Fatalf("got %v, want events %v", err, tc.events)
			}
			if !reflect.DeepEqual(d.Events, tc.events) {
				t.Fatalf("events: got %v, want %v", d.Events, tc.events)
			}
		})
	}
}

// A transfer debits the source and sends the credit to the target in the
// same decision, with an id derived from the request; a credit the target
// cannot take is refused and sends the money back.
func TestTransferRoundTrip(t *testing.T) {
	t.Parallel()
	c := cmd("acme/a", ledger.RequestTransfer{TransferID: "t1", To: "b", Amount: 30})
	d, err := ledger.NewDecider().Decide(openAcc(100), c)
	if err != nil {
		t.Fatal(err)
	}
	if want := []pipeline.Message{ledger.TransferDebited{TransferID: "t1", To: "b", Amount: 30}}; !reflect.DeepEqual(d.Events, want) {
		t.Fatalf("events: got %v, want %v", d.Events, want)
	}
	wantCredit := pipeline.Effect{
		AggregateID: "acme/b",
		CommandID:   ledger.CreditCommandID(c.AggregateID, c.ID, "t1"),
		Payload:     ledger.CreditTransfer{TransferID: "t1", From: "a", Amount: 30, Currency: "EUR"},
	}
	if len(d.Commands) != 1 || !reflect.DeepEqual(d.Commands[0], wantCredit) {
		t.Fatalf("commands: got %+v, want %+v", d.Commands, wantCredit)
	}
	// Deciding again gives the same credit id.
	d2, _ := ledger.NewDecider().Decide(openAcc(100), c)
	if d2.Commands[0].CommandID != wantCredit.CommandID {
		t.Fatal("deciding the same request again gave another credit id")
	}
	// Another request reusing the transfer id gets another credit id.
	other := c
	other.ID = pipeline.NewCommandID()
	if d3, _ := ledger.NewDecider().Decide(openAcc(100), other); d3.Commands[0].CommandID == wantCredit.CommandID {
		t.Fatal("two requests share a credit id")
	}

	for _, target := range []ledger.Account{{}, closedAcc, {Open: true, Currency: "USD"}} {
		credit := cmd("acme/b", wantCredit.Payload)
		credit.ID = wantCredit.CommandID
		d, err := ledger.NewDecider().Decide(target, credit)
		if _, ok := pipeline.AsRejection(err); !ok {
			t.Fatalf("target %+v: got %v, want a rejection", target, err)
		}
		if len(d.Commands) != 1 {
			t.Fatalf("target %+v: got %d commands, want the refund", target, len(d.Commands))
		}
		refund := d.Commands[0]
		if refund.AggregateID != "acme/a" || refund.CommandID != ledger.RefundCommandID(credit.ID) {
			t.Fatalf("refund went to %s with id %s", refund.AggregateID, refund.CommandID)
		}
		if p := refund.Payload.(ledger.RefundTransfer); p.Amount != 30 || p.TransferID != "t1" {
			t.Fatalf("refund payload %+v", p)
		}
	}
}

// Money is conserved: evolving a source through a debit and a refund, and
// a target through a credit, moves exactly the amount.
func TestEvolve(t *testing.T) {
	t.Parallel()
	d := ledger.NewDecider()
	s := ledger.Account{}
	for _, e := range []pipeline.Message{
		ledger.AccountOpened{Currency: "EUR"}, ledger.Deposited{Amount: 100}, ledger.Withdrawn{Amount: 30},
		ledger.TransferDebited{Amount: 50}, ledger.TransferRefunded{Amount: 50}, ledger.TransferCredited{Amount: 5},
		pipeline.CommandRejected{Reason: "x"},
	} {
		s = d.Evolve(s, pipeline.Event{Payload: e})
	}
	if want := (ledger.Account{Open: true, Currency: "EUR", Balance: 75}); s != want {
		t.Fatalf("got %+v, want %+v", s, want)
	}
	if s = d.Evolve(s, pipeline.Event{Payload: ledger.AccountClosed{}}); !s.Closed {
		t.Fatal("AccountClosed did not close")
	}
}

// Every command of the commands schema has a decide function, and nothing
// else does: the processor sends a command of an unregistered type to the
// DLQ, so a gap here would dead-letter valid commands.
func TestDeciderHandlesEveryCommand(t *testing.T) {
	t.Parallel()
	d := ledger.NewDecider()
	var want []string
	for _, v := range ledger.CommandTypes() {
		want = append(want, v.(pipeline.Message).MessageType())
	}
	slices.Sort(want)
	if got := d.CommandTypes(); !slices.Equal(got, want) {
		t.Fatalf("handled command types: got %v, want %v", got, want)
	}
	if d.Handles("Teleport") {
		t.Fatal("Handles(Teleport) = true")
	}
}

// One request id sent to two accounts is two requests (a command id is
// scoped to its aggregate): their credits to one target must not share an
// id, or the target would absorb the second debit's credit as a duplicate.
func TestCreditIDsAreScopedToTheSource(t *testing.T) {
	t.Parallel()
	transfer := ledger.RequestTransfer{TransferID: "t1", To: "c", Amount: 10}
	var credits []pipeline.ID
	for _, source := range []string{"acme/a", "acme/b"} {
		d, err := ledger.NewDecider().Decide(openAcc(100), cmd(source, transfer))
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Commands) != 1 {
			t.Fatalf("%s: %d follow-up commands, want the credit", source, len(d.Commands))
		}
		credits = append(credits, d.Commands[0].CommandID)
	}
	if credits[0] == credits[1] {
		t.Fatalf("the credits of one request id sent to two accounts share the id %s", credits[0])
	}
}
