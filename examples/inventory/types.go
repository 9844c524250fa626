package inventory

import "github.com/onceflow/onceflow/pipeline"

// Namespace is the Avro namespace of the inventory's records.
const Namespace = "onceflow.inventory"

// Item commands (item_commands.avsc).
type (
	// AddStock adds quantity to an item's available stock; the first one
	// creates the item.
	AddStock struct {
		Quantity int64 `avro:"quantity" json:"quantity" doc:"Units, above zero."`
	}
	// ReserveStock moves quantity from available to reserved for an
	// order; the order's PlaceOrder sends it.
	ReserveStock struct {
		OrderID  string `avro:"order_id" json:"order_id"`
		Quantity int64  `avro:"quantity" json:"quantity"`
	}
)

// Order commands (order_commands.avsc).
type (
	// PlaceOrder places an order for quantity units of item item_id.
	PlaceOrder struct {
		ItemID   string `avro:"item_id" json:"item_id" doc:"The item's id, in the same tenant."`
		Quantity int64  `avro:"quantity" json:"quantity" doc:"Units, above zero."`
	}
	// ConfirmOrder tells an order its stock is reserved; the item's
	// ReserveStock sends it.
	ConfirmOrder struct {
		ItemID   string `avro:"item_id" json:"item_id"`
		Quantity int64  `avro:"quantity" json:"quantity"`
	}
	// RejectOrder tells an order its stock could not be reserved, and why.
	RejectOrder struct {
		ItemID string `avro:"item_id" json:"item_id"`
		Reason string `avro:"reason" json:"reason"`
	}
)

func (AddStock) MessageType() string     { return "AddStock" }
func (ReserveStock) MessageType() string { return "ReserveStock" }
func (PlaceOrder) MessageType() string   { return "PlaceOrder" }
func (ConfirmOrder) MessageType() string { return "ConfirmOrder" }
func (RejectOrder) MessageType() string  { return "RejectOrder" }

// Events (events.avsc): both aggregate types' events, on the domain's one
// events topic.
type (
	StockAdded struct {
		Quantity int64 `avro:"quantity"`
	}
	StockReserved struct {
		OrderID  string `avro:"order_id"`
		Quantity int64  `avro:"quantity"`
	}
	OrderPlaced struct {
		ItemID   string `avro:"item_id"`
		Quantity int64  `avro:"quantity"`
	}
	OrderConfirmed struct {
		ItemID   string `avro:"item_id"`
		Quantity int64  `avro:"quantity"`
	}
	OrderRejected struct {
		ItemID string `avro:"item_id"`
		Reason string `avro:"reason"`
	}
)

func (StockAdded) MessageType() string     { return "StockAdded" }
func (StockReserved) MessageType() string  { return "StockReserved" }
func (OrderPlaced) MessageType() string    { return "OrderPlaced" }
func (OrderConfirmed) MessageType() string { return "OrderConfirmed" }
func (OrderRejected) MessageType() string  { return "OrderRejected" }

// ItemCommands are the item's command types, for its commands schema.
func ItemCommands() []pipeline.Message { return []pipeline.Message{AddStock{}, ReserveStock{}} }

// OrderCommands are the order's command types.
func OrderCommands() []pipeline.Message {
	return []pipeline.Message{PlaceOrder{}, ConfirmOrder{}, RejectOrder{}}
}

// Events are the domain's event types (CommandRejected and CommandFailed,
// which events.avsc declares too, are the pipeline's).
func Events() []pipeline.Message {
	return []pipeline.Message{StockAdded{}, StockReserved{}, OrderPlaced{}, OrderConfirmed{}, OrderRejected{}}
}

// Validate implements pipeline.Validator: the rules ingest applies to an
// HTTP request, so a command produced straight to Kafka that breaks them
// goes to the DLQ rather than being decided.
func (c AddStock) Validate() error { return check(quantityField(c.Quantity)) }

// Validate implements pipeline.Validator.
func (c ReserveStock) Validate() error {
	return check(idField("order_id", c.OrderID), quantityField(c.Quantity))
}

// Validate implements pipeline.Validator.
func (c PlaceOrder) Validate() error {
	return check(idField("item_id", c.ItemID), quantityField(c.Quantity))
}

// Validate implements pipeline.Validator.
func (c ConfirmOrder) Validate() error {
	return check(idField("item_id", c.ItemID), quantityField(c.Quantity))
}

// Validate implements pipeline.Validator.
func (c RejectOrder) Validate() error { return check(idField("item_id", c.ItemID)) }

// MaxQuantity bounds every quantity, so sums of them never overflow.
const MaxQuantity = 1 << 40

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

func quantityField(v int64) *pipeline.FieldError {
	if v <= 0 || v > MaxQuantity {
		return &pipeline.FieldError{Field: "quantity", Message: "must be between 1 and 2^40"}
	}
	return nil
}
