package ledger

import "github.com/onceflow/onceflow/pipeline"

// Commands (schemas/commands.avsc). The json tags name the fields as
// `onceflow produce` reads them, the same as the Avro fields.
type (
	OpenAccount struct {
		Currency string `avro:"currency" json:"currency"`
	}
	Deposit struct {
		Amount int64 `avro:"amount" json:"amount"`
	}
	Withdraw struct {
		Amount int64 `avro:"amount" json:"amount"`
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

// Events (schemas/events.avsc).
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
