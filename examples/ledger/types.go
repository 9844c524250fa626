package ledger

import "github.com/onceflow/onceflow/pipeline"

// Commands (commands.avsc). The json tags name the fields as
// `onceflow produce` reads them, the same as the Avro fields.
type (
	OpenAccount struct {
		Currency string `avro:"currency" json:"currency" pattern:"^[A-Z]{3}$" doc:"ISO 4217 code."`
	}
	Deposit struct {
		Amount int64 `avro:"amount" json:"amount" doc:"Minor units (cents), above zero. Any JSON spelling of a whole number is accepted (100, 1e2, 100.0)."`
	}
	Withdraw struct {
		Amount int64 `avro:"amount" json:"amount" doc:"Minor units (cents), above zero."`
	}
	CloseAccount    struct{}
	RequestTransfer struct {
		TransferID string `avro:"transfer_id" json:"transfer_id"`
		To         string `avro:"to" json:"to"` // local account id in the same tenant
		Amount     int64  `avro:"amount" json:"amount"`
	}
	CreditTransfer struct {
		TransferID string `avro:"transfer_id" json:"transfer_id"`
		From       string `avro:"from" json:"from"`
		Amount     int64  `avro:"amount" json:"amount"`
		Currency   string `avro:"currency" json:"currency"`
	}
	RefundTransfer struct {
		TransferID string `avro:"transfer_id" json:"transfer_id"`
		To         string `avro:"to" json:"to"` // the target that refused
		Amount     int64  `avro:"amount" json:"amount"`
		Reason     string `avro:"reason" json:"reason"`
	}
)

func (OpenAccount) MessageType() string     { return "OpenAccount" }
func (Deposit) MessageType() string         { return "Deposit" }
func (Withdraw) MessageType() string        { return "Withdraw" }
func (CloseAccount) MessageType() string    { return "CloseAccount" }
func (RequestTransfer) MessageType() string { return "RequestTransfer" }
func (CreditTransfer) MessageType() string  { return "CreditTransfer" }
func (RefundTransfer) MessageType() string  { return "RefundTransfer" }

// Events (events.avsc).
type (
	AccountOpened struct {
		Currency string `avro:"currency"`
	}
	Deposited struct {
		Amount int64 `avro:"amount"`
	}
	Withdrawn struct {
		Amount int64 `avro:"amount"`
	}
	AccountClosed   struct{}
	TransferDebited struct {
		TransferID string `avro:"transfer_id"`
		To         string `avro:"to"`
		Amount     int64  `avro:"amount"`
	}
	TransferCredited struct {
		TransferID string `avro:"transfer_id"`
		From       string `avro:"from"`
		Amount     int64  `avro:"amount"`
	}
	TransferRefunded struct {
		TransferID string `avro:"transfer_id"`
		To         string `avro:"to"`
		Amount     int64  `avro:"amount"`
		Reason     string `avro:"reason"`
	}
)

func (AccountOpened) MessageType() string    { return "AccountOpened" }
func (Deposited) MessageType() string        { return "Deposited" }
func (Withdrawn) MessageType() string        { return "Withdrawn" }
func (AccountClosed) MessageType() string    { return "AccountClosed" }
func (TransferDebited) MessageType() string  { return "TransferDebited" }
func (TransferCredited) MessageType() string { return "TransferCredited" }
func (TransferRefunded) MessageType() string { return "TransferRefunded" }

// Namespace is the Avro namespace of the ledger's records.
const Namespace = "onceflow.ledger"

// CommandTypes maps each command record's Avro full name to its Go type,
// for the commands topic's serde.
func CommandTypes() map[string]any {
	return map[string]any{
		Namespace + ".OpenAccount":     OpenAccount{},
		Namespace + ".Deposit":         Deposit{},
		Namespace + ".Withdraw":        Withdraw{},
		Namespace + ".CloseAccount":    CloseAccount{},
		Namespace + ".RequestTransfer": RequestTransfer{},
		Namespace + ".CreditTransfer":  CreditTransfer{},
		Namespace + ".RefundTransfer":  RefundTransfer{},
	}
}

// EventTypes maps each event record's Avro full name to its Go type.
func EventTypes() map[string]any {
	return map[string]any{
		Namespace + ".AccountOpened":    AccountOpened{},
		Namespace + ".Deposited":        Deposited{},
		Namespace + ".Withdrawn":        Withdrawn{},
		Namespace + ".AccountClosed":    AccountClosed{},
		Namespace + ".TransferDebited":  TransferDebited{},
		Namespace + ".TransferCredited": TransferCredited{},
		Namespace + ".TransferRefunded": TransferRefunded{},
		Namespace + ".CommandRejected":  pipeline.CommandRejected{},
		Namespace + ".CommandFailed":    pipeline.CommandFailed{},
	}
}

// Validate implements pipeline.Validator: the rules ingest applies to the
// same fields of an HTTP request, so a command produced straight to Kafka
// that breaks them goes to the DLQ rather than being decided.
func (c OpenAccount) Validate() error {
	return check(currencyField("currency", c.Currency))
}

// Validate implements pipeline.Validator.
func (c Deposit) Validate() error { return check(amountField("amount", c.Amount)) }

// Validate implements pipeline.Validator.
func (c Withdraw) Validate() error { return check(amountField("amount", c.Amount)) }

// Validate implements pipeline.Validator.
func (c RequestTransfer) Validate() error {
	return check(idField("transfer_id", c.TransferID), idField("to", c.To), amountField("amount", c.Amount))
}

// Validate implements pipeline.Validator.
func (c CreditTransfer) Validate() error {
	return check(idField("transfer_id", c.TransferID), idField("from", c.From), amountField("amount", c.Amount),
		currencyField("currency", c.Currency))
}

// Validate implements pipeline.Validator.
func (c RefundTransfer) Validate() error {
	return check(idField("transfer_id", c.TransferID), idField("to", c.To), amountField("amount", c.Amount))
}

func check(errs ...*pipeline.FieldError) error {
	var out pipeline.InvalidFields
	for _, e := range errs {
		if e != nil {
			out = append(out, *e)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func idField(name, v string) *pipeline.FieldError {
	if err := pipeline.ValidateLocalID(v); err != nil {
		return &pipeline.FieldError{Field: name, Message: err.Error()}
	}
	return nil
}

func amountField(name string, v int64) *pipeline.FieldError {
	if v <= 0 {
		return &pipeline.FieldError{Field: name, Message: "must be greater than zero"}
	}
	return nil
}

func currencyField(name, v string) *pipeline.FieldError {
	if !ValidCurrency(v) {
		return &pipeline.FieldError{Field: name, Message: "must be a three-letter ISO 4217 code in upper case"}
	}
	return nil
}

// CommandTypeOf names the command an accepted event answers, for the
// ledger's events written before the processor recorded it in each event
// (onceflow.Domain.CommandTypeOf).
func CommandTypeOf(m pipeline.Message) string {
	switch m.(type) {
	case AccountOpened:
		return OpenAccount{}.MessageType()
	case Deposited:
		return Deposit{}.MessageType()
	case Withdrawn:
		return Withdraw{}.MessageType()
	case AccountClosed:
		return CloseAccount{}.MessageType()
	case TransferDebited:
		return RequestTransfer{}.MessageType()
	case TransferCredited:
		return CreditTransfer{}.MessageType()
	case TransferRefunded:
		return RefundTransfer{}.MessageType()
	}
	return m.MessageType()
}
