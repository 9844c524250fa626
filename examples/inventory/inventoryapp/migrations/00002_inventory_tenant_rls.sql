-- The inventory's tables opt in to the tenant policy
-- (docs/security.md#row-level-security): ingest's reads run scoped to the
-- caller's tenant and see only its rows, even behind a query that forgot
-- the tenant; the projector, which writes every tenant's, is unscoped.

-- +goose Up
SELECT onceflow_tenant_rls('inventory_items');
SELECT onceflow_tenant_rls('inventory_reservations');
SELECT onceflow_tenant_rls('inventory_orders');

-- +goose Down
DROP POLICY onceflow_tenant ON inventory_orders;
ALTER TABLE inventory_orders NO FORCE ROW LEVEL SECURITY, DISABLE ROW LEVEL SECURITY;
DROP POLICY onceflow_tenant ON inventory_reservations;
ALTER TABLE inventory_reservations NO FORCE ROW LEVEL SECURITY, DISABLE ROW LEVEL SECURITY;
DROP POLICY onceflow_tenant ON inventory_items;
ALTER TABLE inventory_items NO FORCE ROW LEVEL SECURITY, DISABLE ROW LEVEL SECURITY;
