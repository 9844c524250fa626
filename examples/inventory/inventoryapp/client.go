package inventoryapp

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/onceflow/onceflow/examples/inventory"
	"github.com/onceflow/onceflow/pipeline/apiclient"
)

// Client is the inventory's routes over an apiclient.Client.
type Client struct{ *apiclient.Client }

// AddStock is POST /v1/items/{id}/stock.
func (c Client) AddStock(ctx context.Context, idemKey, itemID string, quantity int64) (apiclient.Accepted, *apiclient.Response, error) {
	return c.Post(ctx, "/v1/items/"+url.PathEscape(itemID)+"/stock", idemKey, map[string]int64{"quantity": quantity})
}

// PlaceOrder is POST /v1/orders.
func (c Client) PlaceOrder(ctx context.Context, idemKey, orderID, itemID string, quantity int64) (apiclient.Accepted, *apiclient.Response, error) {
	return c.Post(ctx, "/v1/orders", idemKey, map[string]any{"order_id": orderID, "item_id": itemID, "quantity": quantity})
}

// Item is GET /v1/items/{id}.
func (c Client) Item(ctx context.Context, itemID string) (Item, error) {
	var it Item
	err := c.Get(ctx, "/v1/items/"+url.PathEscape(itemID), &it)
	return it, err
}

// Order is GET /v1/orders/{id}.
func (c Client) Order(ctx context.Context, orderID string) (Order, error) {
	var o Order
	err := c.Get(ctx, "/v1/orders/"+url.PathEscape(orderID), &o)
	return o, err
}

// WaitOrder polls GET /v1/orders/{id} until the order is decided
// (confirmed with its reservation projected, or rejected) or ctx ends.
func (c Client) WaitOrder(ctx context.Context, orderID string) (Order, error) {
	for {
		o, err := c.Order(ctx, orderID)
		switch {
		case err == nil && o.Status == inventory.StatusRejected,
			err == nil && o.Status == inventory.StatusConfirmed && o.Reserved == o.Quantity:
			return o, nil
		case err != nil && !apiclient.IsStatus(err, http.StatusNotFound):
			return o, err
		}
		select {
		case <-ctx.Done():
			return o, fmt.Errorf("order %s not decided (last seen %+v): %w", orderID, o, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
