package inventoryapp_test

import (
	"context"
	"testing"
	"time"

	"github.com/onceflow/onceflow/examples/inventory"
)

// A client reads how the order it placed ended (issue #43), across the
// two aggregate types: an order beyond the stock is placed (its own
// status, accepted), its reservation refused and the order rejected, so
// its outcome is compensated with the item's reason and the item's stock
// is untouched; an order within the stock is completed, reserved and
// confirmed.
func TestOrderOutcome(t *testing.T) {
	base, owner, _ := stack(t)
	acme := tenantClient(t, owner, base, "acme")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The stock first: the order's reservation reaches the item on its own
	// way (the processor's), which may overtake a command still in the
	// outbox.
	stocked, _, err := acme.AddStock(ctx, "s-1", "nut", 2)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := acme.WaitCommand(ctx, stocked.CommandID); err != nil || c.Status != "accepted" {
		t.Fatalf("the stock: %+v, %v", c, err)
	}
	big, _, err := acme.PlaceOrder(ctx, "p-big", "ord-big", "nut", 5)
	if err != nil {
		t.Fatal(err)
	}
	c, err := acme.WaitOutcome(ctx, big.CommandID)
	if err != nil {
		t.Fatal(err)
	}
	o := c.Outcome
	if c.Status != "accepted" || o.Status != "compensated" || o.Reason != inventory.ReasonInsufficientStock ||
		o.CommandType != "ReserveStock" || o.AggregateID != "acme/nut" {
		t.Errorf("order beyond the stock: status %s, outcome %+v; want accepted, compensated by the reservation's refusal (insufficient_stock)", c.Status, o)
	}
	if len(c.Derived) != 2 || c.Derived[0].CommandType != "ReserveStock" || c.Derived[0].Status != "rejected" ||
		c.Derived[1].CommandType != "RejectOrder" || c.Derived[1].Status != "accepted" || c.Derived[1].AggregateID != "acme/ord-big" {
		t.Errorf("order beyond the stock: derived %+v; want its reservation rejected, then its rejection accepted", c.Derived)
	}
	if it, err := acme.Item(ctx, "nut"); err != nil || it.Available != 2 || it.Reserved != 0 {
		t.Errorf("nut after the refused order: %+v, %v; want 2 available, none reserved", it, err)
	}

	ok, _, err := acme.PlaceOrder(ctx, "p-ok", "ord-ok", "nut", 2)
	if err != nil {
		t.Fatal(err)
	}
	if c, err = acme.WaitOutcome(ctx, ok.CommandID); err != nil || c.Outcome.Status != "completed" || len(c.Derived) != 2 ||
		c.Derived[0].CommandType != "ReserveStock" || c.Derived[0].Status != "accepted" ||
		c.Derived[1].CommandType != "ConfirmOrder" || c.Derived[1].Status != "accepted" {
		t.Errorf("order within the stock: %+v, %v; want completed, reserved and confirmed", c, err)
	}
}
