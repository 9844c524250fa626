package inventory_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/onceflow/onceflow/examples/inventory"
	"github.com/onceflow/onceflow/pipeline"
)

func command(aggregate string, id pipeline.ID, payload pipeline.Message) pipeline.Command {
	return pipeline.Command{ID: id, Tenant: "acme", AggregateID: aggregate, Time: time.UnixMilli(1_700_000_000_000), Payload: payload}
}

var placeID = pipeline.MustParseID("01890a5d-ac96-774b-bcce-b302099a8057")

// The saga in memory, the way the processors run it: each decision's
// events evolve its aggregate and its commands are decided by theirs (an
// item's by the item decider, an order's by the order decider), each
// command id once per aggregate (the dedup).
type world struct {
	t      *testing.T
	items  map[string]inventory.Item
	orders map[string]inventory.Order
	seen   map[string]bool // aggregate id + command id
	events map[string][]pipeline.Message
}

func newWorld(t *testing.T) *world {
	return &world{t: t, items: map[string]inventory.Item{}, orders: map[string]inventory.Order{}, seen: map[string]bool{}, events: map[string][]pipeline.Message{}}
}

func (w *world) send(aggregate string, id pipeline.ID, payload pipeline.Message) {
	w.t.Helper()
	if w.seen[aggregate+id.String()] {
		return
	}
	w.seen[aggregate+id.String()] = true
	cmd := command(aggregate, id, payload)
	var d pipeline.Decision
	var err error
	switch payload.(type) {
	case inventory.AddStock, inventory.ReserveStock:
		s := w.items[aggregate]
		d, err = inventory.NewItemDecider().Decide(s, cmd)
		if err == nil {
			for _, e := range d.Events {
				s = inventory.EvolveItem(s, pipeline.Event{Payload: e})
			}
			w.items[aggregate] = s
		}
	default:
		s := w.orders[aggregate]
		d, err = inventory.NewOrderDecider().Decide(s, cmd)
		if err == nil {
			for _, e := range d.Events {
				s = inventory.EvolveOrder(s, pipeline.Event{Payload: e})
			}
			w.orders[aggregate] = s
		}
	}
	if r, ok := pipeline.AsRejection(err); ok {
		d.Events = []pipeline.Message{pipeline.CommandRejected{CommandType: payload.MessageType(), Reason: r.Reason}}
	} else if err != nil {
		w.t.Fatalf("%s on %s: %v", payload.MessageType(), aggregate, err)
	}
	w.events[aggregate] = append(w.events[aggregate], d.Events...)
	for _, c := range d.Commands {
		w.send(c.AggregateID, c.CommandID, c.Payload)
		w.send(c.AggregateID, c.CommandID, c.Payload) // a repeat is absorbed
	}
}

// Orders for more than what is available are rejected with the item's
// reason, the others confirmed; stock is conserved and never negative;
// each order ends decided once.
func TestSaga(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.send("acme/widget", pipeline.NameID(placeID, []byte("stock")), inventory.AddStock{Quantity: 10})
	want := map[string]string{}
	for i, q := range []int64{3, 5, 4, 1, 1} {
		order := fmt.Sprintf("acme/o-%d", i)
		w.send(order, pipeline.NameID(placeID, []byte(order)), inventory.PlaceOrder{ItemID: "widget", Quantity: q})
		want[order] = map[bool]string{true: inventory.StatusConfirmed, false: inventory.StatusRejected}[i != 2]
	}
	w.send("acme/o-x", placeID, inventory.PlaceOrder{ItemID: "gadget", Quantity: 1})
	want["acme/o-x"] = inventory.StatusRejected
	// The same command id on another order is another command.
	w.send("acme/o-y", placeID, inventory.PlaceOrder{ItemID: "widget", Quantity: 1})
	want["acme/o-y"] = inventory.StatusRejected // 10 - 3 - 5 - 1 - 1 = 0 left

	if got := w.items["acme/widget"]; got != (inventory.Item{Known: true, Available: 0, Reserved: 10}) {
		t.Fatalf("widget: got %+v, want 0 available and 10 reserved", got)
	}
	for order, status := range want {
		o := w.orders[order]
		if o.Status != status {
			t.Errorf("%s: got %q, want %q", order, o.Status, status)
		}
		decided := 0
		for _, e := range w.events[order] {
			switch e.(type) {
			case inventory.OrderConfirmed, inventory.OrderRejected:
				decided++
			}
		}
		if decided != 1 {
			t.Errorf("%s decided %d times", order, decided)
		}
	}
	if r := w.orders["acme/o-2"].Reason; r != inventory.ReasonInsufficientStock {
		t.Errorf("o-2's reason %q, want %s", r, inventory.ReasonInsufficientStock)
	}
	if r := w.orders["acme/o-x"].Reason; r != inventory.ReasonUnknownItem {
		t.Errorf("o-x's reason %q, want %s", r, inventory.ReasonUnknownItem)
	}
}

func TestDecide(t *testing.T) {
	t.Parallel()
	item := inventory.Item{Known: true, Available: 5, Reserved: 1}
	placed := inventory.Order{Status: inventory.StatusPlaced, ItemID: "w", Quantity: 2}
	for _, tc := range []struct {
		name   string
		item   bool
		state  any
		cmd    pipeline.Message
		reject string
	}{
		{"add zero", true, item, inventory.AddStock{Quantity: 0}, inventory.ReasonInvalidQuantity},
		{"add overflow", true, inventory.Item{Known: true, Available: inventory.MaxStock}, inventory.AddStock{Quantity: 1}, inventory.ReasonStockOverflow},
		{"reserve unknown", true, inventory.Item{}, inventory.ReserveStock{OrderID: "o", Quantity: 1}, inventory.ReasonUnknownItem},
		{"reserve too much", true, item, inventory.ReserveStock{OrderID: "o", Quantity: 6}, inventory.ReasonInsufficientStock},
		{"reserve all", true, item, inventory.ReserveStock{OrderID: "o", Quantity: 5}, ""},
		{"place twice", false, placed, inventory.PlaceOrder{ItemID: "w", Quantity: 1}, inventory.ReasonOrderExists},
		{"place another tenant's", false, inventory.Order{}, inventory.PlaceOrder{ItemID: "x/w", Quantity: 1}, inventory.ReasonInvalidItem},
		{"confirm unplaced", false, inventory.Order{}, inventory.ConfirmOrder{ItemID: "w", Quantity: 2}, inventory.ReasonOrderNotPending},
		{"confirm other item", false, placed, inventory.ConfirmOrder{ItemID: "v", Quantity: 2}, inventory.ReasonReservationMismatch},
		{"confirm other quantity", false, placed, inventory.ConfirmOrder{ItemID: "w", Quantity: 3}, inventory.ReasonReservationMismatch},
		{"reject decided", false, inventory.Order{Status: inventory.StatusConfirmed, ItemID: "w"}, inventory.RejectOrder{ItemID: "w", Reason: "x"}, inventory.ReasonOrderNotPending},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.item {
				_, err = inventory.NewItemDecider().Decide(tc.state.(inventory.Item), command("acme/w", placeID, tc.cmd))
			} else {
				_, err = inventory.NewOrderDecider().Decide(tc.state.(inventory.Order), command("acme/o", placeID, tc.cmd))
			}
			r, _ := pipeline.AsRejection(err)
			switch {
			case tc.reject == "" && err != nil:
				t.Fatalf("got %v, want a decision", err)
			case tc.reject != "" && (r == nil || r.Reason != tc.reject):
				t.Fatalf("got %v, want rejection %s", err, tc.reject)
			}
		})
	}
}

// Each decider handles exactly its schema's command types.
func TestDecidersHandleTheirCommands(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		got  []string
		want []pipeline.Message
	}{
		{inventory.NewItemDecider().CommandTypes(), inventory.ItemCommands()},
		{inventory.NewOrderDecider().CommandTypes(), inventory.OrderCommands()},
	} {
		var want []string
		for _, m := range tc.want {
			want = append(want, m.MessageType())
		}
		slices.Sort(want)
		if !slices.Equal(tc.got, want) {
			t.Errorf("got %v, want %v", tc.got, want)
		}
	}
}
