-- The inventory's read models (examples/inventory/inventoryapp): items,
-- the reservations the items made, and orders. version is the aggregate
-- version of the last event applied to a row; updates are guarded by it.
-- Stock is never negative (the item decider refuses what would make it
-- so): the CHECKs make a read model that disagrees park its partition
-- instead of showing it.

-- +goose Up
CREATE TABLE inventory_items (
    tenant     text        NOT NULL,
    item_id    text        NOT NULL,
    available  bigint      NOT NULL CHECK (available >= 0),
    reserved   bigint      NOT NULL CHECK (reserved >= 0),
    version    bigint      NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (tenant, item_id)
);

-- One row per order an item reserved stock for, written with the item's
-- StockReserved event (the item aggregate's version guard covers it).
CREATE TABLE inventory_reservations (
    tenant      text        NOT NULL,
    order_id    text        NOT NULL,
    item_id     text        NOT NULL,
    quantity    bigint      NOT NULL CHECK (quantity > 0),
    reserved_at timestamptz NOT NULL,
    PRIMARY KEY (tenant, order_id, item_id)
);

CREATE TABLE inventory_orders (
    tenant     text        NOT NULL,
    order_id   text        NOT NULL,
    item_id    text        NOT NULL,
    quantity   bigint      NOT NULL,
    status     text        NOT NULL CHECK (status IN ('placed', 'confirmed', 'rejected')),
    reason     text        NOT NULL DEFAULT '',
    version    bigint      NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (tenant, order_id)
);

-- +goose Down
DROP TABLE inventory_orders;
DROP TABLE inventory_reservations;
DROP TABLE inventory_items;
