package inventoryapp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/onceflow/onceflow/examples/inventory"
	"github.com/onceflow/onceflow/pipeline/apiclient"
)

// RunDemo drives a short scripted workload against a running ingest
// (`inventory demo` against `inventory dev`): it adds 10 units of stock
// to an item (and retries the request with the same Idempotency-Key),
// places orders one after the other until one asks for more than is left
// (rejected: insufficient_stock), one for an item that has no stock
// (rejected: unknown_item), and places an order twice. It prints every
// order's outcome and the item's stock, and returns an error unless the
// read models show exactly the expected numbers.
func RunDemo(ctx context.Context, api *apiclient.Client, out io.Writer) error {
	c := Client{api}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	run := apiclient.NewKey()[:6] // this run's items, orders and keys: a second run makes new ones
	item, nothing := "widget-"+run, "gadget-"+run
	key := func(s string) string { return "demo-" + run + "-" + s }

	var problems []error
	var stock apiclient.Accepted
	for attempt := range 2 {
		acc, resp, err := c.AddStock(ctx, key("stock"), item, 10)
		if err != nil {
			return fmt.Errorf("add stock: %w", err)
		}
		if resp.Replayed() != (attempt == 1) {
			problems = append(problems, fmt.Errorf("add stock, attempt %d: replayed = %v", attempt+1, resp.Replayed()))
		}
		stock = acc
	}
	// The stock first: an order's reservation reaches the item from the
	// order's processor, and could overtake a stock command still in the
	// outbox.
	if _, err := c.WaitCommand(ctx, stock.CommandID); err != nil {
		return fmt.Errorf("add stock: %w", err)
	}
	fmt.Fprintf(out, "added 10 units to %s (the request sent twice with one Idempotency-Key: added once)\n\n", item)

	orders := []struct {
		id, item      string
		quantity      int64
		status, cause string
	}{
		{"o1-" + run, item, 3, inventory.StatusConfirmed, ""},
		{"o2-" + run, item, 5, inventory.StatusConfirmed, ""},
		{"o3-" + run, item, 4, inventory.StatusRejected, inventory.ReasonInsufficientStock},
		{"o4-" + run, item, 2, inventory.StatusConfirmed, ""},
		{"o5-" + run, nothing, 1, inventory.StatusRejected, inventory.ReasonUnknownItem},
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "order\titem\tquantity\tstatus\treason\treserved")
	for _, o := range orders {
		// One at a time: the orders race for the item's stock otherwise,
		// and which of them wins is the order the item decides them in.
		if _, _, err := c.PlaceOrder(ctx, key(o.id), o.id, o.item, o.quantity); err != nil {
			return fmt.Errorf("place %s: %w", o.id, err)
		}
		got, err := c.WaitOrder(ctx, o.id)
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\n", o.id, o.item, o.quantity, got.Status, got.Reason, got.Reserved)
		if got.Status != o.status || got.Reason != o.cause {
			problems = append(problems, fmt.Errorf("order %s: %s (%s), want %s (%s)", o.id, got.Status, got.Reason, o.status, o.cause))
		}
	}
	tw.Flush()

	// The same order again, under a new key: the order refuses it.
	acc, _, err := c.PlaceOrder(ctx, key("o1-again"), orders[0].id, item, 1)
	if err != nil {
		return fmt.Errorf("place %s again: %w", orders[0].id, err)
	}
	cmd, err := c.WaitCommand(ctx, acc.CommandID)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nplace %s again, new key: %s (%s)\n", orders[0].id, cmd.Status, cmd.Reason)
	if cmd.Status != "rejected" || cmd.Reason != inventory.ReasonOrderExists {
		problems = append(problems, fmt.Errorf("placing %s again: %s (%s), want rejected (%s)", orders[0].id, cmd.Status, cmd.Reason, inventory.ReasonOrderExists))
	}

	it, err := c.Item(ctx, item)
	if err != nil {
		return fmt.Errorf("read item %s: %w", item, err)
	}
	fmt.Fprintf(out, "\n%s: available %d (expected 0), reserved %d (expected 10)\n", item, it.Available, it.Reserved)
	if it.Available != 0 || it.Reserved != 10 {
		problems = append(problems, fmt.Errorf("item %s: available %d and reserved %d, want 0 and 10", item, it.Available, it.Reserved))
	}
	if err := errors.Join(problems...); err != nil {
		return fmt.Errorf("the demo found problems:\n%w", err)
	}
	fmt.Fprintln(out, "\nOK: every order was decided once, stock was reserved exactly for the confirmed orders, and none went negative.")
	return nil
}
