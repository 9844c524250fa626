package avro_test

import (
	"context"
	"os"
	"testing"

	"github.com/onceflow/onceflow/examples/ledger"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/avro"
)

// Test types mirroring examples/ledger's schemas, as the ledger package will define
// them. Tags are mostly explicit; a few fields rely on the snake_case
// fallback.

type (
	openAccount     struct{ Currency string }
	deposit         struct{ Amount int64 }
	withdraw        struct{ Amount int64 }
	closeAccount    struct{}
	requestTransfer struct {
		TransferID string `avro:"transfer_id"`
		To         string `avro:"to"`
		Amount     int64  `avro:"amount"`
	}
	creditTransfer struct {
		TransferID string `avro:"transfer_id"`
		From       string `avro:"from"`
		Amount     int64  `avro:"amount"`
		Currency   string `avro:"currency"`
	}
	refundTransfer struct {
		TransferID string // transfer_id
		To         string `avro:"to"`
		Amount     int64  `avro:"amount"`
		Reason     string `avro:"reason"`
	}
)

func (openAccount) MessageType() string { return "OpenAccount" }
func (deposit) MessageType() string     { return "Deposit" }

type (
	accountOpened struct {
		Currency string `avro:"currency"`
	}
	deposited struct {
		Amount int64 `avro:"amount"`
	}
	withdrawn struct {
		Amount int64 `avro:"amount"`
	}
	accountClosed   struct{}
	transferDebited struct {
		TransferID string `avro:"transfer_id"`
		To         string `avro:"to"`
		Amount     int64  `avro:"amount"`
	}
	transferCredited struct {
		TransferID string `avro:"transfer_id"`
		From       string `avro:"from"`
		Amount     int64  `avro:"amount"`
	}
	transferRefunded struct {
		TransferID string `avro:"transfer_id"`
		To         string `avro:"to"`
		Amount     int64  `avro:"amount"`
		Reason     string `avro:"reason"`
	}
	commandRejected struct {
		CommandType string `avro:"command_type"`
		Reason      string `avro:"reason"`
		Detail      string `avro:"detail"`
	}
	commandFailed struct {
		CommandType string `avro:"command_type"`
		Reason      string `avro:"reason"`
		Detail      string `avro:"detail"`
	}
)

func (deposited) MessageType() string       { return "Deposited" }
func (commandRejected) MessageType() string { return "onceflow.ledger.CommandRejected" } // the full name is accepted too
func (commandFailed) MessageType() string   { return "CommandFailed" }

type (
	snapshot struct {
		Version   int64       `avro:"version"`
		Processed []processed `avro:"processed"`
		State     account     `avro:"state"`
	}
	processed struct {
		CommandID pipeline.ID `avro:"command_id"`
		AtMS      int64       // at_ms
	}
	account struct {
		Open     bool   `avro:"open"`
		Closed   bool   `avro:"closed"`
		Currency string `avro:"currency"`
		Balance  int64  `avro:"balance"`
	}
)

const ns = "onceflow.ledger."

func commandTypes() map[string]any {
	return map[string]any{
		ns + "OpenAccount": openAccount{}, ns + "Deposit": deposit{}, ns + "Withdraw": withdraw{},
		ns + "CloseAccount": closeAccount{}, ns + "RequestTransfer": requestTransfer{},
		ns + "CreditTransfer": creditTransfer{}, ns + "RefundTransfer": refundTransfer{},
	}
}

func eventTypes() map[string]any {
	return map[string]any{
		ns + "AccountOpened": accountOpened{}, ns + "Deposited": deposited{}, ns + "Withdrawn": withdrawn{},
		ns + "AccountClosed": accountClosed{}, ns + "TransferDebited": transferDebited{},
		ns + "TransferCredited": transferCredited{}, ns + "TransferRefunded": transferRefunded{},
		ns + "CommandRejected": commandRejected{}, ns + "CommandFailed": commandFailed{},
	}
}

// commandRejectedV1 is CommandRejected before it had a detail.
type commandRejectedV1 struct {
	CommandType string `avro:"command_type"`
	Reason      string `avro:"reason"`
}

// eventTypesV1 are the Go types of testdata/events.v1.avsc.
func eventTypesV1() map[string]any {
	m := eventTypes()
	delete(m, ns+"TransferRefunded")
	delete(m, ns+"CommandFailed")
	m[ns+"CommandRejected"] = commandRejectedV1{}
	return m
}

func stateTypes() map[string]any { return map[string]any{"onceflow.Snapshot": snapshot{}} }

// ledgerSchema reads a schema of the ledger from the schemas package.
func ledgerSchema(t testing.TB, suffix string) string {
	t.Helper()
	bText, err := ledger.SchemaOf(suffix)
	b := []byte(bText)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func testdata(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func newSerde(t testing.TB, reg avro.Registry, subject, schema string, types map[string]any) *avro.Serde {
	t.Helper()
	s, err := avro.NewSerde(reg, subject, schema, types)
	if err != nil {
		t.Fatalf("NewSerde(%s): %v", subject, err)
	}
	return s
}

// ledgerSerdes are the serdes of the three ledger topics over one registry.
type ledgerSerdes struct {
	reg                     *avro.Embedded
	commands, events, state *avro.Serde
}

func newLedgerSerdes(t testing.TB) ledgerSerdes {
	t.Helper()
	reg := avro.NewEmbedded()
	return ledgerSerdes{
		reg:      reg,
		commands: newSerde(t, reg, avro.ValueSubject("ledger.commands"), ledgerSchema(t, ledger.Commands), commandTypes()),
		events:   newSerde(t, reg, avro.ValueSubject("ledger.events"), ledgerSchema(t, ledger.Events), eventTypes()),
		state:    newSerde(t, reg, avro.ValueSubject("ledger.state"), ledgerSchema(t, ledger.State), stateTypes()),
	}
}

// ledgerValues are one value of every shape each ledger topic carries.
func ledgerValues() (commands, events, states []any) {
	commands = []any{
		openAccount{Currency: "EUR"},
		deposit{Amount: 1_000_00},
		withdraw{Amount: 1},
		closeAccount{},
		requestTransfer{TransferID: "tr-1", To: "acc-2", Amount: 50},
		creditTransfer{TransferID: "tr-1", From: "acc-1", Amount: 50, Currency: "EUR"},
		refundTransfer{TransferID: "tr-1", To: "acc-2", Amount: 50, Reason: "account_closed"},
		deposit{Amount: -9_223_372_036_854_775_808},
	}
	events = []any{
		accountOpened{Currency: "USD"},
		deposited{Amount: 9_223_372_036_854_775_807},
		withdrawn{Amount: 0},
		accountClosed{},
		transferDebited{TransferID: "tr-2", To: "acc-9", Amount: 7},
		transferCredited{TransferID: "tr-2", From: "acc-1", Amount: 7},
		transferRefunded{TransferID: "tr-2", To: "acc-9", Amount: 7, Reason: "closed"},
		commandRejected{CommandType: "Withdraw", Reason: "insufficient_funds", Detail: "balance 3, amount 7"},
		commandRejected{CommandType: "Withdraw", Reason: "insufficient_funds"},
		accountOpened{Currency: "€ – ünïcödé"},
	}
	states = []any{
		snapshot{},
		snapshot{
			Version: 42,
			Processed: []processed{
				{CommandID: pipeline.MustParseID("01890a5d-ac96-774b-bcce-b302099a8057"), AtMS: 1_700_000_000_000},
				{CommandID: pipeline.NewCommandID(), AtMS: 1},
			},
			State: account{Open: true, Currency: "EUR", Balance: 12345},
		},
		snapshot{Version: 3, State: account{Open: true, Closed: true, Currency: "EUR"}},
	}
	return commands, events, states
}

func TestLedgerRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls := newLedgerSerdes(t)
	commands, events, states := ledgerValues()
	for _, tc := range []struct {
		topic  string
		serde  *avro.Serde
		values []any
	}{
		{"commands", ls.commands, commands},
		{"events", ls.events, events},
		{"state", ls.state, states},
	} {
		for _, v := range tc.values {
			b, err := tc.serde.Encode(ctx, v)
			if err != nil {
				t.Errorf("%s: Encode(%#v): %v", tc.topic, v, err)
				continue
			}
			got, err := tc.serde.Decode(ctx, b)
			if err != nil {
				t.Errorf("%s: Decode(Encode(%#v)): %v", tc.topic, v, err)
				continue
			}
			if !equalValues(got, v) {
				t.Errorf("%s: got %#v, want %#v", tc.topic, got, v)
			}
			// A pointer encodes as its value.
			pb, err := tc.serde.Encode(ctx, ptrTo(v))
			if err != nil || string(pb) != string(b) {
				t.Errorf("%s: Encode(&%#v): got (%x, %v), want %x", tc.topic, v, pb, err, b)
			}
		}
	}
	// Empty processed lists decode as empty slices.
	b, _ := ls.state.Encode(ctx, snapshot{})
	got, _ := ls.state.Decode(ctx, b)
	if p := got.(snapshot).Processed; len(p) != 0 {
		t.Errorf("empty snapshot: got processed %v, want none", p)
	}
}
