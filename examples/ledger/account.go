package ledger

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/onceflow/onceflow/pipeline"
)

// Account is the state of one account aggregate.
type Account struct {
	Open     bool   `avro:"open"`
	Closed   bool   `avro:"closed"`
	Currency string `avro:"currency"`
	Balance  int64  `avro:"balance"`
}

// MessageType names the state record, account.avsc.
func (Account) MessageType() string { return "Account" }

// Rejection reasons, as they appear in CommandRejected and command_status.
const (
	ReasonAlreadyOpen       = "account_already_open"
	ReasonUnknownAccount    = "unknown_account"
	ReasonAccountClosed     = "account_closed"
	ReasonInvalidAmount     = "invalid_amount"
	ReasonInvalidCurrency   = "invalid_currency"
	ReasonCurrencyMismatch  = "currency_mismatch"
	ReasonInsufficientFunds = "insufficient_funds"
	ReasonBalanceNotZero    = "balance_not_zero"
	ReasonBalanceOverflow   = "balance_overflow"
	ReasonInvalidTarget     = "invalid_target"
	ReasonWrongTenant       = "wrong_tenant"
)

// transferNamespace derives transfer follow-up command ids.
var transferNamespace = pipeline.MustParseID("6f6e6365-666c-5f77-8074-72616e736672")

// CreditCommandID is the id of the CreditTransfer that RequestTransfer
// command requestID, decided by the account source (its aggregate id,
// tenant included), sends for transferID. It includes the request's id so
// that a transfer id reused by a different request cannot make two debits
// share one credit (the target would absorb the second as a duplicate),
// and the source, because a command id is scoped to its aggregate: a
// producer that sends one request id to two accounts sends two requests,
// which debit twice and must credit twice.
func CreditCommandID(source string, requestID pipeline.ID, transferID string) pipeline.ID {
	name := make([]byte, 0, len("credit\x00")+len(source)+1+len(requestID)+len(transferID))
	name = append(append(append(append(append(name, "credit\x00"...), source...), 0), requestID[:]...), transferID...)
	return pipeline.NameID(transferNamespace, name)
}

// RefundCommandID is the id of the RefundTransfer sent when the credit
// command creditID is refused.
func RefundCommandID(creditID pipeline.ID) pipeline.ID {
	return pipeline.NameID(transferNamespace, append([]byte("refund\x00"), creditID[:]...))
}

// NewDecider returns the account aggregate as the processor runs it: one pure
// decide function per command type
// (docs/architecture.md#the-reference-domain-the-ledger), and Evolve.
func NewDecider() *pipeline.Aggregate[Account] {
	a := pipeline.NewAggregate(Evolve)
	pipeline.Handle(a, openAccount)
	pipeline.Handle(a, deposit)
	pipeline.Handle(a, withdraw)
	pipeline.Handle(a, closeAccount)
	pipeline.Handle(a, requestTransfer)
	pipeline.Handle(a, creditTransfer)
	pipeline.Handle(a, refundTransfer)
	return a
}

func openAccount(s Account, _ pipeline.Command, c OpenAccount) (pipeline.Decision, error) {
	if s.Open {
		return pipeline.Decision{}, pipeline.Reject(ReasonAlreadyOpen, "account is already open in %s", s.Currency)
	}
	if !ValidCurrency(c.Currency) {
		return pipeline.Decision{}, pipeline.Reject(ReasonInvalidCurrency, "currency %q is not a three-letter code", c.Currency)
	}
	return pipeline.Emit(AccountOpened{Currency: c.Currency}), nil
}

func deposit(s Account, _ pipeline.Command, c Deposit) (pipeline.Decision, error) {
	if err := s.canMove(c.Amount); err != nil {
		return pipeline.Decision{}, err
	}
	if s.Balance > math.MaxInt64-c.Amount {
		return pipeline.Decision{}, pipeline.Reject(ReasonBalanceOverflow, "balance %d + %d overflows", s.Balance, c.Amount)
	}
	return pipeline.Emit(Deposited{Amount: c.Amount}), nil
}

func withdraw(s Account, _ pipeline.Command, c Withdraw) (pipeline.Decision, error) {
	if err := s.canMove(c.Amount); err != nil {
		return pipeline.Decision{}, err
	}
	if s.Balance < c.Amount {
		return pipeline.Decision{}, pipeline.Reject(ReasonInsufficientFunds, "balance %d is less than %d", s.Balance, c.Amount)
	}
	return pipeline.Emit(Withdrawn{Amount: c.Amount}), nil
}

func closeAccount(s Account, _ pipeline.Command, _ CloseAccount) (pipeline.Decision, error) {
	if err := s.canMove(1); err != nil {
		return pipeline.Decision{}, err
	}
	if s.Balance != 0 {
		return pipeline.Decision{}, pipeline.Reject(ReasonBalanceNotZero, "balance is %d", s.Balance)
	}
	return pipeline.Emit(AccountClosed{}), nil
}

// requestTransfer debits the source and, in the same decision (so in the
// same Kafka transaction), sends the credit to the target.
func requestTransfer(s Account, cmd pipeline.Command, c RequestTransfer) (pipeline.Decision, error) {
	if err := s.canMove(c.Amount); err != nil {
		return pipeline.Decision{}, err
	}
	tenant, self, _ := pipeline.SplitAggregateID(cmd.AggregateID)
	if other, _, err := pipeline.SplitAggregateID(c.To); err == nil && other != tenant {
		// Money never crosses tenants; `to` is a local id of this tenant.
		return pipeline.Decision{}, pipeline.Reject(ReasonWrongTenant, "cannot transfer to %q: it belongs to another tenant", c.To)
	}
	if pipeline.ValidateLocalID(c.To) != nil || c.To == self {
		return pipeline.Decision{}, pipeline.Reject(ReasonInvalidTarget, "cannot transfer to %q", c.To)
	}
	if s.Balance < c.Amount {
		return pipeline.Decision{}, pipeline.Reject(ReasonInsufficientFunds, "balance %d is less than %d", s.Balance, c.Amount)
	}
	return pipeline.Decision{
		Events: []pipeline.Message{TransferDebited{TransferID: c.TransferID, To: c.To, Amount: c.Amount}},
		Commands: []pipeline.Effect{{
			AggregateID: pipeline.AggregateID(tenant, c.To),
			CommandID:   CreditCommandID(cmd.AggregateID, cmd.ID, c.TransferID),
			Payload:     CreditTransfer{TransferID: c.TransferID, From: self, Amount: c.Amount, Currency: s.Currency},
		}},
	}, nil
}

// creditTransfer credits the target; a target that cannot take the money
// rejects the credit and sends it back to the source.
func creditTransfer(s Account, cmd pipeline.Command, c CreditTransfer) (pipeline.Decision, error) {
	err := s.canMove(c.Amount)
	if err == nil && s.Currency != c.Currency {
		err = pipeline.Reject(ReasonCurrencyMismatch, "account is in %s, transfer in %s", s.Currency, c.Currency)
	}
	if err == nil && s.Balance > math.MaxInt64-c.Amount {
		err = pipeline.Reject(ReasonBalanceOverflow, "balance %d + %d overflows", s.Balance, c.Amount)
	}
	if err != nil {
		// The source was debited: send the money back.
		tenant, self, _ := pipeline.SplitAggregateID(cmd.AggregateID)
		r, _ := pipeline.AsRejection(err)
		return pipeline.Decision{Commands: []pipeline.Effect{{
			AggregateID: pipeline.AggregateID(tenant, c.From),
			CommandID:   RefundCommandID(cmd.ID),
			Payload:     RefundTransfer{TransferID: c.TransferID, To: self, Amount: c.Amount, Reason: r.Reason},
		}}}, err
	}
	return pipeline.Emit(TransferCredited{TransferID: c.TransferID, From: c.From, Amount: c.Amount}), nil
}

// refundTransfer returns money this account was debited for; it is
// accepted even if the account was closed since (closing needs a zero
// balance, which the in-flight debit allowed).
func refundTransfer(s Account, _ pipeline.Command, c RefundTransfer) (pipeline.Decision, error) {
	if !s.Open || c.Amount <= 0 {
		return pipeline.Decision{}, pipeline.Reject(ReasonInvalidAmount, "refund of %d to an account that was never debited", c.Amount)
	}
	return pipeline.Emit(TransferRefunded{TransferID: c.TransferID, To: c.To, Amount: c.Amount, Reason: c.Reason}), nil
}

// canMove checks what every balance-changing command needs.
func (s Account) canMove(amount int64) error {
	switch {
	case !s.Open:
		return pipeline.Reject(ReasonUnknownAccount, "account does not exist")
	case s.Closed:
		return pipeline.Reject(ReasonAccountClosed, "account is closed")
	case amount <= 0:
		return pipeline.Reject(ReasonInvalidAmount, "amount must be positive, got %d", amount)
	}
	return nil
}

// Evolve folds one account event into the state. CommandRejected (and any
// event it does not know) leaves the state as it is.
func Evolve(s Account, ev pipeline.Event) Account {
	switch e := ev.Payload.(type) {
	case AccountOpened:
		s.Open, s.Currency = true, e.Currency
	case Deposited:
		s.Balance += e.Amount
	case Withdrawn:
		s.Balance -= e.Amount
	case AccountClosed:
		s.Closed = true
	case TransferDebited:
		s.Balance -= e.Amount
	case TransferCredited:
		s.Balance += e.Amount
	case TransferRefunded:
		s.Balance += e.Amount
	}
	return s
}

// ValidCurrency reports whether c looks like an ISO 4217 code: three
// upper-case ASCII letters.
func ValidCurrency(c string) bool {
	if len(c) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if c[i] < 'A' || c[i] > 'Z' {
			return false
		}
	}
	return true
}

// Account reads and writes its own Avro binary form (processor.AvroState),
// the "state" field of the snapshot schema (account.avsc in
// pipeline.SnapshotSchema): the union branch index 0, then
// open, closed, currency and balance. The processor uses it for every
// snapshot written with the schema this binary registered, so a restore
// decodes a million accounts without reflection. TestSnapshotCodecMatchesSerde
// (pipeline/processor) checks it byte for byte against the schema-driven
// Serde; change both together.

// AppendAvro implements processor.AvroState.
func (a Account) AppendAvro(dst []byte) []byte {
	dst = append(dst, 0, avroBool(a.Open), avroBool(a.Closed)) // branch 0: Account
	dst = binary.AppendVarint(dst, int64(len(a.Currency)))
	dst = append(dst, a.Currency...)
	return binary.AppendVarint(dst, a.Balance)
}

// ReadAvro implements processor.AvroState.
func (a *Account) ReadAvro(src []byte) ([]byte, error) {
	if len(src) < 3 {
		return src, errAccountTruncated
	}
	if src[0] != 0 {
		return src, fmt.Errorf("%w: state union branch %d, want 0 (Account)", pipeline.ErrUndecodable, src[0])
	}
	var ok1, ok2 bool
	a.Open, ok1 = readBool(src[1])
	a.Closed, ok2 = readBool(src[2])
	if !ok1 || !ok2 {
		return src, fmt.Errorf("%w: account flags are not Avro booleans", pipeline.ErrUndecodable)
	}
	src = src[3:]
	n, k := binary.Varint(src)
	if k <= 0 || n < 0 || n > int64(len(src)-k) {
		return src, errAccountTruncated
	}
	src = src[k:]
	a.Currency = currency(src[:n])
	src = src[n:]
	if a.Balance, k = binary.Varint(src); k <= 0 {
		return src, errAccountTruncated
	}
	return src[k:], nil
}

var errAccountTruncated = fmt.Errorf("%w: account state truncated", pipeline.ErrUndecodable)

func avroBool(b bool) byte {
	if b {
		return 1
	}
	return 0
}

func readBool(b byte) (v, ok bool) { return b == 1, b <= 1 }

// commonCurrencies are shared strings for the currencies most accounts
// use, so decoding a state does not allocate one each time.
var commonCurrencies = map[string]string{"EUR": "EUR", "USD": "USD", "GBP": "GBP", "JPY": "JPY", "CHF": "CHF"}

func currency(b []byte) string {
	if s, ok := commonCurrencies[string(b)]; ok { // no allocation for the lookup
		return s
	}
	return string(b)
}
