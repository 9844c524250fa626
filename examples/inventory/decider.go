package inventory

import (
	"github.com/onceflow/onceflow/pipeline"
)

// Item is the state of one stock item aggregate.
type Item struct {
	Known     bool  `avro:"known"` // stock was added to it once
	Available int64 `avro:"available"`
	Reserved  int64 `avro:"reserved"`
}

// MessageType names the state record, item.avsc.
func (Item) MessageType() string { return "Item" }

// Order statuses.
const (
	StatusPlaced    = "placed"
	StatusConfirmed = "confirmed"
	StatusRejected  = "rejected"
)

// Order is the state of one order aggregate; Status is "" until it is
// placed.
type Order struct {
	Status   string `avro:"status"`
	ItemID   string `avro:"item_id"`
	Quantity int64  `avro:"quantity"`
	Reason   string `avro:"reason"` // why it was rejected
}

// MessageType names the state record, order.avsc.
func (Order) MessageType() string { return "Order" }

// Rejection reasons, as they appear in CommandRejected, command_status and
// a rejected order's reason.
const (
	ReasonUnknownItem         = "unknown_item"
	ReasonInsufficientStock   = "insufficient_stock"
	ReasonInvalidQuantity     = "invalid_quantity"
	ReasonStockOverflow       = "stock_overflow"
	ReasonInvalidItem         = "invalid_item"
	ReasonOrderExists         = "order_exists"
	ReasonOrderNotPending     = "order_not_pending"
	ReasonReservationMismatch = "reservation_mismatch"
)

// sagaNamespace derives the saga's command ids.
var sagaNamespace = pipeline.MustParseID("6f6e6365-666c-5f77-8069-6e76656e746f")

// ReserveCommandID is the id of the ReserveStock that PlaceOrder command
// placeID on order orderID (an aggregate id) sends. It includes the order,
// so that a command id a producer reused on two orders does not make their
// reservations one (the item would absorb the second as a duplicate).
func ReserveCommandID(placeID pipeline.ID, orderID string) pipeline.ID {
	return pipeline.NameID(sagaNamespace, append(append([]byte("reserve\x00"), placeID[:]...), orderID...))
}

// ConfirmCommandID is the id of the ConfirmOrder that ReserveStock command
// reserveID on item itemID (an aggregate id) sends when it reserves.
func ConfirmCommandID(reserveID pipeline.ID, itemID string) pipeline.ID {
	return pipeline.NameID(sagaNamespace, append(append([]byte("confirm\x00"), reserveID[:]...), itemID...))
}

// RejectCommandID is the id of the RejectOrder that ReserveStock command
// reserveID on item itemID sends when it cannot reserve.
func RejectCommandID(reserveID pipeline.ID, itemID string) pipeline.ID {
	return pipeline.NameID(sagaNamespace, append(append([]byte("reject\x00"), reserveID[:]...), itemID...))
}

// NewItemDecider returns the item aggregate: AddStock and ReserveStock.
func NewItemDecider() *pipeline.Aggregate[Item] {
	a := pipeline.NewAggregate(EvolveItem)
	pipeline.Handle(a, addStock)
	pipeline.Handle(a, reserveStock)
	return a
}

// NewOrderDecider returns the order aggregate: PlaceOrder, ConfirmOrder
// and RejectOrder.
func NewOrderDecider() *pipeline.Aggregate[Order] {
	a := pipeline.NewAggregate(EvolveOrder)
	pipeline.Handle(a, placeOrder)
	pipeline.Handle(a, confirmOrder)
	pipeline.Handle(a, rejectOrder)
	return a
}

func addStock(s Item, _ pipeline.Command, c AddStock) (pipeline.Decision, error) {
	if c.Quantity <= 0 || c.Quantity > MaxQuantity {
		return pipeline.Decision{}, pipeline.Reject(ReasonInvalidQuantity, "quantity must be between 1 and 2^40, got %d", c.Quantity)
	}
	if s.Available+s.Reserved > MaxStock-c.Quantity {
		return pipeline.Decision{}, pipeline.Reject(ReasonStockOverflow, "stock %d + %d is over 2^50", s.Available+s.Reserved, c.Quantity)
	}
	return pipeline.Emit(StockAdded{Quantity: c.Quantity}), nil
}

// MaxStock bounds an item's stock, available and reserved together.
const MaxStock = 1 << 50

// reserveStock reserves an order's quantity and confirms the order, or
// refuses and tells the order why, in the same decision (so in the same
// Kafka transaction as the reservation or the rejection).
func reserveStock(s Item, cmd pipeline.Command, c ReserveStock) (pipeline.Decision, error) {
	tenant, self, _ := pipeline.SplitAggregateID(cmd.AggregateID)
	order := pipeline.AggregateID(tenant, c.OrderID)
	var err error
	switch {
	case !s.Known:
		err = pipeline.Reject(ReasonUnknownItem, "item %q has never had stock", self)
	case c.Quantity <= 0 || c.Quantity > MaxQuantity:
		err = pipeline.Reject(ReasonInvalidQuantity, "quantity must be between 1 and 2^40, got %d", c.Quantity)
	case c.Quantity > s.Available:
		err = pipeline.Reject(ReasonInsufficientStock, "%d available, %d asked", s.Available, c.Quantity)
	}
	if err != nil {
		r, _ := pipeline.AsRejection(err)
		return pipeline.Decision{Commands: []pipeline.Effect{{
			AggregateID: order,
			CommandID:   RejectCommandID(cmd.ID, cmd.AggregateID),
			Payload:     RejectOrder{ItemID: self, Reason: r.Reason},
		}}}, err
	}
	return pipeline.Decision{
		Events: []pipeline.Message{StockReserved{OrderID: c.OrderID, Quantity: c.Quantity}},
		Commands: []pipeline.Effect{{
			AggregateID: order,
			CommandID:   ConfirmCommandID(cmd.ID, cmd.AggregateID),
			Payload:     ConfirmOrder{ItemID: self, Quantity: c.Quantity},
		}},
	}, nil
}

// placeOrder records the order and asks its item for the stock.
func placeOrder(s Order, cmd pipeline.Command, c PlaceOrder) (pipeline.Decision, error) {
	if s.Status != "" {
		return pipeline.Decision{}, pipeline.Reject(ReasonOrderExists, "order is already %s", s.Status)
	}
	tenant, self, _ := pipeline.SplitAggregateID(cmd.AggregateID)
	if pipeline.ValidateLocalID(c.ItemID) != nil {
		// Stock never crosses tenants: item_id is a local id of this one.
		return pipeline.Decision{}, pipeline.Reject(ReasonInvalidItem, "item %q is not an item id of this tenant", c.ItemID)
	}
	if c.Quantity <= 0 || c.Quantity > MaxQuantity {
		return pipeline.Decision{}, pipeline.Reject(ReasonInvalidQuantity, "quantity must be between 1 and 2^40, got %d", c.Quantity)
	}
	return pipeline.Decision{
		Events: []pipeline.Message{OrderPlaced{ItemID: c.ItemID, Quantity: c.Quantity}},
		Commands: []pipeline.Effect{{
			AggregateID: pipeline.AggregateID(tenant, c.ItemID),
			CommandID:   ReserveCommandID(cmd.ID, cmd.AggregateID),
			Payload:     ReserveStock{OrderID: self, Quantity: c.Quantity},
		}},
	}, nil
}

func confirmOrder(s Order, _ pipeline.Command, c ConfirmOrder) (pipeline.Decision, error) {
	if err := s.pending(c.ItemID); err != nil {
		return pipeline.Decision{}, err
	}
	if c.Quantity != s.Quantity {
		return pipeline.Decision{}, pipeline.Reject(ReasonReservationMismatch, "reserved %d, ordered %d", c.Quantity, s.Quantity)
	}
	return pipeline.Emit(OrderConfirmed{ItemID: c.ItemID, Quantity: c.Quantity}), nil
}

func rejectOrder(s Order, _ pipeline.Command, c RejectOrder) (pipeline.Decision, error) {
	if err := s.pending(c.ItemID); err != nil {
		return pipeline.Decision{}, err
	}
	return pipeline.Emit(OrderRejected{ItemID: c.ItemID, Reason: c.Reason}), nil
}

// pending checks that the order waits for item's answer.
func (s Order) pending(item string) error {
	if s.Status != StatusPlaced {
		return pipeline.Reject(ReasonOrderNotPending, "order is %q, not placed", s.Status)
	}
	if item != s.ItemID {
		return pipeline.Reject(ReasonReservationMismatch, "answer from item %q, ordered %q", item, s.ItemID)
	}
	return nil
}

// EvolveItem folds one item event into the state; any other event
// (CommandRejected, CommandFailed) leaves it as it is.
func EvolveItem(s Item, ev pipeline.Event) Item {
	switch e := ev.Payload.(type) {
	case StockAdded:
		s.Known = true
		s.Available += e.Quantity
	case StockReserved:
		s.Available -= e.Quantity
		s.Reserved += e.Quantity
	}
	return s
}

// EvolveOrder folds one order event into the state.
func EvolveOrder(s Order, ev pipeline.Event) Order {
	switch e := ev.Payload.(type) {
	case OrderPlaced:
		s.Status, s.ItemID, s.Quantity = StatusPlaced, e.ItemID, e.Quantity
	case OrderConfirmed:
		s.Status = StatusConfirmed
	case OrderRejected:
		s.Status, s.Reason = StatusRejected, e.Reason
	}
	return s
}
