// Package inventoryapp plugs the inventory (package inventory: its two
// aggregate types, their commands, events, states and deciders) into
// onceflow: the aggregate types with their schemas, the read models and
// their migrations, the HTTP routes and queries, and the demo. cmd/inventory
// runs it with cli.Main; it uses only onceflow's public API.
//
// Its topics (docs/architecture.md#topics-keys-and-headers): a domain of two aggregate
// types has the commands, state, dedup and DLQ topics of each,
// inventory.item.commands and inventory.order.commands and so on, and one
// inventory.events, which its projector (onceflow-projector-inventory)
// applies to inventory_items, inventory_reservations and inventory_orders.
package inventoryapp

import (
	"context"
	"embed"
	"errors"
	"io/fs"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/examples/inventory"
	"github.com/onceflow/onceflow/pipeline"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations are the inventory's read-model migrations, applied after
// onceflow's with their version in goose_db_version_inventory. (fs.Sub
// fails only on an invalid path, which "migrations" is not.)
var Migrations, _ = fs.Sub(migrationFiles, "migrations")

// Name is the domain's name: its topic prefix and its migrations' name.
const Name = "inventory"

// Domain returns the inventory domain without a carrier.
func Domain() *onceflow.Domain { return DomainWith(Carrier{}) }

// DomainWith returns the inventory domain booking each confirmed order's
// shipment with c (CarrierJob), when c has a URL.
func DomainWith(c Carrier) *onceflow.Domain {
	var kinds []onceflow.JobKind
	if c.URL != "" {
		kinds = append(kinds, CarrierJob(c))
	}
	return &onceflow.Domain{
		Name:        Name,
		Events:      onceflow.Schema{Avro: inventory.EventsSchema, Types: inventory.Events()},
		Aggregates:  []onceflow.AggregateType{ItemType(), OrderType()},
		Projections: []pipeline.Projection[pgx.Tx]{Items{}, Orders{}},
		Migrations:  Migrations,
		Routes:      Routes(),
		Queries:     Queries(),
		Demo:        RunDemo,
		Jobs:        kinds,
	}
}

// ItemType is the stock item aggregate type: topics inventory.item.*.
func ItemType() onceflow.Aggregate[inventory.Item] {
	return onceflow.Aggregate[inventory.Item]{
		Name:     "item",
		Decider:  inventory.NewItemDecider(),
		Commands: onceflow.Schema{Avro: inventory.ItemCommandsSchema, Types: inventory.ItemCommands()},
		State:    inventory.ItemSchema,
	}
}

// OrderType is the order aggregate type: topics inventory.order.*.
func OrderType() onceflow.Aggregate[inventory.Order] {
	return onceflow.Aggregate[inventory.Order]{
		Name:     "order",
		Decider:  inventory.NewOrderDecider(),
		Commands: onceflow.Schema{Avro: inventory.OrderCommandsSchema, Types: inventory.OrderCommands()},
		State:    inventory.OrderSchema,
	}
}

// Routes are the inventory's command routes; ReserveStock, ConfirmOrder and
// RejectOrder are the saga's and have none.
func Routes() []onceflow.Route {
	return []onceflow.Route{
		{Pattern: "POST /v1/items/{id}/stock", Command: inventory.AddStock{}, PathID: "id",
			Summary: "Add stock to an item", Description: "Adds `quantity` units to the item's available stock; the first addition creates the item."},
		{Pattern: "POST /v1/orders", Command: inventory.PlaceOrder{}, BodyID: "order_id",
			Summary: "Place an order", Description: "Places the order `order_id` for `quantity` units of `item_id`. The item then reserves the stock and the order is confirmed, or it is rejected with the item's reason (`insufficient_stock`, `unknown_item`): read it with GET /v1/orders/{id}."},
	}
}

// Item is the answer of GET /v1/items/{id}.
type Item struct {
	ItemID    string `json:"item_id"`
	Available int64  `json:"available"`
	Reserved  int64  `json:"reserved"`
	Version   int64  `json:"version" doc:"The item's aggregate version of the last event applied."`
}

// Order is the answer of GET /v1/orders/{id}: the order joined with the
// reservation its item made for it.
type Order struct {
	OrderID  string `json:"order_id"`
	ItemID   string `json:"item_id"`
	Quantity int64  `json:"quantity"`
	Status   string `json:"status" doc:"placed, then confirmed or rejected."`
	Reason   string `json:"reason" doc:"Why it was rejected: the item's reason."`
	Reserved int64  `json:"reserved" doc:"Units the item reserved for it, as the item's events have been projected so far."`
	Version  int64  `json:"version" doc:"The order's aggregate version of the last event applied."`
}

const (
	getItemSQL  = `SELECT available, reserved, version FROM inventory_items WHERE tenant = $1 AND item_id = $2`
	getOrderSQL = `SELECT o.item_id, o.quantity, o.status, o.reason, o.version, COALESCE(r.quantity, 0)
		FROM inventory_orders o
		LEFT JOIN inventory_reservations r ON r.tenant = o.tenant AND r.order_id = o.order_id AND r.item_id = o.item_id
		WHERE o.tenant = $1 AND o.order_id = $2`
)

// Queries are the inventory's read routes. Each runs in ingest's read-only
// transaction scoped to the caller's tenant, whose row-level security
// shows it only that tenant's rows; the queries still name the tenant.
func Queries() []onceflow.Query {
	return []onceflow.Query{
		{Pattern: "GET /v1/items/{id}", Response: Item{}, Summary: "An item's stock",
			Description: "Available and reserved units as the projector last saw them; another tenant's item is a 404.",
			Get: func(ctx context.Context, db onceflow.DB, tenant string, r *http.Request) (any, error) {
				it := Item{ItemID: r.PathValue("id")}
				if pipeline.ValidateLocalID(it.ItemID) != nil {
					return nil, onceflow.ErrNotFound
				}
				err := db.QueryRow(ctx, getItemSQL, tenant, it.ItemID).Scan(&it.Available, &it.Reserved, &it.Version)
				if errors.Is(err, pgx.ErrNoRows) {
					return nil, onceflow.ErrNotFound
				}
				return it, err
			}},
		{Pattern: "GET /v1/orders/{id}", Response: Order{}, Summary: "An order and its reservation",
			Description: "The order's status and the units its item reserved for it; another tenant's order is a 404.",
			Get: func(ctx context.Context, db onceflow.DB, tenant string, r *http.Request) (any, error) {
				o := Order{OrderID: r.PathValue("id")}
				if pipeline.ValidateLocalID(o.OrderID) != nil {
					return nil, onceflow.ErrNotFound
				}
				err := db.QueryRow(ctx, getOrderSQL, tenant, o.OrderID).Scan(&o.ItemID, &o.Quantity, &o.Status, &o.Reason, &o.Version, &o.Reserved)
				if errors.Is(err, pgx.ErrNoRows) {
					return nil, onceflow.ErrNotFound
				}
				return o, err
			}},
	}
}
