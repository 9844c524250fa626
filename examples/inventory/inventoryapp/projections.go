package inventoryapp

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/examples/inventory"
	"github.com/onceflow/onceflow/pipeline"
)

// The inventory's projections apply one event at a time (pipeline.Projection):
// the simplest shape a read model has, enough for a domain whose rate is
// not the ledger's (ledgerapp's Accounts shows the batch shape). Each
// update is guarded by the aggregate version it follows; an update that
// matches no row is classified by pipeline.CheckVersion (a duplicate is
// skipped, a gap parks the partition). Their SQL names tables without a
// schema, so a rebuild can point them at shadow tables.

// Items projects the item aggregate's events onto inventory_items and
// inventory_reservations.
type Items struct{}

// Name implements pipeline.Projection.
func (Items) Name() string { return "inventory_items" }

// Tables names what a rebuild of Items rebuilds.
func (Items) Tables() []string { return []string{"inventory_items", "inventory_reservations"} }

const (
	insertItemSQL = `INSERT INTO inventory_items (tenant, item_id, available, reserved, version, updated_at)
		VALUES ($1, $2, $3, 0, 1, $4) ON CONFLICT (tenant, item_id) DO NOTHING`
	addStockSQL = `UPDATE inventory_items SET available = available + $3, version = $4, updated_at = $5
		WHERE tenant = $1 AND item_id = $2 AND version = $4 - 1`
	reserveSQL = `UPDATE inventory_items SET available = available - $3, reserved = reserved + $3, version = $4, updated_at = $5
		WHERE tenant = $1 AND item_id = $2 AND version = $4 - 1`
	insertReservationSQL = `INSERT INTO inventory_reservations (tenant, order_id, item_id, quantity, reserved_at)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (tenant, order_id, item_id) DO UPDATE SET quantity = inventory_reservations.quantity + EXCLUDED.quantity`
	itemVersionSQL = `SELECT version FROM inventory_items WHERE tenant = $1 AND item_id = $2`
)

// Apply implements pipeline.Projection.
func (Items) Apply(ctx context.Context, tx pgx.Tx, ev pipeline.Event) error {
	tenant, id, err := pipeline.SplitAggregateID(ev.AggregateID)
	if err != nil {
		return pipeline.Permanent(err)
	}
	var n int64
	switch e := ev.Payload.(type) {
	case inventory.StockAdded:
		if ev.Version == 1 {
			tag, err := tx.Exec(ctx, insertItemSQL, tenant, id, e.Quantity, ev.Time)
			if err != nil {
				return fmt.Errorf("insert item: %w", err)
			}
			n = tag.RowsAffected()
			break
		}
		tag, err := tx.Exec(ctx, addStockSQL, tenant, id, e.Quantity, ev.Version, ev.Time)
		if err != nil {
			return fmt.Errorf("add stock: %w", err)
		}
		n = tag.RowsAffected()
	case inventory.StockReserved:
		tag, err := tx.Exec(ctx, reserveSQL, tenant, id, e.Quantity, ev.Version, ev.Time)
		if err != nil {
			return fmt.Errorf("reserve stock: %w", err)
		}
		if n = tag.RowsAffected(); n == 1 {
			if _, err := tx.Exec(ctx, insertReservationSQL, tenant, e.OrderID, id, e.Quantity, ev.Time); err != nil {
				return fmt.Errorf("insert reservation: %w", err)
			}
		}
	default:
		return nil // an order's event, or a rejection or failure: no item changes
	}
	if n == 1 {
		return nil
	}
	return checkVersion(ctx, tx, itemVersionSQL, ev, tenant, id)
}

// Orders projects the order aggregate's events onto inventory_orders.
type Orders struct{}

// Name implements pipeline.Projection.
func (Orders) Name() string { return "inventory_orders" }

// Tables names what a rebuild of Orders rebuilds.
func (Orders) Tables() []string { return []string{"inventory_orders"} }

const (
	insertOrderSQL = `INSERT INTO inventory_orders (tenant, order_id, item_id, quantity, status, version, updated_at)
		VALUES ($1, $2, $3, $4, 'placed', $5, $6) ON CONFLICT (tenant, order_id) DO NOTHING`
	decideOrderSQL = `UPDATE inventory_orders SET status = $3, reason = $4, version = $5, updated_at = $6
		WHERE tenant = $1 AND order_id = $2 AND version = $5 - 1`
	orderVersionSQL = `SELECT version FROM inventory_orders WHERE tenant = $1 AND order_id = $2`
)

// Apply implements pipeline.Projection.
func (Orders) Apply(ctx context.Context, tx pgx.Tx, ev pipeline.Event) error {
	tenant, id, err := pipeline.SplitAggregateID(ev.AggregateID)
	if err != nil {
		return pipeline.Permanent(err)
	}
	var sql string
	var args []any
	switch e := ev.Payload.(type) {
	case inventory.OrderPlaced:
		sql, args = insertOrderSQL, []any{tenant, id, e.ItemID, e.Quantity, ev.Version, ev.Time}
		if ev.Version != 1 {
			// An order is placed by its first event: anything else means
			// the events before it are missing.
			return &pipeline.VersionGapError{AggregateID: ev.AggregateID, Stored: 0, Got: ev.Version}
		}
	case inventory.OrderConfirmed:
		sql, args = decideOrderSQL, []any{tenant, id, inventory.StatusConfirmed, "", ev.Version, ev.Time}
	case inventory.OrderRejected:
		sql, args = decideOrderSQL, []any{tenant, id, inventory.StatusRejected, e.Reason, ev.Version, ev.Time}
	default:
		return nil
	}
	tag, err := tx.Exec(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("write order: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	return checkVersion(ctx, tx, orderVersionSQL, ev, tenant, id)
}

// checkVersion classifies an event whose guarded write matched no row.
func checkVersion(ctx context.Context, tx pgx.Tx, sql string, ev pipeline.Event, tenant, id string) error {
	var stored int64
	err := tx.QueryRow(ctx, sql, tenant, id).Scan(&stored)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("read version: %w", err)
	}
	return pipeline.CheckVersion(ev.AggregateID, stored, ev.Version)
}
