package ledger

import (
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

// MessageType names the state record in schemas/state.avsc.
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
	ReasonUnknownCommand    = "unknown_command"
)

// transferNamespace derives transfer follow-up command ids.
var transferNamespace = pipeline.MustParseID("6f6e6365-666c-5f77-8074-72616e736672")

// CreditCommandID is the id of the CreditTransfer that RequestTransfer
// command requestID sends for transferID. It includes the request's id so
// that a transfer id reused by a different request cannot make two debits
// share one credit (the target would absorb the second as a duplicate).
func CreditCommandID(requestID pipeline.ID, transferID string) pipeline.ID {
	return pipeline.NameID(transferNamespace, append(append([]byte("credit\x00"), requestID[:]...), transferID...))
}

// RefundCommandID is the id of the RefundTransfer sent when the credit
// command creditID is refused.
func RefundCommandID(creditID pipeline.ID) pipeline.ID {
	return pipeline.NameID(transferNamespace, append([]byte("refund\x00"), creditID[:]...))
}

// Decider is the account aggregate's decide/evolve.
type Decider struct{}

var _ pipeline.Decider[Account] = Decider{}

// Decide implements pipeline.Decider.
func (Decider) Decide(s Account, cmd pipeline.Command) (pipeline.Decision, error) {
	switch c := cmd.Payload.(type) {
	case OpenAccount:
		if s.Open {
			return pipeline.Decision{}, pipeline.Reject(ReasonAlreadyOpen, "account is already open in %s", s.Currency)
		}
		if !ValidCurrency(c.Currency) {
			return pipeline.Decision{}, pipeline.Reject(ReasonInvalidCurrency, "currency %q is not a three-letter code", c.Currency)
		}
		return pipeline.Emit(AccountOpened{Currency: c.Currency}), nil

	case Deposit:
		if err := s.canMove(c.Amount); err != nil {
			return pipeline.Decision{}, err
		}
		if s.Balance > math.MaxInt64-c.Amount {
			return pipeline.Decision{}, pipeline.Reject(ReasonBalanceOverflow, "balance %d + %d overflows", s.Balance, c.Amount)
		}
		return pipeline.Emit(Deposited{Amount: c.Amount}), nil

	case Withdraw:
		if err := s.canMove(c.Amount); err != nil {
			return pipeline.Decision{}, err
		}
		if s.Balance < c.Amount {
			return pipeline.Decision{}, pipeline.Reject(ReasonInsufficientFunds, "balance %d is less than %d", s.Balance, c.Amount)
		}
		return pipeline.Emit(Withdrawn{Amount: c.Amount}), nil

	case CloseAccount:
		if err := s.canMove(1); err != nil {
			return pipeline.Decision{}, err
		}
		if s.Balance != 0 {
			return pipeline.Decision{}, pipeline.Reject(ReasonBalanceNotZero, "balance is %d", s.Balance)
		}
		return pipeline.Emit(AccountClosed{}), nil

	case RequestTransfer:
		if err := s.canMove(c.Amount); err != nil {
			return pipeline.Decision{}, err
		}
		tenant, self, _ := pipeline.SplitAggregateID(cmd.AggregateID)
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
				CommandID:   CreditCommandID(cmd.ID, c.TransferID),
				Payload:     CreditTransfer{TransferID: c.TransferID, From: self, Amount: c.Amount, Currency: s.Currency},
			}},
		}, nil

	case CreditTransfer:
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

	case RefundTransfer:
		// A refund returns money this account was debited for; it is
		// accepted even if the account was closed since (closing needs a
		// zero balance, which the in-flight debit allowed).
		if !s.Open || c.Amount <= 0 {
			return pipeline.Decision{}, pipeline.Reject(ReasonInvalidAmount, "refund of %d to an account that was never debited", c.Amount)
		}
		return pipeline.Emit(TransferRefunded{TransferID: c.TransferID, To: c.To, Amount: c.Amount, Reason: c.Reason}), nil
	}
	return pipeline.Decision{}, pipeline.Reject(ReasonUnknownCommand, "account does not handle %T", cmd.Payload)
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

// Evolve implements pipeline.Decider.
func (Decider) Evolve(s Account, ev pipeline.Event) Account {
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
